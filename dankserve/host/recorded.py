"""Read a recorded-host file (`dankserve probe --json` / `--save`) back into a Host.

A minimal reader for the planner until the probe's own loader lands; every failure is a
HardwareFileError (exit 2) naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from dankserve.errors import HardwareFileError
from dankserve.host.model import Host


def read_host(path: Path) -> Host:
    """The Host recorded in a JSON file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HardwareFileError(
            f"recorded-host file {path} does not exist", fix="record one with `dankserve probe --save FILE`"
        ) from None
    except OSError as exc:
        raise HardwareFileError(
            f"recorded-host file {path} cannot be read: {exc.strerror}", fix="check its permissions"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareFileError(
            f"recorded-host file {path} is not JSON: {exc.msg} at line {exc.lineno}",
            fix="record it again with `dankserve probe --save FILE`",
        ) from None
    try:
        return Host.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()[:5]
        )
        raise HardwareFileError(
            f"recorded-host file {path} does not match the schema (version 1): {problems}",
            fix="record it again with `dankserve probe --save FILE`",
        ) from None
