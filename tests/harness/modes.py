"""What the security tests check of files dankserve writes: owner-only modes."""

from __future__ import annotations

import stat
from pathlib import Path


def modes_not_private(root: Path) -> list[str]:
    """Every directory under root (root included) that is not 0700 and every file that is not 0600."""
    wrong = []
    for path in [root, *sorted(root.rglob("*"))]:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue
        want = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if stat.S_IMODE(info.st_mode) != want:
            wrong.append(f"{path.relative_to(root.parent)} {stat.S_IMODE(info.st_mode):04o} (want {want:04o})")
    return wrong
