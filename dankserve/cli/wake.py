"""`dankserve wake NAME [--json]`: wake a sleeping swap group member; returns once ready."""

from __future__ import annotations

import click

from dankserve.cli.options import complete_deployment
from dankserve.cli.swap_request import swap_request
from dankserve.exitcodes import ExitCode


@click.command("wake")
@click.argument("deployment", shell_complete=complete_deployment)
@click.option("--json", "as_json", is_flag=True, help="Print the deployment's status document as JSON.")
def command(deployment: str, as_json: bool) -> ExitCode:
    """Wake DEPLOYMENT (a swap group member), putting least recently used members to sleep to make room."""
    return swap_request("wake", deployment, as_json)
