"""Security: a config another user can swap is never loaded. The file's owner and mode are checked
on the descriptor that is read, and every directory on the way to it (symlinks followed, as the
kernel does) must be owned and writable by root or the reading user only; a sticky directory such
as /tmp is fine when it and the entry in it are root's (or the user's).

Round 2 found the check made on one open and the read on another: an unprivileged user who could
write the config's directory swapped files in between and got their config loaded on the 8th
reload, its deployment's script running as root. The user is made in the test (useradd).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from dankserve.testing.config_file import write_config
from tests.harness.cli import RECORDED_HOST, run_dankserve
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.users import LocalUser, unprivileged_user
from tests.harness.wait import wait_until

DEPLOYMENT = '[deployments.chat]\nmodel = "m"\n[deployments.chat.model_facts]\nparameter_bytes = 2_000_000_000\n'


def config_in(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "dankserve.toml"
    path.write_text(DEPLOYMENT)
    path.chmod(0o600)
    return path


def dir_of_the_user(tmp_path: Path, user: LocalUser) -> Path:
    path = config_in(tmp_path / "conf")
    os.chown(path.parent, user.uid, user.gid)
    path.parent.chmod(0o755)
    return path


def world_writable_dir(tmp_path: Path, user: LocalUser) -> Path:
    path = config_in(tmp_path / "conf")
    path.parent.chmod(0o777)
    return path


def dir_writable_by_the_users_group(tmp_path: Path, user: LocalUser) -> Path:
    path = config_in(tmp_path / "conf")
    os.chown(path.parent, 0, user.gid)
    path.parent.chmod(0o770)
    return path


def grandparent_of_the_user(tmp_path: Path, user: LocalUser) -> Path:
    path = config_in(tmp_path / "outer" / "inner")
    os.chown(tmp_path / "outer", user.uid, user.gid)
    return path


def symlink_in_a_dir_of_the_user(tmp_path: Path, user: LocalUser) -> Path:
    safe = config_in(tmp_path / "safe")
    links = tmp_path / "links"
    links.mkdir()
    (links / "dankserve.toml").symlink_to(safe)
    os.chown(links, user.uid, user.gid)
    return links / "dankserve.toml"


def sticky_dir_of_the_user(tmp_path: Path, user: LocalUser) -> Path:
    path = config_in(tmp_path / "shared")
    os.chown(path.parent, user.uid, user.gid)
    path.parent.chmod(0o1777)
    return path


REFUSED: list[tuple[str, Callable[[Path, LocalUser], Path], str]] = [
    ("dir-of-the-user", dir_of_the_user, "/conf on its way is owned by uid {uid}"),
    ("world-writable-dir", world_writable_dir, "/conf on its way is writable by its group and others (mode 0777)"),
    ("group-writable-dir", dir_writable_by_the_users_group, "/conf on its way is writable by its group (mode 0770)"),
    ("grandparent", grandparent_of_the_user, "/outer on its way is owned by uid {uid}"),
    ("symlink-in-its-dir", symlink_in_a_dir_of_the_user, "/links on its way is owned by uid {uid}"),
    ("sticky-dir-of-the-user", sticky_dir_of_the_user, "/shared on its way is owned by uid {uid}"),
]


@pytest.mark.parametrize(("case", "make", "expected"), REFUSED, ids=[c[0] for c in REFUSED])
@pytest.mark.parametrize("command", [["plan"], ["run", "--hardware", str(RECORDED_HOST)]], ids=["plan", "run"])
def test_a_config_another_user_can_swap_is_refused(
    tmp_path: Path, case: str, make: Callable[[Path, LocalUser], Path], expected: str, command: list[str]
) -> None:
    """A root-owned 0600 config in (or reached through) a directory another user owns or may write: plan and
    the daemon exit 2 naming the directory and the fix."""
    user = unprivileged_user()
    done = run_dankserve(make(tmp_path, user), *command)
    assert done.returncode == 2, done.stdout + done.stderr
    assert expected.format(uid=user.uid) in done.stderr, done.stderr
    assert "swap the config" in done.stderr and "fix: chown root" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_sticky_dir_and_a_config_of_root_are_accepted(tmp_path: Path) -> None:
    """/tmp's case: a 1777 directory of root holding root's 0600 config is safe (only root may rename it)."""
    if os.geteuid() != 0:
        pytest.skip("the sticky case needs the config owned by root")
    path = config_in(tmp_path / "sticky")
    path.parent.chmod(0o1777)
    done = run_dankserve(path, "plan")
    assert done.returncode == 0, done.stdout + done.stderr


RENAME_EXCHANGE = 2
AT_FDCWD = -100

SWAPPER = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
while True:  # swap the root's config and ours, atomically, again and again
    libc.renameat2({AT_FDCWD}, b"dankserve.toml", {AT_FDCWD}, b"evil.toml", {RENAME_EXCHANGE})
"""


@pytest.mark.slow
def test_a_config_swapped_between_check_and_read_is_never_loaded(tmp_path: Path) -> None:
    """The round-2 attack: once another user owns the config's directory and swaps their own config with root's
    in a loop, every one of 10 reloads is refused and their deployment never appears; the served one stays."""
    user = unprivileged_user()
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "renameat2"):
        pytest.skip("renameat2 is needed to swap two files atomically")
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        evil = write_config(
            tmp_path / "evil.toml",
            {"state_dir": str(tmp_path / "state")},
            {"chat": process_deployment(free_port()), "pwned": process_deployment(free_port())},
        )
        os.chown(evil, user.uid, user.gid)
        os.chown(tmp_path, user.uid, user.gid)  # the directory is theirs now (mode 0700: theirs alone)
        swapper = subprocess.Popen(user.argv([sys.executable, "-c", SWAPPER]), cwd=tmp_path)

        def rejected(count: int) -> Callable[[], bool]:
            return lambda: len(daemon.events_named("reload_rejected")) >= count

        try:
            for reloads in range(1, 11):
                daemon.signal(signal.SIGHUP)
                wait_until(rejected(reloads), 20, what=daemon.log_tail)
                assert len(daemon.events_named("reload_rejected")) == reloads, daemon.log_tail()
                assert daemon.deployment("pwned") is None
        finally:
            swapper.kill()
            swapper.wait()
            os.chown(tmp_path, 0, 0)
        # each refusal names why: the directory on the way is theirs, or (the swap caught mid-way) the file read is
        for refusal in daemon.events_named("reload_rejected"):
            assert "on its way is owned by uid" in refusal["error"] or " is owned by uid " in refusal["error"], refusal
        chat = daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert chat["boots"] == 1
