"""Reading back what `dankserve install` wrote into a unit: ExecStart='s words, as systemd splits them."""

from __future__ import annotations

import shlex
from pathlib import Path

_PREFIXES = "-@:+!"
"""ExecStart='s own prefixes before the executable (ignore failure, argv[0], no specifiers, privileges)."""


def exec_start(unit_text: str) -> list[str]:
    """The last ExecStart= command line's words (quotes removed, `%%` and `$$` read back); [] when none."""
    words: list[str] = []
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            command = line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$")
            try:
                words = shlex.split(command)
            except ValueError:
                words = []
    if words:
        words[0] = words[0].lstrip(_PREFIXES)
    return words


def config_of(words: list[str]) -> Path | None:
    """The `--config FILE` (or `--config=FILE`) an ExecStart= passes dankserve, None when it passes none."""
    for i, word in enumerate(words):
        if word == "--config" and i + 1 < len(words):
            return Path(words[i + 1])
        if word.startswith("--config="):
            return Path(word.removeprefix("--config="))
    return None
