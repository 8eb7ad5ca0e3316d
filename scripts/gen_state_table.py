"""Renders docs/ARCHITECTURE.md's state table from the lifecycle's transition table (run by `make docs`).

`python scripts/gen_state_table.py` prints the table; `--write FILE` rewrites it in place in FILE.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dankserve.supervisor.machine import EVENT_TYPES, TRANSITIONS, MachineConfig, MachineState, Stage
from dankserve.supervisor.policy import RestartSettings

TABLE_BEGIN = "<!-- state-table:begin (generated from dankserve/supervisor/machine/; do not edit) -->"
TABLE_END = "<!-- state-table:end -->"


def render_state_table() -> str:
    """The state table of docs/ARCHITECTURE.md: every stage, what it shows, and the events it allows."""
    probe = MachineState(MachineConfig(RestartSettings(1, 1, 1, 0, 1, 1)))
    lines = [
        TABLE_BEGIN,
        "",
        "| state | `status` state / phase | allowed events → next state | ignored |",
        "|---|---|---|---|",
    ]
    for stage in Stage:
        shown = replace(probe, stage=stage)
        allowed = []
        ignored = []
        for kind in EVENT_TYPES:
            rule = TRANSITIONS[stage, kind]
            if rule.kind == "allowed":
                targets = ", ".join(f"`{s.value}`" for s in rule.to)
                extra = f" ({rule.note})" if rule.note else ""
                allowed.append(f"`{kind.__name__}` → {targets}{extra}")
            elif rule.kind == "ignored":
                ignored.append(f"`{kind.__name__}`")
        phase = "the log's (starting … capturing)" if stage in (Stage.BOOTING, Stage.ENDING) else shown.phase.value
        lines.append(
            f"| `{stage.value}` | {shown.status} / {phase} | {'; '.join(allowed) or '-'} | "
            f"{', '.join(ignored) or '-'} |"
        )
    lines += [
        "",
        "Any event not listed for a state is refused: the state stays and `event_refused` is logged.",
        "",
        TABLE_END,
    ]
    return "\n".join(lines)


def with_state_table(document: str) -> str:
    """`document` with the text between the table markers replaced by the current table."""
    start = document.index(TABLE_BEGIN)
    end = document.index(TABLE_END) + len(TABLE_END)
    return document[:start] + render_state_table() + document[end:]


def main(argv: Sequence[str]) -> int:
    """Print the state table, or rewrite it in place with `--write FILE`."""
    if len(argv) == 2 and argv[0] == "--write":
        target = Path(argv[1])
        target.write_text(with_state_table(target.read_text(encoding="utf-8")), encoding="utf-8")
        print(f"wrote the state table of {target}")
        return 0
    sys.stdout.write(render_state_table() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
