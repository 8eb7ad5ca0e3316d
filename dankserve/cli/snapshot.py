"""`dankserve snapshot list [--json]` and `dankserve snapshot rm NAME`: the snapshot store under the
state dir, read and changed directly (no daemon needed; docs/snapshots.md).

Exit codes: 0 done; 2 `rm` of a name with no snapshot (or not a name); 3 the store is unsafe (a
symlink, another owner, open to others: it holds the servers' secrets), or another user's (the daemon's:
run the command as that user).
"""

from __future__ import annotations

from datetime import UTC, datetime

import click

from dankserve.cli.context import cli_context
from dankserve.cli.render import colour_enabled, format_bytes, print_json, table, terminal_width
from dankserve.errors import InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.settings import state_dir_despite_errors
from dankserve.snapshot.store import PREVIOUS, Entry, list_entries, previous, remove, store_root


def _stamp(value: float | None) -> str | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC).isoformat(timespec="seconds")


def _row(entry: Entry) -> dict[str, object]:
    return {
        "deployment": entry.deployment,
        "state": entry.state,
        "path": str(entry.path),
        "bytes": entry.bytes,
        "captured_at": _stamp(entry.captured_at),
        "last_restore_seconds": entry.last_restore_seconds,
        "reason": entry.reason,
    }


@click.group("snapshot")
def command() -> None:
    """List or remove the snapshots of warm servers (docs/snapshots.md)."""


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshots as JSON.")
def list_command(as_json: bool) -> ExitCode:
    """Show each deployment's snapshot: state, path, size, when captured, the last restore's seconds."""
    root = store_root(state_dir_despite_errors(cli_context().config))
    rows = [_row(e) for e in list_entries(root)]
    if as_json:
        print_json({"store": str(root), "snapshots": rows})
        return ExitCode.OK
    if not rows:
        click.echo(f"no snapshots in {root}")
    lines: list[tuple[list[str], str]] = []
    for r in rows:
        restore = r["last_restore_seconds"]
        size = r["bytes"]
        cells = [
            str(r["deployment"]),
            str(r["state"]),
            format_bytes(size if isinstance(size, int) else None),
            str(r["captured_at"] or "-"),
            f"{restore:.2f} s" if isinstance(restore, float) else "-",
            str(r["path"]) + (f"  ({r['reason']})" if r["reason"] else ""),
        ]
        lines.append((cells, str(r["state"])))
    if lines:
        header = ["DEPLOYMENT", "STATE", "SIZE", "CAPTURED", "LAST RESTORE", "PATH"]
        for line in table(header, lines, colour=colour_enabled(), width=terminal_width()):
            click.echo(line)
    return ExitCode.OK


@command.command("rm")
@click.argument("name")
def rm_command(name: str) -> ExitCode:
    """Delete a deployment's snapshot (it holds the server's memory, secrets included), and the one kept for an
    upgrade's rollback (NAME@previous; `rm NAME@previous` deletes that one only)."""
    root = store_root(state_dir_despite_errors(cli_context().config))
    names = [name] if name.endswith(PREVIOUS) else [name, previous(name)]
    removed = [n for n in names if remove(root, n)]
    if not removed:
        raise InvalidInput(f"no snapshot of {name!r} in {root}", fix="`dankserve snapshot list` shows which exist")
    click.echo(f"removed the snapshot{'s' if len(removed) > 1 else ''} of {', '.join(removed)}")
    return ExitCode.OK
