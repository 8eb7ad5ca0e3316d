"""`dankserve usage [--since TIME] [--json]`: requests and tokens per key and model, from the gateway's own
counters (`gateway-usage.json` in the state dir, kept across daemon restarts; the daemon writes it every
10 s and when it stops, so the last seconds may not show yet).

Needs no running daemon. `--since` goes by the hour: counts from the start of the hour holding it.
Tokens of streams without usage are counted from their events (docs/GATEWAY.md, "Usage").
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.errors import EnvironmentUnusable
from dankserve.exitcodes import ExitCode
from dankserve.gateway.usage import usage_rows
from dankserve.gateway.usage_store import read_usage, usage_path
from dankserve.logview import parse_since
from dankserve.settings import state_dir_despite_errors

COLUMNS = ("key", "model", "requests", "2xx", "4xx", "5xx", "prompt_tokens", "completion_tokens")
HEADINGS = ("KEY", "MODEL", "REQUESTS", "2XX", "4XX", "5XX", "PROMPT TOKENS", "COMPLETION TOKENS")


def render_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned columns, a total line under several."""
    if not rows:
        return "no requests counted (yet): the gateway counts each request it answers"
    body = [[str(row[c]) for c in COLUMNS] for row in rows]
    if len(rows) > 1:
        body.append(["total", "", *(str(sum(row[c] for row in rows)) for c in COLUMNS[2:])])
    widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(HEADINGS)]
    lines = [HEADINGS, *body]
    out = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    estimated = sum(row["estimated_tokens"] for row in rows)
    if estimated:
        out.append(f"{estimated} completion tokens counted from stream events (streams without usage)")
    return "\n".join(line.rstrip() for line in out)


@click.command("usage")
@click.option("--since", help='Only from this time on (by the hour): "2026-12-01 13:00", today, "24h", "7d".')
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def command(since: str | None, as_json: bool) -> ExitCode:
    """Show requests and tokens per gateway key (by name) and model, from the gateway's counters."""
    state_dir = state_dir_despite_errors(cli_context().config)
    path = usage_path(state_dir)
    start = parse_since(since, datetime.now().astimezone()) if since is not None else None
    try:
        usage = read_usage(path)
    except ValueError as exc:
        raise EnvironmentUnusable(
            f"the gateway's usage file {path} cannot be read: {exc}",
            fix="the daemon moves a corrupt file aside when it starts (counting again from 0); or remove it yourself",
        ) from None
    rows = usage_rows(usage.since(None if start is None else start.timestamp()))
    if as_json:
        click.echo(json.dumps({"since": None if start is None else start.isoformat(), "rows": rows}, indent=2))
    else:
        click.echo(render_table(rows))
    return ExitCode.OK
