"""The configuration reference, rendered from the settings model (docs/CONFIGURATION.md).

`make docs` writes it; a test fails when the committed file differs from what this renders.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dankserve.settings import ON_RELOAD, DeploymentSettings, Settings

HEADER = """# Configuration reference

Generated from the settings model (`dankserve/settings/`) by `make docs`; do not edit by hand.

The file is TOML: `--config FILE`, else `$DANKSERVE_CONFIG`, else `/etc/dankserve/dankserve.toml`.
Every key can also be set through the environment as `DANKSERVE_<KEY>`, nested keys joined
with `__` (`DANKSERVE_DEPLOYMENTS__CHAT__PORT=8001`). Unknown keys are errors (exit 2).
`config/dankserve.toml` is a commented example of every key.
"""


RELOAD_NOTE = """A reload (`dankserve reload`, `systemctl reload dankserve`, SIGHUP) applies a global key as
"on reload" says, or keeps running its old value everywhere until the daemon restarts: then the
reload's answer, its log (`reload_needs_restart`) and `dankserve status` say "restart the daemon to
apply: KEY, ..." (a restart adopts the running servers). The `[gateway]` and `[cluster]` tables are
one key each here."""

DEPLOYMENTS_NOTE = """
A reload takes the deployments whole: a deployment whose server would plan differently restarts,
a new or re-enabled one starts, a removed or disabled one stops, the rest keep running
(docs/OPERATIONS.md)."""


def _type_name(info: FieldInfo) -> str:
    text = str(info.annotation).replace("typing.", "").replace("pathlib.", "")
    for noise in ("<class '", "'>"):
        text = text.replace(noise, "")
    return re.sub(r"dankserve\.settings\.(?:\w+\.)?", "", text)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is None:
        return "unset"
    if hasattr(value, "as_posix"):
        return f"`{value.as_posix()}`"
    if str(value) == "PydanticUndefined":
        return "required"
    return f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def _on_reload(name: str) -> str:
    rule = ON_RELOAD[name]
    return f"applied: {rule.how}" if rule.applied else f"restart the daemon: {rule.how}"


def _table(model: type[BaseModel], prefix: str, *, reload_column: bool = False) -> list[str]:
    if reload_column:
        rows = ["| key | type | default | meaning | on reload |", "|---|---|---|---|---|"]
    else:
        rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name == "deployments":
            continue
        desc = (info.description or "").replace("|", "\\|")
        kind = _type_name(info).replace("|", "\\|")
        row = f"| `{prefix}{name}` | {kind} | {_default(info)} | {desc} |"
        rows.append(row + (f" {_on_reload(name)} |" if reload_column else ""))
    return rows


def render_reference() -> str:
    """The whole Markdown document."""
    lines = [HEADER, "## Global keys", "", RELOAD_NOTE, ""]
    lines += _table(Settings, "", reload_column=True)
    lines += ["", "## `[deployments.NAME]`", "", "NAME: letters, digits, `-` and `_`.", DEPLOYMENTS_NOTE, ""]
    lines += _table(DeploymentSettings, "")
    for field_name in ("speculative", "cpu_offload", "model_facts"):
        info = DeploymentSettings.model_fields[field_name]
        model = next(
            a for a in getattr(info.annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)
        )
        lines += ["", f"### `[deployments.NAME.{field_name}]`", "", (model.__doc__ or "").strip(), ""]
        lines += _table(model, "")
    return "\n".join(lines) + "\n"
