"""`dankserve upgrade NAME [--image REF]`: try a new vLLM image beside the old server, then switch to
it or roll back (docs/OPERATIONS.md, Upgrades); prints each step as the daemon takes it."""

from __future__ import annotations

import time
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import DeploymentFailed, EnvironmentUnusable, InvalidInput, TimedOut
from dankserve.exitcodes import ExitCode

POLL_SECONDS = 0.5


def daemon_request(request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Send `request` to the running daemon; its answer and the settings it runs with."""
    from dankserve import servicectl

    settings = cli_context().daemon_settings().settings
    name = request["deployment"]
    if name not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {name!r}", fix=f"configured deployments: {known}")
    reply = servicectl.daemon_request(settings.state_dir, request)
    if reply is None:
        raise EnvironmentUnusable(
            f"the dankserve daemon is not running: `{request['command']}` goes through it",
            fix=f"start it with `dankserve up {name}`",
        )
    if not reply.get("ok"):
        raise InvalidInput(str(reply.get("error")), fix=f"see `dankserve status {name}`")
    return reply, settings


def upgrade_record(state_dir: Any, name: str) -> dict[str, Any] | None:
    """The deployment's upgrade record as the daemon's status shows it (None: none, or no answer)."""
    from dankserve import servicectl

    reply = servicectl.daemon_request(state_dir, {"command": "status"})
    if reply is None or not reply.get("ok"):
        return None
    for dep in reply.get("status", {}).get("deployments", []):
        if isinstance(dep, dict) and dep.get("name") == name:
            record = dep.get("upgrade")
            return record if isinstance(record, dict) else None
    return None


def step_line(record: dict[str, Any]) -> str:
    words = str(record.get("step", "?")).replace("_", " ")
    if record.get("step") == "booting" and record.get("room"):
        room = "asleep at level 1" if record["room"] == "1" else "stopped"
        return f"{words} {record.get('new_image')} (the old server is {room})"
    if record.get("step") == "replanning" and record.get("new_version"):
        return f"{words} for vLLM {record['new_version']}"
    return words


@click.command("upgrade")
@click.argument("deployment", shell_complete=complete_deployment)
@click.option("--image", "image", default=None, help="The new image (default: the configured one, pulled again).")
@click.option("--timeout", type=float, default=None, help="Give up following after this many seconds.")
def command(deployment: str, image: str | None, timeout: float | None) -> ExitCode:
    """Try a new vLLM image for DEPLOYMENT beside the old server; switch when it is no worse, else roll back."""
    sent = time.time()
    _, settings = daemon_request({"command": "upgrade", "deployment": deployment, "image": image})
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = None
    while deadline is None or time.monotonic() < deadline:
        record = upgrade_record(settings.state_dir, deployment)
        if record is not None and float(record.get("started_at") or 0) >= sent - 5:
            line = step_line(record)
            if line != shown:
                click.echo(f"{deployment}: {line}")
                shown = line
            step = record.get("step")
            if step == "switched":
                report = record.get("report") or {}
                click.echo(f"{deployment}: now runs {record.get('new_image')}; checks: {_figures(report)}")
                click.echo(f"  `dankserve rollback {deployment}` goes back to {record.get('old_image')}")
                return ExitCode.OK
            if step == "rolled_back":
                raise DeploymentFailed(
                    f"upgrade of {deployment!r} rolled back: {record.get('reason')}",
                    fix=f"the old image {record.get('old_image')} serves again; `dankserve status {deployment}`",
                )
            if step == "refused":
                raise InvalidInput(
                    f"upgrade of {deployment!r} refused: {record.get('reason')}",
                    fix="the old server kept serving; pin another image with --image",
                )
        time.sleep(POLL_SECONDS)
    raise TimedOut(
        f"the upgrade of {deployment!r} was not over within {timeout:g} s",
        fix=f"the daemon carries on: follow it with `dankserve status {deployment}`",
    )


def _figures(report: dict[str, Any]) -> str:
    parts = []
    if "kv_change_percent" in report:
        parts.append(f"KV cache {report['kv_change_percent']:+.1f} %")
    if "decode_change_percent" in report:
        parts.append(f"decode {report['decode_change_percent']:+.1f} %")
    if "greedy_ids_equal" in report:
        parts.append("greedy ids equal" if report["greedy_ids_equal"] else "greedy ids differ")
    return ", ".join(parts) or "it answers (no figures of the old server to compare)"
