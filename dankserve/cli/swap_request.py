"""What `dankserve sleep` and `dankserve wake` share: ask the daemon, print the outcome."""

from __future__ import annotations

from typing import Any, Literal

import click

from dankserve.cli.context import cli_context
from dankserve.cli.render import print_json
from dankserve.cli.status import status_document, swap_line
from dankserve.errors import DeploymentFailed, EnvironmentUnusable, InfeasiblePlan, InvalidInput, TimedOut
from dankserve.exitcodes import ExitCode


def swap_request(command: Literal["sleep", "wake"], deployment: str, as_json: bool) -> ExitCode:
    """Send `command` for `deployment` to the running daemon; waits until asleep or ready."""
    from dankserve import servicectl

    settings = cli_context().daemon_settings().settings  # the running daemon's when the file is refused
    dep = settings.deployments.get(deployment)
    if dep is None:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    if dep.swap_group is None:
        raise InvalidInput(
            f"deployment {deployment!r} is in no swap group: only swap group members sleep",
            fix=f'set swap_group = "NAME" in [deployments.{deployment}] (and on the deployments sharing its GPUs)',
        )
    wait = settings.boot_timeout_seconds if command == "wake" else 330.0
    reply = servicectl.daemon_request(settings.state_dir, {"command": command, "deployment": deployment}, wait + 30)
    if reply is None:
        raise EnvironmentUnusable(
            "the dankserve daemon is not running: nothing sleeps or wakes without it",
            fix="start it with `dankserve up`",
        )
    if not reply.get("ok"):
        error = str(reply.get("error"))
        if "does not fit" in error:
            raise InfeasiblePlan(error, fix="pin fewer members of the group, or lower gpu_memory_utilization")
        if " did not become " in error:
            raise TimedOut(error, fix=f"the daemon keeps trying: follow it with `dankserve status {deployment}`")
        if " is failed" in error:
            raise DeploymentFailed(error, fix=f"`dankserve status {deployment}` and `dankserve logs {deployment}`")
        raise EnvironmentUnusable(error, fix="see `dankserve status` and `dankserve logs`")
    status: dict[str, Any] = reply.get("status") or {}
    if as_json:  # the shape of `status NAME --json`, read now (the deployment rests where the reply said)
        print_json(status_document(deployment))
        return ExitCode.OK
    click.echo(f"{deployment}: {status.get('state', command)}")
    if status.get("swap"):
        click.echo(f"  {swap_line(status['swap'])}")
    return ExitCode.OK
