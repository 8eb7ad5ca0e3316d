"""Tests for dankserve.supervisor.instance with real processes."""

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.errors import EnvironmentUnusable
from dankserve.supervisor import instance
from tests.harness.wait import wait_until

HOLD = (
    "import sys,time; from pathlib import Path; from dankserve.supervisor import instance; "
    "instance.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)"
)


def _holder(state_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_daemon_is_refused_naming_the_first(tmp_path: Path) -> None:
    """While one process holds the lock, another is refused with the holder's pid."""
    proc = _holder(tmp_path)
    try:
        assert instance.running_daemon(tmp_path) == proc.pid
        with pytest.raises(EnvironmentUnusable, match=str(proc.pid)):
            instance.acquire(tmp_path)
    finally:
        proc.kill()
        proc.wait()


def test_lock_dies_with_a_killed_daemon(tmp_path: Path) -> None:
    """A daemon killed with -9 leaves a stale pid file that blocks nothing."""
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: instance.running_daemon(tmp_path) is None, 5, what="the dead holder's lock released")
    held = instance.acquire(tmp_path)
    assert instance.read_pid(tmp_path) == os.getpid()
    held.release()
    assert instance.read_pid(tmp_path) is None


def test_state_dir_is_private(tmp_path: Path) -> None:
    """The state directory is created 0700."""
    held = instance.acquire(tmp_path / "state")
    held.release()
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700


def test_an_unusable_state_dir_is_an_environment_error(tmp_path: Path) -> None:
    """A state dir that cannot be created (a file is in the way) is refused with exit 3 naming it, no traceback."""
    (tmp_path / "file").write_text("")
    with pytest.raises(EnvironmentUnusable, match="cannot be used") as info:
        instance.acquire(tmp_path / "file" / "state")
    assert str(tmp_path / "file" / "state") in info.value.message


def test_the_lock_holds_no_writable_descriptor(tmp_path: Path) -> None:
    """The lock is held through a read-only descriptor, so the state dir's mount can still be made read-only."""
    held = instance.acquire(tmp_path)
    try:
        assert fcntl.fcntl(held.fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    finally:
        held.release()
