"""`dankserve run`: the daemon in the foreground (systemd's ExecStart)."""

from __future__ import annotations

from pathlib import Path

import click
import structlog

from dankserve.cli.context import cli_context
from dankserve.cli.options import hardware_option
from dankserve.errors import DankserveError
from dankserve.exitcodes import ExitCode


@click.command("run")
@click.option(
    "--log-format",
    type=click.Choice(["auto", "console", "json", "journald"]),
    default=None,
    help="Log output (default: the log_format setting; auto picks journald when present).",
)
@hardware_option
def command(log_format: str | None, hardware: Path | None) -> ExitCode:
    """Supervise every enabled deployment until SIGTERM; SIGHUP reloads the config."""
    from dankserve.logging_setup import configure_logging
    from dankserve.supervisor.assembly import build_daemon
    from dankserve.supervisor.instance import use_private_umask

    use_private_umask()
    ctx = cli_context()
    settings = ctx.load_settings()
    configure_logging(log_format or settings.log_format, state_dir=settings.state_dir)  # type: ignore[arg-type]  # click.Choice checked it
    try:
        return build_daemon(settings, hardware_file=hardware, config_path=ctx.config).run()
    except DankserveError as exc:
        # In the daemon's own log too (the journal, daemon.log), with its time: `dankserve logs` shows why it
        # stopped; the CLI prints it on stderr as for any command.
        structlog.get_logger("dankserve").error(
            "daemon_failed", error=exc.message, fix=exc.fix, exit_code=int(exc.exit_code)
        )
        raise
