"""Output helpers shared by the commands: JSON on stdout, aligned tables, colour on a terminal."""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
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
    "snapshotting": "cyan",
    "down": "bright_black",
    "disabled": "bright_black",
    "stopped": "bright_black",
}
"""The colour of each deployment state (`supervisor.observe.status`) on a terminal."""


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
    drop_order: Sequence[str] = (),
    last_label: str = "",
    shrink: str | None = None,
) -> list[str]:
    """Aligned lines of `rows` (cells, state) under `header`; the state colours the second cell (STATE).

    With `width` (a terminal's) nothing is cut that fits another way: when the last column (a sentence)
    does not fit beside its row, it goes under each row instead, `last_label` first, wrapped to the width;
    then the columns named in `drop_order` are left out, in that order, until the rest fits; then the cells
    of the column `shrink` are cut (ending in "…", never below SHRINK_MIN); a line still too wide is cut
    last."""
    columns = list(range(len(header)))
    last = len(header) - 1

    def widths_of(kept: Sequence[int]) -> dict[int, int]:
        return {i: max(len(header[i]), *(len(cells[i]) for cells, _ in rows)) for i in kept}

    def line_width(kept: Sequence[int]) -> int:
        widths = widths_of(kept)
        return sum(widths[i] for i in kept) + 2 * (len(kept) - 1)

    below = False
    if width is not None and rows and line_width(columns) > width:
        room = width - line_width(columns[:-1]) - 2
        below = room < max(len(cells[last]) for cells, _ in rows)
    kept = columns[:-1] if below else columns
    droppable = [header.index(name) for name in drop_order if name in header]
    while width is not None and below and droppable and line_width(kept) > width:
        kept.remove(droppable.pop(0))
    widths = widths_of(kept)
    column = header.index(shrink) if shrink in header else None
    excess = sum(widths[i] for i in kept) + 2 * (len(kept) - 1) - width if width is not None and below else 0
    if column is not None and column in widths and excess > 0:
        widths[column] = max(SHRINK_MIN, len(header[column]), widths[column] - excess)
        rows = [
            ([_cut(c, widths[column]) if i == column else c for i, c in enumerate(cells)], st) for cells, st in rows
        ]
    out = []
    indent = widths[0] + 2
    for cells, state in [(header, ""), *rows]:
        parts = [cells[i].ljust(widths[i]) for i in kept[:-1]]
        line = "  ".join([*parts, cells[kept[-1]]]).rstrip()
        if width is not None and len(line) > width:
            line = line[: max(width - 1, 0)] + "…"
        if state and colour and len(parts) > 1:
            start = len(parts[0]) + 2
            line = line[:start] + paint(line[start : start + widths[1]], state, True) + line[start + widths[1] :]
        out.append(line)
        if below and state and cells[last]:
            room = max(width - indent, 20) if width is not None else 80
            text = f"{last_label}{cells[last]}"
            out += [" " * indent + piece for piece in textwrap.wrap(text, room, break_on_hyphens=False)]
    return out


SHRINK_MIN = 12
"""The narrowest a shrunk table column gets (`table`'s `shrink`)."""


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 1] + "…"


def terminal_width() -> int | None:
    """The width to fit tables to: COLUMNS when set (as `ls` reads it, piped or not), else the terminal's when
    stdout is one, else None (piped output is never fitted)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return shutil.get_terminal_size().columns if is_terminal() else None
