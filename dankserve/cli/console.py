"""The rich console of the commands that print with rich (`plan`, `probe`), imported only when they do.

rich meets a closed stdout pipe (`dankserve plan | head -1`) with its own exit, status 1
(`Console.on_broken_pipe`); this console raises the BrokenPipeError instead, so the CLI's one edge
(`cli.main`) ends it quietly as it does for every other write.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from rich.console import Console


class PipedConsole(Console):
    """A rich Console whose closed stdout is the caller's BrokenPipeError, not a SystemExit(1)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def console(**options: Any) -> Console:
    """A console for stdout with rich's `options` (highlight, width ...)."""
    return PipedConsole(**options)
