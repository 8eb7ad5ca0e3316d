"""The `[upgrade]` table (a base of `Settings`): how `dankserve upgrade` judges a new vLLM image; the
daily auto-update."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AutoUpdate = Literal["registry", "local", "off"]


class UpgradeSettings(BaseModel):
    """`dankserve upgrade` and the daily `dankserve-auto-update.timer` (docs/OPERATIONS.md, Upgrades)."""

    # strict: no boolean standing in for a number, no string for a percentage
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    auto_update: AutoUpdate = Field(
        default="off",
        description="The daily timer's check: \"registry\" pulls each deployment's image reference again and "
        'upgrades when its digest changed; "local" upgrades when the local image under that reference changed '
        '(built or pulled by someone else); "off": no automatic upgrades.',
    )
    kv_shrink_percent: float = Field(
        default=5.0,
        ge=0,
        le=100,
        description="An upgrade rolls back when the new server's KV cache holds more than this many percent "
        "fewer tokens than the old one's.",
    )
    decode_slowdown_percent: float = Field(
        default=10.0,
        ge=0,
        le=100,
        description="An upgrade rolls back when the new server decodes the fixed request more than this many "
        "percent slower than the old one.",
    )


class UpgradeTable(BaseModel):
    """The `[upgrade]` key of the global settings, a base of `Settings`."""

    upgrade: UpgradeSettings = Field(
        default_factory=UpgradeSettings, description="How `dankserve upgrade` judges a new image; auto-update."
    )
