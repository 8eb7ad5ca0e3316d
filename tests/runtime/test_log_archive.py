"""runtime.log_archive: an ended server's lines kept, bounded, read back as data (issue 39.2)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from dankserve.runtime.log_archive import MAX_LINE_BYTES, LogArchive, encode_line

AT = datetime(2026, 12, 1, 13, 0, 0).astimezone()


def test_the_last_servers_are_kept_each_to_its_last_bytes_oldest_first(tmp_path: Path) -> None:
    """Six servers ended: the last five are kept, oldest first, each its lines with their times; a long log keeps
    its end (why it ended), not its beginning."""
    archive = LogArchive(tmp_path / "logs", keep=5, max_bytes=4096)
    for n in range(6):
        archive.keep("chat", f"process-chat-{n}", [(AT, f"server {n} line {i}") for i in range(3)] + [(None, "end")])
    ended = archive.ended("chat")
    assert [s.workload_id for s in ended] == [f"process-chat-{n}" for n in range(1, 6)]
    assert ended[-1].lines == ((AT, "server 5 line 0"), (AT, "server 5 line 1"), (AT, "server 5 line 2"), (None, "end"))
    archive.keep("chat", "long", [(AT, f"line {i:05d}") for i in range(2000)])
    kept = archive.ended("chat")[-1].lines
    assert kept[-1] == (AT, "line 01999") and len(kept) < 2000
    assert sum(len(encode_line(at, text)) + 1 for at, text in kept) <= 4096
    assert oct(os.stat(tmp_path / "logs" / "chat").st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in (tmp_path / "logs" / "chat").iterdir())


def test_hostile_names_lines_and_files_are_bounded(tmp_path: Path) -> None:
    """A name that would leave the directory keeps nothing; a huge line is cut; a file replaced by a symlink or
    holding garbage is skipped or read as lines without times; a deployment with none kept has none."""
    archive = LogArchive(tmp_path / "logs")
    archive.keep("../escape", "x", [(AT, "nope")])
    archive.keep(".hidden", "x", [(AT, "nope")])
    assert not (tmp_path / "escape").exists() and not list((tmp_path / "logs").glob("*"))
    archive.keep("chat", "w/../../id", [(AT, "x" * (MAX_LINE_BYTES * 3)), (AT, "a\nb")])
    [server] = archive.ended("chat")
    assert "/" not in server.workload_id
    assert len(server.lines[0][1]) <= MAX_LINE_BYTES + 10 and server.lines[0][1].endswith("[cut]")
    assert server.lines[1] == (AT, "a b")
    folder = tmp_path / "logs" / "chat"
    (folder / "00000000000000000001-bad.log").write_bytes(b"not a time\tline\n\xff\xfe garbage\n")
    (tmp_path / "secret").write_text("secret\n")
    (folder / "00000000000000000002-link.log").symlink_to(tmp_path / "secret")
    servers = archive.ended("chat")
    assert [s.workload_id for s in servers] == ["bad", server.workload_id]
    assert servers[0].lines[0] == (None, "line")
    assert archive.ended("other") == []
