"""Tests for dankserve.processes: the one detached spawn and the one pid-identity check."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

from dankserve.processes import is_same_process, spawn_detached, start_ticks_of, start_time_of, write_private_file
from tests.harness.pids import take_pid
from tests.harness.wait import hold_for


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


def test_a_pid_taken_again_within_the_start_time_tolerance_has_other_start_ticks(tmp_path: Path) -> None:
    """A pid reused a moment after its first process ended (a restored tree's, killed and taken at once) passes
    the start-time check but not the exact ticks, which the process runtime checks too."""
    first = spawn_detached(["sleep", "60"], tmp_path / "log")
    ticks, started = start_ticks_of(first.pid), start_time_of(first.pid)
    assert ticks is not None and start_ticks_of(first.pid) == ticks, "stable across reads"
    first.kill()
    first.wait(10)
    assert start_ticks_of(first.pid) is None
    hold_for(0.05, "ticks are 1/100 s (USER_HZ): a pid taken again within the same tick is not told apart")
    taker = take_pid(first.pid) if os.geteuid() == 0 else None
    if taker is None:
        return  # the pid could not be taken again here (not root): the rest needs it
    try:
        taken = start_ticks_of(taker.pid)
        assert taken is not None and taken != ticks
        if time.time() - started < 0.4:  # the start-time check alone would have taken it for the first
            assert is_same_process(taker.pid, started)
    finally:
        taker.kill()
        taker.wait()


def test_private_files_are_replaced_atomically_and_owner_only(tmp_path: Path) -> None:
    """write_private_file leaves a 0600 file with the new text and no temp file."""
    path = tmp_path / "record.json"
    write_private_file(path, "one")
    write_private_file(path, "two")
    assert path.read_text() == "two" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
