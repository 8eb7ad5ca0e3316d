"""Output helpers shared by the commands: JSON on stdout, rich tables on a terminal."""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(data: Any) -> None:
    """Print data as indented JSON with a trailing newline."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def format_bytes(value: int | None) -> str:
    """Bytes as GiB with two decimals, or '-' when unknown."""
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB"
