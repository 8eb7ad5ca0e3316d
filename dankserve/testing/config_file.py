"""A dankserve.toml written from plain values, for tests and the demo (no TOML writer needed)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NESTED_TABLES = ("model_facts", "speculative", "cpu_offload", "adapters")


BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


class TomlRaw(str):
    """A TOML value written verbatim (e.g. a deliberately broken literal in a malformed config)."""


def toml_key(name: str) -> str:
    """A key: bare when TOML allows, else quoted."""
    return name if BARE_KEY.fullmatch(name) else json.dumps(name)


def toml_value(value: Any) -> str:
    """A TOML literal for a bool, number, string, list or inline table (TomlRaw as it is)."""
    if isinstance(value, TomlRaw):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def config_text(globals_: Mapping[str, Any], deployments: Mapping[str, Mapping[str, Any]]) -> str:
    """The TOML of global keys and `[deployments.NAME]` tables (sub-tables for model_facts ...)."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in globals_.items()]
    for name, dep in deployments.items():
        lines.append(f"[deployments.{toml_key(name)}]")
        tables = {k: v for k, v in dep.items() if k in NESTED_TABLES and isinstance(v, dict)}
        lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in dep.items() if k not in tables]
        for table, body in tables.items():
            lines.append(f"[deployments.{toml_key(name)}.{table}]")
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def write_config(path: Path, globals_: Mapping[str, Any], deployments: Mapping[str, Mapping[str, Any]]) -> Path:
    """Write the config file, readable and writable by its owner only (as dankserve wants it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(config_text(globals_, deployments))
    os.chmod(path, 0o600)
    return path
