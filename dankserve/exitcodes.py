"""The process exit codes of every dankserve command: the one source of README's table.

`render_table()` writes that table (`make docs`; a test checks README holds it, and drives the
real CLI to each code). systemd relies on these: the unit lists `NO_RESTART` in
`RestartPreventExitStatus`, so a configuration or environment error never turns into a restart
loop. The daemon (`dankserve run`) ends only with 0, 1 or a code of `NO_RESTART`; 5 and 6 are
the waiting commands' (`up`, `wake`).
"""

from collections.abc import Mapping
from enum import IntEnum


class ExitCode(IntEnum):
    """What a dankserve process's exit status means (MEANING says it in words)."""

    OK = 0
    INTERNAL = 1
    INVALID_INPUT = 2
    ENVIRONMENT = 3
    INFEASIBLE = 4
    DEPLOYMENT_FAILED = 5
    TIMED_OUT = 6


MEANING: Mapping[ExitCode, str] = {
    ExitCode.OK: "success; also when the reader of stdout goes away early (`dankserve plan` piped into "
    "`head -1`): the command stops quietly; and `status` and `down` without a running daemon, as `systemctl "
    "stop` of a stopped unit (`status` then says `daemon not running` and what still serves; scripts read "
    "`status --json`'s `daemon.running`)",
    ExitCode.INTERNAL: "unexpected internal error: a bug (`--debug` prints the traceback)",
    ExitCode.INVALID_INPUT: "invalid input: arguments, config file, setting values, a malformed recorded-host file",
    ExitCode.ENVIRONMENT: "environment not usable: no NVIDIA driver or GPU, Podman unreachable, a system tool "
    "missing, an address the daemon must listen on already taken, the daemon's state dir another user's (run the "
    "command as the user the daemon runs as: `sudo`); `up` relays the daemon's own error and code when the "
    "daemon stops while starting",
    ExitCode.INFEASIBLE: "infeasible plan: the deployment cannot run on this host as configured (`plan`, and the "
    "daemon's own check before it starts anything)",
    ExitCode.DEPLOYMENT_FAILED: "a deployment `up` or `wake` waited for failed: the daemon gave up on it "
    "(`dankserve status NAME` says why; fix it, then `dankserve up NAME`)",
    ExitCode.TIMED_OUT: "`up --timeout` ran out before every deployment rested (or `wake` before it was ready); "
    "the daemon keeps trying",
}
"""Each code's meaning, as README's table shows it."""

NO_RESTART: tuple[ExitCode, ...] = (ExitCode.INVALID_INPUT, ExitCode.ENVIRONMENT, ExitCode.INFEASIBLE)
"""The daemon's exits that restarting cannot mend: the unit's RestartPreventExitStatus."""

TABLE_BEGIN = "<!-- exit-codes:begin (generated from dankserve/exitcodes.py by `make docs`; do not edit) -->"
TABLE_END = "<!-- exit-codes:end -->"


def render_table() -> str:
    """README's exit-code table, between its markers."""
    rows = [f"| {code.value} | `{code.name}` | {MEANING[code]} |" for code in ExitCode]
    return "\n".join([TABLE_BEGIN, "| code | name | meaning |", "|---|---|---|", *rows, TABLE_END])


def summary() -> str:
    """The codes in one line (`dankserve --help`)."""
    return ", ".join(f"{code.value} {code.name.lower().replace('_', ' ')}" for code in ExitCode)


def with_table(document: str) -> str:
    """`document` (README.md) with its exit-code table rendered again between the markers."""
    start = document.index(TABLE_BEGIN)
    end = document.index(TABLE_END, start) + len(TABLE_END)
    return document[:start] + render_table() + document[end:]
