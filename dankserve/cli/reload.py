"""`dankserve reload [--json]`: the running daemon reads its config file again; the answer says what changed.

Accepted: one line per deployment (restarts, starts, stops or keeps running), one per kept deployment whose
LoRA adapters were loaded, unloaded or replaced (a new source) in the running server, then the changed global keys
applied, and those that keep their running values until the daemon restarts ("restart the daemon to apply:
..."). Refused (the file does not validate, or the deployments would not fit together): the reason, exit 2;
the daemon keeps running the config it loaded before. `systemctl reload dankserve` (SIGHUP) does the same
without waiting for the answer.
"""

from __future__ import annotations

import time
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.render import print_json
from dankserve.errors import ConfigError, EnvironmentUnusable
from dankserve.exitcodes import ExitCode

# what each list of the daemon's answer means for its deployments, in the order they are printed
VERBS = (
    ("restart", "restarts with the new settings"),
    ("start", "starts"),
    ("stop", "stops"),
    ("keep", "keeps running"),
)


def outcome_lines(outcome: dict[str, Any]) -> list[str]:
    """An accepted reload's lines: one per deployment, saying what it does now."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(outcome["at"])))
    lines = [f"reload accepted at {at}"]
    for key, verb in VERBS:
        lines += [f"{name}: {verb}" for name in outcome.get(key) or []]
    lines += [adapters_line(name, change) for name, change in (outcome.get("adapters") or {}).items()]
    if outcome.get("applied"):
        lines.append("applied: " + ", ".join(outcome["applied"]))
    if outcome.get("needs_restart"):
        lines.append(restart_line(outcome["needs_restart"]) + " (the daemon keeps running their old values)")
    return lines


def adapters_line(name: str, change: dict[str, list[str]]) -> str:
    """A kept deployment's adapters changed in place: "chat: adapters loaded in place: a2; unloaded: a1"."""
    done = [(key, change[key]) for key in ("loaded", "unloaded", "replaced") if change.get(key)]
    said = "; ".join(f"{key}{' in place' * (i == 0)}: {', '.join(names)}" for i, (key, names) in enumerate(done))
    return f"{name}: adapters {said}"


def restart_line(keys: list[str]) -> str:
    """The global keys a reload could not apply (`dankserve.settings.reloading`), as reload and status say it."""
    return "restart the daemon to apply: " + ", ".join(keys)


@click.command("reload")
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's answer as JSON.")
def command(as_json: bool) -> ExitCode:
    """Make the running daemon read its config file again, and say which deployments restart and which keep running."""
    from dankserve import servicectl
    from dankserve.supervisor.reloading import RELOAD_WAIT_SECONDS

    settings = cli_context().daemon_settings().settings
    reply = servicectl.daemon_request(settings.state_dir, {"command": "reload"}, RELOAD_WAIT_SECONDS + 10)
    if reply is None:
        raise EnvironmentUnusable(
            f"the dankserve daemon is not running (no answer in {settings.state_dir}): there is nothing to reload",
            fix="start it with `dankserve up` (it reads the config file as it starts)",
        )
    if not reply.get("ok"):
        raise EnvironmentUnusable(str(reply.get("error")), fix="see `dankserve logs`")
    outcome: dict[str, Any] = reply["reload"]
    if as_json:
        print_json(outcome)
    refused = outcome.get("refused")
    if refused is not None:
        fix = refused.get("fix")
        raise ConfigError(
            f"the daemon refused the config, and keeps running the one it loaded before: {refused['error']}",
            fix=f"{fix}, then `dankserve reload` again" if fix else "correct the file, then `dankserve reload` again",
        )
    if not as_json:
        for line in outcome_lines(outcome):
            click.echo(line)
    return ExitCode.OK
