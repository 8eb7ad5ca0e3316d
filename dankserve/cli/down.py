"""`dankserve down [DEPLOYMENT]`: stop gracefully and wait until gone. Idempotent."""

from __future__ import annotations

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import EnvironmentUnusable, InvalidInput
from dankserve.exitcodes import ExitCode


@click.command("down")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
def command(deployment: str | None) -> ExitCode:
    """Stop the service, or take one deployment down (it stays down across restarts until `up`)."""
    from dankserve import servicectl

    ctx = cli_context()
    settings = ctx.daemon_settings().settings  # the running daemon's when the file is refused
    state_dir = settings.state_dir
    if deployment is not None:
        if deployment not in settings.deployments:
            known = ", ".join(sorted(settings.deployments)) or "none"
            raise InvalidInput(f"unknown deployment {deployment!r}", fix=f"configured deployments: {known}")
        reply = servicectl.daemon_request(state_dir, {"command": "down", "deployment": deployment})
        if reply is None:
            _down_offline(deployment)
        elif not reply.get("ok"):
            raise InvalidInput(str(reply.get("error")))
        click.echo(f"{deployment}: down (stays down until `dankserve up {deployment}`)")
        return ExitCode.OK
    if servicectl.daemon_pid(state_dir) is None:
        click.echo("dankserve is not running")
        return ExitCode.OK
    if servicectl.systemd_manages(ctx.config):
        servicectl.systemctl("stop", servicectl.UNIT_NAME)
    elif not servicectl.stop_daemon(state_dir, settings.stop_timeout_seconds + 30):
        raise EnvironmentUnusable(
            f"the daemon did not stop within {settings.stop_timeout_seconds + 30:.0f}s",
            fix="look at `dankserve logs`; kill it with `kill -9 $(cat STATE_DIR/daemon.pid)` if it hangs",
        )
    click.echo("dankserve stopped")
    return ExitCode.OK


def _down_offline(deployment: str) -> None:
    """No daemon: mark the deployment down and remove a leftover workload directly."""
    from dankserve.supervisor.assembly import runtime_factory
    from dankserve.supervisor.records import StateBook

    settings = cli_context().load_settings()
    store = StateBook(settings.state_dir)
    store.set_down(deployment, True)
    runtime = runtime_factory(settings)(settings.deployments[deployment])
    existing = runtime.find(deployment)
    if existing is not None:
        runtime.stop(existing.id, settings.stop_timeout_seconds)
        runtime.remove(existing.id)
