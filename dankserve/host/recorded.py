"""Recorded hosts: the JSON that `dankserve probe --json` prints, `--save` writes and `--hardware` reads.

The schema is `dankserve.host.model.Host` (version 1). Reading is lenient where the schema
allows (unknown fields ignored, missing optional ones null) and strict elsewhere: every
problem becomes a HardwareFileError (exit 2) naming the file, the field and what is wrong.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dankserve.errors import HardwareFileError
from dankserve.host.model import SCHEMA_VERSION, Host

_FIX = "correct the file, or record it again with `dankserve probe --save FILE` on the GPU host"


def host_to_json(host: Host) -> dict[str, Any]:
    """The host as recorded-host JSON data."""
    return host.model_dump(mode="json")


def host_from_json(data: object, source: str) -> Host:
    """A Host from parsed JSON; `source` (the file name) appears in every error."""
    if not isinstance(data, Mapping):
        raise HardwareFileError(
            f"hardware file {source}: expected a JSON object at the top level, found {type(data).__name__}",
            fix=_FIX,
        )
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise HardwareFileError(
            f"hardware file {source}: schema_version = {version!r}: this dankserve reads version {SCHEMA_VERSION}",
            fix="record the host again with this dankserve's `dankserve probe --save FILE`",
        )
    try:
        return Host.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(error) for error in exc.errors()]
        raise HardwareFileError(f"hardware file {source}: " + "; ".join(problems), fix=_FIX) from None


def read_host(path: Path) -> Host:
    """Read a recorded host; HardwareFileError (exit 2) when absent, unreadable, not JSON or off-schema."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HardwareFileError(
            f"hardware file {path} does not exist",
            fix="give the path of a file written by `dankserve probe --save FILE`",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise HardwareFileError(f"hardware file {path} cannot be read: {reason}", fix=_FIX) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareFileError(
            f"hardware file {path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            fix=_FIX,
        ) from None
    return host_from_json(data, str(path))


def write_host(host: Host, path: Path) -> None:
    """Write the host atomically (a temporary file beside it, fsynced, then renamed); exit 2 if impossible."""
    text = json.dumps(host_to_json(host), indent=2) + "\n"
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise HardwareFileError(
            f"cannot write hardware file {path}: {exc.strerror or exc}",
            fix="choose a path in an existing directory you may write to",
        ) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise HardwareFileError(
            f"cannot write hardware file {path}: {exc.strerror or exc}",
            fix="choose a path you may write to (not a directory)",
        ) from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _describe(error: Mapping[str, Any]) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    if error.get("type") == "missing":
        return f"{field}: missing (required)"
    value = error.get("input")
    shown = "" if isinstance(value, dict | list) else f" = {value!r}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{field}{shown}: {message}"
