"""Tests for dankserve/runtime/logfile.py: following a growing log file, and conmon's k8s-file records."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from dankserve.runtime.logfile import (
    ChangeWatch,
    follow_file,
    k8s_file_lines,
    k8s_file_record,
    line_time_record,
    read_line_times,
    timed_file_lines,
)

TS = b"2026-11-29T20:12:05.556843015+00:00"


@pytest.mark.parametrize(
    ("record", "parsed"),
    [
        (TS + b" stdout F hello world", (b"stdout", b"hello world", False)),
        (TS + b" stderr P first half", (b"stderr", b"first half", True)),
        (TS + b" stdout F ", (b"stdout", b"", False)),
        (TS + b" stdout F", (b"stdout", b"", False)),
        (TS + b" stdout X what", None),
        (b"not a record", None),
        (b"", None),
    ],
)
def test_k8s_file_record(record: bytes, parsed: tuple[bytes, bytes, bool] | None) -> None:
    """A k8s-file record splits into stream, message and whether conmon cut it; other text is no record."""
    assert k8s_file_record(record) == parsed


@pytest.mark.parametrize(
    ("records", "lines"),
    [
        ([TS + b" stdout F a", TS + b" stderr F b"], ["a", "b"]),
        ([TS + b" stdout P par", TS + b" stdout P ti", TS + b" stdout F al"], ["partial"]),
        ([TS + b" stdout P out-", TS + b" stderr F err", TS + b" stdout F line"], ["err", "out-line"]),
        ([TS + b" stdout P caf\xc3", TS + b" stdout F \xa9"], ["caf\u00e9"]),
        ([TS + b" stdout F crlf\r"], ["crlf"]),
        ([b"garbage", TS + b" stdout F kept"], ["kept"]),
        ([TS + b" stdout P cut off"], ["cut off"]),
        ([], []),
    ],
)
def test_k8s_file_lines(records: list[bytes], lines: list[str]) -> None:
    """Records become the container's lines: partial records joined per stream, characters never split."""
    assert list(k8s_file_lines(records)) == lines


def test_follow_file_reads_to_the_end_without_follow(tmp_path: Path) -> None:
    """Without following, the file's lines come once, a last line without newline included."""
    path = tmp_path / "log"
    path.write_bytes(b"one\ntwo\nthree")
    assert list(follow_file(path, False, lambda: True)) == [b"one", b"two", b"three"]


def test_follow_file_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    """A log file that does not exist gives no lines."""
    assert list(follow_file(tmp_path / "absent", True, lambda: True)) == []


def test_follow_file_yields_lines_as_written_until_the_writer_stops(tmp_path: Path) -> None:
    """Following yields lines written later, and ends once the writer is gone and everything is read."""
    path = tmp_path / "log"
    path.write_bytes(b"first\n")
    writer_done = threading.Event()
    seen: list[bytes] = []

    def write_more() -> None:
        with path.open("ab") as out:
            out.write(b"second\nthi")
            out.flush()
            out.write(b"rd\nlast")
        writer_done.set()

    for line in follow_file(path, True, lambda: not writer_done.is_set()):
        seen.append(line)
        if line == b"first":
            threading.Thread(target=write_more).start()
    assert seen == [b"first", b"second", b"third", b"last"]


def test_change_watch_wakes_on_a_write_a_new_entry_and_the_process_end(tmp_path: Path) -> None:
    """The watch reports a write to the file, an entry created in the directory, and the process's end."""
    path, directory = tmp_path / "log", tmp_path / "exits"
    path.write_bytes(b"")
    directory.mkdir()
    process = subprocess.Popen(["sleep", "60"])
    watch = ChangeWatch.open(path, process.pid, directory)
    assert watch is not None
    try:
        assert watch.wait(timeout=0) is False
        with path.open("ab") as out:
            out.write(b"line\n")
        assert watch.wait(timeout=30) is True
        assert watch.wait(timeout=0) is False  # the event was consumed
        (directory / "container-id").write_text("137")
        assert watch.wait(timeout=30) is True
        assert not watch.process_ended()
        process.kill()
        process.wait()
        assert watch.wait(timeout=30) is True
        assert watch.process_ended()
    finally:
        watch.close()
        if process.poll() is None:
            process.kill()


def test_followed_file_with_a_watch_ends_when_its_process_does(tmp_path: Path) -> None:
    """A follower sleeping on a watch gets the writer's lines and ends once the writer has exited."""
    path = tmp_path / "log"
    path.write_bytes(b"")
    with path.open("ab") as out:
        process = subprocess.Popen(["sh", "-c", "echo one; sleep 0.2; echo two"], stdout=out)
    watch = ChangeWatch.open(path, process.pid)
    assert watch is not None
    try:
        lines = list(follow_file(path, True, lambda: not watch.process_ended(), watch.wait))
    finally:
        watch.close()
        process.wait()
    assert lines == [b"one", b"two"]


def test_line_times_are_read_to_the_last_complete_entry_and_an_unreadable_one_keeps_its_place(tmp_path: Path) -> None:
    """Entries written by line_time_record read back to the microsecond; a half-written last entry waits for the
    next read (from the offset returned), a damaged one is unknown and the lines after it keep their times."""
    path = tmp_path / "chat.log.times"
    path.write_bytes(line_time_record(1733161493.123456) + b"garbage\n" + line_time_record(1733161494.5) + b"17331")
    times, offset = read_line_times(path)
    assert times == [1733161493.123456, None, 1733161494.5]
    with path.open("ab") as handle:
        handle.write(b"61495.25\n")
    assert read_line_times(path, offset) == ([1733161495.25], path.stat().st_size)
    assert read_line_times(tmp_path / "absent") == ([], 0)
    timed = list(timed_file_lines(["a", "b", "c", "d"], lambda i: times[i] if i < len(times) else None))
    assert [(at.timestamp() if at else None, text) for at, text in timed] == [
        (1733161493.123456, "a"),
        (None, "b"),
        (1733161494.5, "c"),
        (None, "d"),
    ]


def test_a_line_time_no_datetime_can_hold_is_unknown(tmp_path: Path) -> None:
    """nan, inf, negative and absurdly late entries read as unknown, so `dankserve logs` never overflows."""
    path = tmp_path / "x.log.times"
    path.write_bytes(b"nan\ninf\n-5\n1e300\n1733161495.250000\n")
    assert read_line_times(path)[0] == [None, None, None, None, 1733161495.25]
