"""The frozen context every command receives from the top-level options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from dankserve.errors import ConfigError
    from dankserve.settings import Settings


@dataclass(frozen=True)
class ReachedSettings:
    """The settings a command that reaches the daemon works with, and the file's refusal if any."""

    settings: Settings
    refusal: ConfigError | None
    """Set when the file on disk does not validate: `settings` are then the running daemon's own."""


@dataclass(frozen=True)
class CliContext:
    """Options given before the command name."""

    config: Path | None
    debug: bool

    def load_settings(self) -> Settings:
        # imported here: pydantic-settings costs startup time that commands without settings skip
        from dankserve.settings import load_settings

        return load_settings(self.config)

    def daemon_settings(self) -> ReachedSettings:
        """The file's settings; when the file is refused while a daemon runs, the daemon's running settings.

        For the commands that read or steer the running daemon (status, logs, sleep, wake, down, reload):
        a broken file on disk must not blind them while the daemon serves the config it loaded before."""
        from dankserve.errors import ConfigError
        from dankserve.settings import load_settings, state_dir_despite_errors

        try:
            return ReachedSettings(load_settings(self.config), None)
        except ConfigError as refusal:
            from dankserve import servicectl

            running = servicectl.running_settings(state_dir_despite_errors(self.config))
            if running is None:
                raise
            return ReachedSettings(running, refusal)


def cli_context() -> CliContext:
    """The context of the running command."""
    ctx = click.get_current_context()
    obj = ctx.find_object(CliContext)
    if obj is None:  # a command invoked on its own, as in tests
        return CliContext(config=None, debug=False)
    return obj
