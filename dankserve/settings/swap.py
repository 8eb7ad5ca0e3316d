"""The swap checks' and `auto` groups' keys of a deployment (issue 29), a base of DeploymentSettings."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, model_validator

from dankserve.settings.values import MAX_SECONDS


class SwapFitSettings(BaseModel):
    """`min_awake_seconds` and `sleep_check_margin_bytes`; `swap_group = "auto"` refuses a hand-set share."""

    min_awake_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="swap groups: once awake, not put to sleep to make room for another for this long (stops "
        "thrash); idle sleep and `dankserve sleep` still may.",
    )
    sleep_check_margin_bytes: int = Field(
        default=512 << 20,
        ge=0,
        le=1 << 40,
        description="swap groups: after a sleep, NVML must show the server's processes holding at most the CUDA "
        "context (1 GiB) plus this on each GPU; more marks the level unsafe and the server is stopped instead.",
    )

    @model_validator(mode="after")
    def _auto_group_is_planned_by_fit(self) -> Any:
        # Read from the settings class this is a base of.
        share = getattr(self, "gpu_memory_utilization", None)
        if getattr(self, "swap_group", None) == "auto" and share is not None:
            raise ValueError(
                f'swap_group = "auto" with gpu_memory_utilization = {share}: an auto group is planned from each '
                'member\'s bytes; remove gpu_memory_utilization, or name the group (swap_group = "NAME") to keep '
                "the hand-set share"
            )
        return self
