"""Output helpers shared by the commands: JSON on stdout, aligned tables, colour on a terminal."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from typing import IO, Any

import click


def print_json(data: Any) -> None:
    """Print data as indented JSON with a trailing newline."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def format_bytes(value: int | None) -> str:
    """Bytes as GiB with two decimals, or '-' when unknown."""
    if value is None:
        return "-"
    return f"{value / 2**30:.2f} GiB"


def format_duration(seconds: float | None) -> str:
    """A duration as a person reads it: 42s, 7m05s, 3h02m, 2d04h; '-' when unknown."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def is_terminal(stream: IO[str] | None = None) -> bool:
    """The stream (stdout by default) is a terminal."""
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


def colour_enabled(stream: IO[str] | None = None) -> bool:
    """Colour only on a terminal, and never with NO_COLOR set (https://no-color.org)."""
    return is_terminal(stream) and not os.environ.get("NO_COLOR")


STATE_COLOURS: dict[str, str] = {
    "ready": "green",
    "serving": "green",
    "asleep": "blue",
    "failed": "red",
    "restarting": "yellow",
    "running": "yellow",
    "starting": "cyan",
    "waking": "cyan",
    "falling_asleep": "cyan",
    "down": "bright_black",
    "disabled": "bright_black",
    "stopped": "bright_black",
}
"""The colour of each deployment state (`supervisor.status`) on a terminal."""


def paint(text: str, state: str, enabled: bool) -> str:
    """`text` in the colour of `state` when colour is enabled."""
    colour = STATE_COLOURS.get(state)
    return click.style(text, fg=colour, bold=True if state == "failed" else None) if enabled and colour else text


def table(
    header: Sequence[str],
    rows: Sequence[tuple[Sequence[str], str]],
    *,
    colour: bool,
    width: int | None = None,
) -> list[str]:
    """Aligned lines of `rows` (cells, state) under `header`; the state colours the second cell (STATE).
    With `width` (a terminal's), the last column is cut to fit."""
    widths = [max(len(h), *(len(cells[i]) for cells, _ in rows)) for i, h in enumerate(header)]
    out = []
    for cells, state in [(header, ""), *rows]:
        parts = [cell.ljust(widths[i]) for i, cell in enumerate(cells[:-1])]
        line = "  ".join([*parts, cells[-1]]).rstrip()
        if width is not None and len(line) > width:
            line = line[: max(width - 1, 0)] + "…"
        if state and colour and len(parts) > 1:
            start = len(parts[0]) + 2
            line = line[:start] + paint(line[start : start + widths[1]], state, True) + line[start + widths[1] :]
        out.append(line)
    return out


def terminal_width() -> int | None:
    """The terminal's width when stdout is one, else None (piped output is never cut)."""
    return shutil.get_terminal_size().columns if is_terminal() else None
