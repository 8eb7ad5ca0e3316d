"""An unprivileged local user for the security tests: made with useradd (root only), acted as with setpriv."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

NAME = "dankserve-probe"


@dataclass(frozen=True)
class LocalUser:
    name: str
    uid: int
    gid: int

    def argv(self, command: Sequence[str]) -> list[str]:
        """`command` run as this user (no supplementary groups), from a process running as root."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *command]


def unprivileged_user() -> LocalUser:
    """The tests' unprivileged user, created once; the test is skipped when not root (or no useradd/setpriv)."""
    if os.geteuid() != 0:
        pytest.skip("making and acting as another user needs root")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("useradd and setpriv are needed to act as another user")
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:  # a test running in parallel may have made it meanwhile: look again
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
            check=False,
            capture_output=True,
        )
        entry = pwd.getpwnam(NAME)
    return LocalUser(NAME, entry.pw_uid, entry.pw_gid)
