"""The CRIU edge against the real criu binary: a Python HTTP server with a child, dumped while it
keeps running, killed, restored and answering; corrupt and truncated images → CriuFailed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.doctor import read_criu
from dankserve.snapshot.criu import CriuFailed, criu_path, dump, restore
from tests.harness.pids import adopting_orphans
from tests.harness.wait import wait_until

_reading = read_criu(criu_path())
pytestmark = pytest.mark.skipif(
    _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
    reason="needs root and a working CRIU >= 4.2 (make system-deps)",
)

# A server with a child process (the shape of vLLM's API server and engine core).
_SERVER = """
import http.server, os, sys, time
port = int(sys.argv[1])
if os.fork() == 0:
    while True:
        time.sleep(3600)
http.server.ThreadingHTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int, deadline_s: float = 20.0) -> int:

    def status() -> int | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                return int(r.status)
        except OSError:
            return None

    return wait_until(status, deadline_s, 0.1, what=f"an HTTP answer on port {port}")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(port)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert _answers(port) == 200
        yield proc, port
    finally:
        _kill_tree(proc.pid)
        proc.wait()


def _kill_tree(pid: int) -> None:
    """Kills the tree's process group and waits until its pids are free again (a restore needs them)."""
    members = [pid, *_children(pid)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)

    def gone() -> bool:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-1, os.WNOHANG)  # orphans come to us: we are a child subreaper
        return not any(Path(f"/proc/{p}").exists() for p in members)

    wait_until(gone, 20, 0.05, what=f"the killed tree's pids {members} freed")


@pytest.fixture(autouse=True)
def _subreaper() -> Iterator[None]:
    """Orphaned children of the server are reparented to this process (not to a PID 1 that may
    never reap them), so their pids are free for the restore once we reap them. Only for this test
    (tests/harness/pids.py `adopting_orphans`)."""
    with adopting_orphans():
        yield


def test_dump_leaves_running_then_restore_after_kill_serves_again(
    server: tuple[subprocess.Popen[bytes], int], tmp_path: Path
) -> None:
    proc, port = server
    assert len(_children(proc.pid)) == 1
    images = tmp_path / "images"
    images.mkdir()
    dump(proc.pid, images)
    assert _answers(port) == 200  # --leave-running: the server kept serving
    assert any(images.glob("pages-*.img"))
    _kill_tree(proc.pid)
    proc.wait()
    pid = restore(images)
    try:
        assert pid == proc.pid
        assert _answers(port) == 200
        assert len(_children(pid)) == 1
    finally:
        _kill_tree(pid)


def test_dump_of_a_missing_process_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CriuFailed) as err:
        dump(2**22 - 1, tmp_path)
    assert err.value.action == "dump" and err.value.reason


def test_restore_of_an_empty_directory_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(CriuFailed) as err:
        restore(tmp_path)
    assert err.value.action == "restore"


def damage_images(images: Path, damage: str) -> None:
    """Every image file cut to a third ("truncate") or overwritten ("garbage")."""
    for image in images.glob("*.img"):
        if damage == "truncate":
            with image.open("r+b") as f:
                f.truncate(image.stat().st_size // 3)
        else:
            image.write_bytes(b"\xff" * 64)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_corrupt_or_truncated_images_are_a_typed_error(
    server: tuple[subprocess.Popen[bytes], int], tmp_path: Path, damage: str
) -> None:
    proc, _ = server
    images = tmp_path / "images"
    images.mkdir()
    dump(proc.pid, images)
    _kill_tree(proc.pid)
    proc.wait()
    damage_images(images, damage)
    with pytest.raises(CriuFailed) as err:
        pid = restore(images)
        _kill_tree(pid)
    assert err.value.action == "restore" and "criu restore failed" in err.value.message
