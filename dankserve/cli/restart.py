"""`dankserve restart DEPLOYMENT`: stop one deployment's server and boot it again through the
running daemon (`down` then `up`), then follow it as `up` does until it settles."""

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
    """Restart DEPLOYMENT (down, then up, through the running daemon) and wait until it is ready."""
    from dankserve import servicectl
    from dankserve.cli.up import FollowedDaemon, _follow, _log_size

    settings = cli_context().daemon_settings().settings  # the running daemon's when the file is refused
    if deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
    state_dir = settings.state_dir
    log_start = _log_size(state_dir)
    for step in ("down", "up"):
        # `down` is answered once the server has stopped; `up` at once (the boot is followed below).
        reply = servicectl.daemon_request(state_dir, {"command": step, "deployment": deployment})
        if reply is None:
            raise EnvironmentUnusable(
                "the dankserve daemon is not running, so there is nothing to restart",
                fix=f"start it with `dankserve up {deployment}`",
            )
        if not reply.get("ok"):
            raise InvalidInput(str(reply.get("error")))
        if step == "down":
            click.echo(f"{deployment}: stopped; booting it again")
    return _follow(FollowedDaemon(state_dir, None, False, log_start), [deployment], timeout)
