"""Options several commands share, declared once."""

from __future__ import annotations

from pathlib import Path

import click
from click.shell_completion import CompletionItem

hardware_option = click.option(
    "--hardware",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="DANKSERVE_HARDWARE",
    default=None,
    help="Use a recorded host description (dankserve probe --save) instead of probing NVML.",
)

timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Give up following after this many seconds (more than 0).",
)
"""`up` and `restart`: how long they follow the daemon; a zero or negative wait is refused before anything starts."""


def complete_deployment(ctx: click.Context, _param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """TAB completion of deployment names: the [deployments.NAME] tables of the config file (the one
    --config names, before or after the command, else the default), read as TOML only, so a config
    that does not validate still completes; nothing when it cannot be read."""
    from dankserve.cli.context import CliContext
    from dankserve.errors import DankserveError
    from dankserve.settings import read_config_file, resolve_config_path

    named = ctx.find_object(CliContext)
    config = named.config if named is not None and named.config is not None else ctx.find_root().params.get("config")
    try:
        path, required = resolve_config_path(config if isinstance(config, Path) else None)
        tables = read_config_file(path, required=required).get("deployments")
    except (DankserveError, OSError):
        return []
    names = sorted(tables) if isinstance(tables, dict) else []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]
