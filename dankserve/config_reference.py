"""The configuration reference, rendered from the settings model (docs/CONFIGURATION.md).

`make docs` writes it; a test fails when the committed file differs from what this renders.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from dankserve.settings import DeploymentSettings, Settings
from dankserve.settings_upgrade import UpgradeSettings

HEADER = """# Configuration reference

Generated from `dankserve/settings.py` by `make docs`; do not edit by hand.

The file is TOML: `--config FILE`, else `$DANKSERVE_CONFIG`, else `/etc/dankserve/dankserve.toml`.
Every key can also be set through the environment as `DANKSERVE_<KEY>`, nested keys joined
with `__` (`DANKSERVE_DEPLOYMENTS__CHAT__PORT=8001`). Unknown keys are errors (exit 2).
`config/dankserve.toml` is a commented example of every key.
"""


def _type_name(info: FieldInfo) -> str:
    text = str(info.annotation).replace("typing.", "").replace("pathlib.", "")
    for noise in ("<class '", "'>", "dankserve.settings_upgrade.", "dankserve.settings."):
        text = text.replace(noise, "")
    return text


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "its table's defaults"
    if hasattr(value, "as_posix"):
        return f"`{value.as_posix()}`"
    if str(value) == "PydanticUndefined":
        return "required"
    return f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def _table(model: type[BaseModel], prefix: str) -> list[str]:
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, info in model.model_fields.items():
        if name == "deployments":
            continue
        desc = (info.description or "").replace("|", "\\|")
        kind = _type_name(info).replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {kind} | {_default(info)} | {desc} |")
    return rows


def render_reference() -> str:
    """The whole Markdown document."""
    lines = [HEADER, "## Global keys", ""]
    lines += _table(Settings, "")
    lines += ["", "## `[upgrade]`", "", (UpgradeSettings.__doc__ or "").strip(), ""]
    lines += _table(UpgradeSettings, "")
    lines += ["", "## `[deployments.NAME]`", "", "NAME: letters, digits, `-` and `_`.", ""]
    lines += _table(DeploymentSettings, "")
    for field_name in ("speculative", "cpu_offload", "model_facts"):
        info = DeploymentSettings.model_fields[field_name]
        model = next(
            a for a in getattr(info.annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)
        )
        lines += ["", f"### `[deployments.NAME.{field_name}]`", "", (model.__doc__ or "").strip(), ""]
        lines += _table(model, "")
    return "\n".join(lines) + "\n"
