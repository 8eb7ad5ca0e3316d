"""Options several commands share, declared once."""

from __future__ import annotations

from pathlib import Path

import click

hardware_option = click.option(
    "--hardware",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="DANKSERVE_HARDWARE",
    default=None,
    help="Use a recorded host description (dankserve probe --save) instead of probing NVML.",
)
