"""`dankserve sleep NAME [--json]`: put a swap group member to sleep now; returns once asleep."""

from __future__ import annotations

import click

from dankserve.cli.options import complete_deployment
from dankserve.cli.swap_request import swap_request
from dankserve.exitcodes import ExitCode


@click.command("sleep")
@click.argument("deployment", shell_complete=complete_deployment)
@click.option("--json", "as_json", is_flag=True, help="Print the deployment's status document as JSON.")
def command(deployment: str, as_json: bool) -> ExitCode:
    """Put DEPLOYMENT (a swap group member) to sleep: level 1, 2, suspended or stopped, as its sleep_level, RAM and
    release allow."""
    return swap_request("sleep", deployment, as_json)
