"""`dankserve restart DEPLOYMENT`: stop one deployment's server and boot it again through the
running daemon, then follow it as `up` does until it settles.

One request (`restart`), so the gateway queues the deployment's requests for the new boot instead
of answering 503 "taken down" between a `down` and an `up`; a daemon of an earlier release that
does not know the verb is asked `down` then `up`."""

from __future__ import annotations

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment, timeout_option
from dankserve.errors import EnvironmentUnusable, InvalidInput
from dankserve.exitcodes import ExitCode


@click.command("restart")
@click.argument("deployment", shell_complete=complete_deployment)
@timeout_option
def command(deployment: str, timeout: float | None) -> ExitCode:
    """Restart DEPLOYMENT through the running daemon (its requests wait in the gateway) and wait until ready."""
    from dankserve import servicectl
    from dankserve.cli.up import FollowedDaemon, _follow, _log_size

    settings = cli_context().daemon_settings().settings  # the running daemon's when the file is refused
    if deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    state_dir = settings.state_dir
    log_start = _log_size(state_dir)
    # answered once the old server has stopped and the new boot began (followed below)
    steps = ["restart"]
    while steps:
        step = steps.pop(0)
        reply = servicectl.daemon_request(state_dir, {"command": step, "deployment": deployment})
        if reply is None:
            raise EnvironmentUnusable(
                "the dankserve daemon is not running, so there is nothing to restart",
                fix=f"start it with `dankserve up {deployment}`",
            )
        if step == "restart" and str(reply.get("error", "")).startswith("unknown command"):
            steps = ["down", "up"]  # an earlier release's daemon
            continue
        if not reply.get("ok"):
            raise InvalidInput(str(reply.get("error")))
        if step != "up":
            click.echo(f"{deployment}: stopped; booting it again")
    return _follow(FollowedDaemon(state_dir, None, False, log_start), [deployment], timeout)
