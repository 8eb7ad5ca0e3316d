"""`dankserve rollback NAME`: back to the image before the last upgrade's switch (a warm boot: learned
KV bytes and compile cache are kept per image and version), then follow it until ready."""

from __future__ import annotations

import click

from dankserve.cli.options import complete_deployment
from dankserve.cli.upgrade import daemon_request
from dankserve.exitcodes import ExitCode


@click.command("rollback")
@click.argument("deployment", shell_complete=complete_deployment)
@click.option("--timeout", type=float, default=None, help="Give up following after this many seconds.")
def command(deployment: str, timeout: float | None) -> ExitCode:
    """Go back to DEPLOYMENT's image before its last upgrade, and wait until it is ready."""
    from dankserve.cli.context import cli_context
    from dankserve.cli.up import FollowedDaemon, _follow, _log_size, boots_now

    state_dir = cli_context().daemon_settings().settings.state_dir
    log_start = _log_size(state_dir)
    # The answer comes once the worker was told; its server before the rollback may still show ready for a
    # moment: only a boot after this count ends the wait.
    before = boots_now(state_dir, deployment)
    daemon_request({"command": "rollback", "deployment": deployment})
    click.echo(f"{deployment}: rolling back; booting the previous image")
    followed = FollowedDaemon(state_dir, None, False, log_start, boots_before={deployment: before})
    return _follow(followed, [deployment], timeout)
