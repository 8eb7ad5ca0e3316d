"""Tests for dankserve.processes: the one detached spawn and the one pid-identity check."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from dankserve.processes import is_same_process, spawn_detached, start_time_of, write_private_file


def test_a_detached_child_runs_in_its_own_session_logging_to_a_private_file(tmp_path: Path) -> None:
    """The child leads a new session, writes stdout and stderr to a 0600 log, and appends when asked."""
    log = tmp_path / "out.log"
    code = "import os, sys; print(os.getsid(0) == os.getpid()); print('err', file=sys.stderr)"
    spawn_detached([sys.executable, "-c", code], log).wait(10)
    spawn_detached([sys.executable, "-c", "print('again')"], log, append=True).wait(10)
    assert log.read_text().split() == ["True", "err", "again"]
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_a_process_is_recognised_by_pid_and_start_time(tmp_path: Path) -> None:
    """The same pid with another start time (a reused pid) is not the process; a reaped one is gone."""
    child = spawn_detached([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "log")
    started = start_time_of(child.pid)
    assert is_same_process(child.pid, started)
    assert not is_same_process(child.pid, started - 3600)
    child.kill()
    child.wait(10)
    assert not is_same_process(child.pid, started)
    assert is_same_process(os.getpid(), start_time_of(os.getpid()))


def test_private_files_are_replaced_atomically_and_owner_only(tmp_path: Path) -> None:
    """write_private_file leaves a 0600 file with the new text and no temp file."""
    path = tmp_path / "record.json"
    write_private_file(path, "one")
    write_private_file(path, "two")
    assert path.read_text() == "two" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
