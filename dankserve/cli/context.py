"""The frozen context every command receives from the top-level options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from dankserve.settings import Settings


@dataclass(frozen=True)
class CliContext:
    """Options given before the command name."""

    config: Path | None
    debug: bool

    def load_settings(self) -> Settings:
        # imported here: pydantic-settings costs startup time that commands without settings skip
        from dankserve.settings import load_settings

        return load_settings(self.config)


def cli_context() -> CliContext:
    """The context of the running command."""
    ctx = click.get_current_context()
    obj = ctx.find_object(CliContext)
    if obj is None:  # a command invoked on its own, as in tests
        return CliContext(config=None, debug=False)
    return obj
