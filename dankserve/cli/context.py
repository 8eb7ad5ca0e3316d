"""The frozen context every command receives from the top-level options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click


@dataclass(frozen=True)
class CliContext:
    """Options given before the command name."""

    config: Path | None
    debug: bool

    def load_settings(self):  # type: ignore[no-untyped-def]  # lazy import keeps startup fast
        from dankserve.settings import load_settings

        return load_settings(self.config)


def cli_context() -> CliContext:
    """The context of the running command."""
    ctx = click.get_current_context()
    obj = ctx.find_object(CliContext)
    if obj is None:  # a command invoked on its own, as in tests
        return CliContext(config=None, debug=False)
    return obj
