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

        self._refuse_a_missing_default_file()
        try:
            return ReachedSettings(load_settings(self.config), None)
        except ConfigError as refusal:
            from dankserve import servicectl

            running = servicectl.running_settings(state_dir_despite_errors(self.config))
            if running is None:
                raise
            return ReachedSettings(running, refusal)

    def _refuse_a_missing_default_file(self) -> None:
        """Without --config or DANKSERVE_CONFIG, a missing default file is an error for these commands too.

        Reading no file means the default state dir, where no daemon of the user's listens: a second
        terminal without the exports of the first would hear "daemon not running" (exit 0) while the
        daemon serves, and `logs -f` would wait forever. DANKSERVE_STATE_DIR alone still names a daemon."""
        import os

        from dankserve.errors import ConfigError
        from dankserve.settings.files import CONFIG_ENV, resolve_config_path

        path, named = resolve_config_path(self.config)
        if named or os.environ.get("DANKSERVE_STATE_DIR") or os.path.lexists(path):
            return
        raise ConfigError(
            f"config file {path} does not exist (no --config given and {CONFIG_ENV} is not set), so there is no "
            "daemon to reach",
            fix=f"name the file the daemon was started with: `export {CONFIG_ENV}=/path/to/dankserve.toml` (as in "
            f"the terminal that ran `dankserve up`) or --config FILE; `dankserve install` writes {path}",
        )


def cli_context() -> CliContext:
    """The context of the running command."""
    ctx = click.get_current_context()
    obj = ctx.find_object(CliContext)
    if obj is None:  # a command invoked on its own, as in tests
        return CliContext(config=None, debug=False)
    return obj
