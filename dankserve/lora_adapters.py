"""LoRA adapters as the config names them: `[deployments.NAME.adapters]`, adapter name -> source. Pure.

An adapter's name becomes a served model name (vLLM lists it in /v1/models, clients send it as
`model`), so it follows the rules of one; its source is an absolute local directory or a Hub
repo (ORG/NAME). Both travel in vLLM's `--lora-modules name=path` form, which vLLM splits on
`=` and reads as JSON when a `,` appears (vllm/entrypoints/openai/cli_args.py LoRAParserAction):
neither may hold those characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

MAX_ADAPTERS = 64
"""Adapters one deployment may name: each is a served name and a load at boot."""

ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
HUB_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
MAX_PATH_LENGTH = 1024


@dataclass(frozen=True)
class AdapterSource:
    """Where an adapter's files come from: a directory on this host, or a Hub repo."""

    kind: Literal["path", "hub"]
    location: str
    """The absolute directory, or ORG/NAME."""


def name_problem(name: str) -> str | None:
    """Why `name` cannot be an adapter's served name, or None."""
    if not ADAPTER_NAME.fullmatch(name):
        return (
            f"adapter name {name[:80]!r} is not a plain model name: use 1-128 letters, digits and . _ : / -, "
            "starting with a letter or digit"
        )
    return None


def parse_source(name: str, value: str) -> AdapterSource:
    """An adapter's source from its config value; ValueError naming the problem and the fix."""
    if not value or len(value) > MAX_PATH_LENGTH:
        raise ValueError(f"adapters.{name}: give an absolute directory or a Hub repo ORG/NAME (1-1024 characters)")
    if "=" in value or "," in value or any(c in value for c in "\n\r\t\0"):
        raise ValueError(
            f"adapters.{name} = {value[:80]!r} holds '=', ',' or a control character: vLLM's --lora-modules "
            "name=path would split or misread it; move or rename the directory"
        )
    if value.startswith("/"):
        if any(part == ".." for part in value.split("/")):
            raise ValueError(f"adapters.{name} = {value[:80]!r} climbs with '..': write the directory's real path")
        return AdapterSource("path", value.rstrip("/") or "/")
    if HUB_REPO.fullmatch(value) and ".." not in value:
        return AdapterSource("hub", value)
    raise ValueError(
        f"adapters.{name} = {value[:80]!r} is neither an absolute directory nor a Hub repo: write /path/to/adapter "
        "(holding adapter_config.json) or ORG/NAME"
    )


def adapters_problem(adapters: dict[str, str], own_names: list[str], *, multi_host: bool = False) -> str | None:
    """Why a deployment's adapters cannot be served beside its own names (served name, aliases), or None."""
    if adapters and multi_host:
        return "adapters on a multi-host deployment (hosts): not supported yet; remove adapters or hosts"
    if len(adapters) > MAX_ADAPTERS:
        return f"{len(adapters)} adapters: at most {MAX_ADAPTERS} per deployment"
    for name, value in adapters.items():
        problem = name_problem(name)
        if problem is not None:
            return problem
        if name in own_names:
            return (
                f"adapter {name!r} has the name the deployment itself answers to (served name or alias): "
                "give the adapter another name"
            )
        parse_source(name, value)
    return None


class LoraAdaptersTable(BaseModel):
    """The `[deployments.NAME.adapters]` key, a base of DeploymentSettings (its section's rules come from there)."""

    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters served by name on this model: name = an absolute directory or a Hub repo "
        "ORG/NAME (fetched by `dankserve pull`). Each name is a model name of its own (docs/planner.md, LoRA).",
    )

    @model_validator(mode="after")
    def _adapters_are_servable(self) -> Any:
        # The deployment's own names, read from the settings class this is a base of.
        own = [getattr(self, "served_model_name", None) or getattr(self, "model", ""), *getattr(self, "aliases", [])]
        problem = adapters_problem(self.adapters, own, multi_host=bool(getattr(self, "hosts", [])))
        if problem is not None:
            raise ValueError(problem)
        return self


class LoraModelSizes(BaseModel):
    """The model sizes only the LoRA slot estimate reads, a base of the declared `model_facts`."""

    hidden_size: int | None = Field(default=None, gt=0, description="With intermediate_size: sizes LoRA slots.")
    intermediate_size: int | None = Field(default=None, gt=0)
