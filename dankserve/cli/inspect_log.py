"""`dankserve inspect-log FILE [--json]`: the boot facts a vLLM log tells (the last boot's).

Exit 0 whatever the boot did (a failed boot is a fact, not an error); exit 2 when the file
cannot be read or holds no line of a vLLM boot. `-` reads standard input.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, Any

import click

from dankserve.errors import InvalidInput
from dankserve.exitcodes import ExitCode


def _lines(stream: IO[bytes]) -> Iterator[str]:
    # Binary lines split on \n only: a \r inside a line (progress bars) must reach the reader.
    for raw in stream:
        yield raw.decode("utf-8", errors="replace")


def _text_value(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "kv_cache_usage_perc":
        return f"{value * 100:.1f} %"
    return str(value)


def kv_rows(facts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The facts as text rows, the two KV sizes as one `kv_cache` row: the bytes to pin (vLLM's suggestion, or
    what the boot was given) and, apart, what profiling found available (it counts CUDA graphs and a buffer
    vLLM's suggestion holds back, so the two differ; `--json` keeps both keys)."""
    pinned, profiled = facts.get("kv_cache_memory_bytes"), facts.get("kv_cache_gib")
    parts = []
    if pinned is not None:
        parts.append(f"{pinned / 2**30:.2f} GiB per GPU ({pinned} bytes, as --kv-cache-memory-bytes pins it)")
    if profiled is not None:
        parts.append(f"profiling found {profiled:.2f} GiB available")
    rows: list[tuple[str, Any]] = []
    for key, value in facts.items():
        if key == "kv_cache_memory_bytes":
            rows.append(("kv_cache", "; ".join(parts) or None))
        elif key != "kv_cache_gib":
            rows.append((key, value))
    return rows


@click.command("inspect-log")
@click.argument("file", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
def command(file: str, as_json: bool) -> ExitCode:
    """Read a vLLM log (FILE, or - for stdin) and print the facts of its last boot."""
    from dankserve.bootlog import BootLogReader
    from dankserve.cli.render import print_json

    reader = BootLogReader()
    lines = recognised = 0
    try:
        with contextlib.nullcontext(sys.stdin.buffer) if file == "-" else open(file, "rb") as stream:
            for line in _lines(stream):
                lines += 1
                recognised += bool(reader.feed(line))
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the log file {file}: {exc.strerror or exc}",
            fix="name a readable file (a saved container log, `podman logs NAME > FILE`), or - for stdin",
        ) from None
    if not recognised:
        name = "standard input" if file == "-" else file
        raise InvalidInput(
            f"{name} holds no vLLM boot ({lines} line{'' if lines == 1 else 's'} read, none of them one vLLM "
            "prints while it boots)",
            fix="name a vLLM server's log (`podman logs NAME > FILE`, or `dankserve logs NAME > FILE`)",
        )
    facts = reader.facts.to_json()
    if as_json:
        print_json(facts)
        return ExitCode.OK
    rows = [*kv_rows(facts), ("boots_in_log", reader.boots)]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        click.echo(f"{key.ljust(width)}  {_text_value(key, value)}")
    return ExitCode.OK
