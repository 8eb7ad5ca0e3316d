"""Capture and restore (dankserve/snapshot/capture.py, restore.py) against the real CRIU and the real stand-in
vLLM run as a process with its host pids (as the process runtime runs it: a PID namespace of its own would
share the host's /proc, which CUDA refuses; docs/snapshots.md "Host pids"): an API server and its engine-
core child (a unix socket, a /dev/shm segment, a multiprocessing semaphore mapped after its unlink, the
listening port, the engine core's GPU record) driven through the stand-in GpuCheckpoint.

Captured while serving (the dump ends the tree, which is restored at once from the image and serves), the
tree killed with SIGKILL, restored again with its own pids: it serves the same greedy ids, without booting
again; with its old host pid taken the restore fails with CRIU's reason. A `--leave-running` dump cannot be
restored later (CRIU deletes its link-remap file), as on real vLLM. Each failure leaves things clean with
its reason: the GPU checkpoint failing (FAKE_VLLM_GPU_CHECKPOINT_FAIL), corrupt and truncated images.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.doctor import read_criu
from dankserve.host.gpu_processes import held_bytes, process_tree
from dankserve.processes import spawn_detached
from dankserve.snapshot import criu, shm
from dankserve.snapshot.capture import capture, outage_seconds
from dankserve.snapshot.criu import criu_path
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
from dankserve.snapshot.restore import restore
from dankserve.snapshot.steps import Hooks, Outcome, StepFailed, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import canary_ids
from dankserve.supervisor.probes.sleep_mode import sleep_server, wake_server
from tests.containers.test_fake_vllm import free_port
from tests.harness.pids import adopting_orphans, take_pid
from tests.harness.wait import wait_until
from tests.test_snapshot_criu import damage_images

_reading = read_criu(criu_path())
pytestmark = pytest.mark.skipif(
    _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
    reason="needs root and a working CRIU >= 4.2 (make system-deps)",
)
ROOT = Path(__file__).resolve().parents[1]
STAND_IN = ROOT / "containers" / "fake-vllm" / "vllm.py"
MODEL = "stand-in/model"
READY = b"Application startup complete."


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    """The API server as started (this process's child)."""
    root: int
    """The tree's root: the API server (a restored tree's has the same pid)."""
    port: int
    records: Path
    log: Path

    @property
    def address(self) -> TcpAddress:
        return TcpAddress("127.0.0.1", self.port)

    def hooks(self) -> Hooks:
        def sleep() -> None:
            answer = sleep_server(self.address, None, "2")
            if not isinstance(answer, m.FellAsleep):
                raise StepFailed(str(answer))

        def wake() -> None:
            answer = wake_server(self.address, None, "2")
            if not isinstance(answer, m.WokeUp):
                raise StepFailed(str(answer))

        def canary() -> tuple[int, ...]:
            ids = canary_ids(self.address, None, MODEL)
            if isinstance(ids, str):
                raise StepFailed(ids)
            return ids

        return Hooks(sleep=sleep, wake=wake, canary=canary)


@pytest.fixture(autouse=True)
def _one_dump_at_a_time() -> Iterator[None]:
    """These tests call capture and restore directly: they take the host's turn as the daemon does
    (shm.turn), or two at once (pytest-xdist workers, a daemon test beside) meet each other's link-remap
    files in /dev/shm ("Can't link remap ...: File exists")."""
    with shm.turn():
        yield


@pytest.fixture(autouse=True)
def _subreaper() -> Iterator[None]:
    """Orphans of the stand-in (a restored tree's root, a killed server's engine core) come to this process,
    which reaps them, as the process runtime does. Only for this test: a pytest worker left a subreaper would
    collect every later test's orphans as zombies it never reaps, their pids never free."""
    with adopting_orphans():
        yield


def _start(tmp_path: Path, **knobs: str) -> Server:
    port = free_port()
    records = tmp_path / "host.json.processes"
    records.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "FAKE_VLLM_NVML_DIR": str(records),
        "FAKE_VLLM_BOOT_SECONDS": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "NO_COLOR": "1",
        **knobs,
    }
    log = tmp_path / "server.log"
    argv = [sys.executable, str(STAND_IN), "serve", MODEL, "--port", str(port), "--enable-sleep-mode"]
    proc = spawn_detached(argv, log, env=env)
    root = proc.pid

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        return READY in log.read_bytes()

    wait_until(ready, 30, 0.05, what=lambda: f"the stand-in's ready line: {log.read_text()}")
    return Server(proc, root, port, records, log)


def _kill(server: Server, pid: int | None = None) -> None:
    kill_tree(pid or server.root)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = _start(tmp_path)
    try:
        yield started
    finally:
        _kill(started)
        for kept in Path("/dev/shm").glob(f"fake-vllm-*-{started.root}"):
            if kept.stat().st_mtime > time.time() - 600:
                kept.unlink(missing_ok=True)


def _restore_args(server: Server, captured: Outcome, tree: tuple[int, ...]) -> dict[str, Any]:
    """`tree`: the captured tree's host pids, which the restore waits for and takes again."""
    args = {"holders": captured.holders, "expected_ids": captured.canary_ids, "appended": (server.log,)}
    return {**args, "pids": tree}


def _complete(server: Server) -> list[int]:
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 5, "return_token_ids": True}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return list(json.loads(answer.read())["choices"][0]["token_ids"])


class Kept:
    """What the lifecycle keeps beside the images (worker/snapshots.py): the tree's /dev/shm segments, taken
    asleep, and the link-remap files of its deleted ones the dump made; put back before each restore."""

    def __init__(self, server: Server, into: Path) -> None:
        self.tree = process_tree(server.root)
        self.deleted = shm.deleted_inodes(self.tree)
        self.into = into
        self.names: tuple[str, ...] = ()
        self.put: dict[str, int] = {}

    def segments(self) -> None:
        self.names = shm.save(shm.segments(self.tree), self.into)

    def after_dump(self, _ids: tuple[int, ...], _holders: tuple[int, ...]) -> None:
        self.names += shm.save(shm.link_remaps(self.deleted), self.into)
        self.put_back()

    def put_back(self) -> None:
        self.put = shm.put_back(self.names, self.into)

    def clear(self) -> None:
        shm.clear_remaps(self.put)


def _capture(server: Server, tmp_path: Path) -> tuple[StandInGpuCheckpoint, Path, Outcome, Kept, tuple[int, ...]]:
    gpu = StandInGpuCheckpoint(server.records)
    tree = tuple(process_tree(server.root))
    images = tmp_path / "images"
    images.mkdir()
    kept = Kept(server, tmp_path / "kept")
    plain = server.hooks()

    def sleep() -> None:  # asleep and idle: the segments as the dump finds the memory
        plain.sleep()
        kept.segments()

    hooks = Hooks(sleep=sleep, wake=plain.wake, canary=plain.canary)
    captured = capture(server.root, images, gpu, hooks, after_dump=kept.after_dump, appended=(server.log,))
    kept.clear()
    assert captured.ok, captured.reason
    assert captured.pid is not None
    server.root = captured.pid
    return gpu, images, captured, kept, tree


def _started_at(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def test_the_stand_in_has_vllm_s_process_shape(server: Server) -> None:
    tree = process_tree(server.root)
    assert len(tree) == 2, "an API server and its engine core"
    gpu = StandInGpuCheckpoint(server.records)
    assert gpu.holders(tree) == [tree[1]], "the engine core holds the GPU"
    assert list(Path("/dev/shm").glob(f"fake-vllm-*-{server.root}")), "the shared segment (named by the API server)"
    assert shm.deleted_inodes(tree[0:1]), "a multiprocessing semaphore: mapped, already unlinked"
    engine_bytes = held_bytes([tree[1]], ["GPU-0"], server.records)
    assert engine_bytes is not None and engine_bytes["GPU-0"] > 0
    assert held_bytes(tree, ["GPU-0"], server.records) == engine_bytes, "the API server holds none"
    assert _complete(server) == [100, 101, 102, 103, 104], "completions go through the engine core"


def test_a_dump_that_leaves_the_server_running_cannot_be_restored_later(server: Server, tmp_path: Path) -> None:
    """vLLM's shape (docs/hardware/h200x1-snapshot, lesson 5): CRIU deletes the link-remap file of the
    semaphore after a `--leave-running` dump, so a restore of that image after a kill -9 fails."""
    images = tmp_path / "images"
    images.mkdir()
    criu.dump(server.root, images, leave_running=True)
    assert _complete(server) == [100, 101, 102, 103, 104], "left running"
    _kill(server)
    with pytest.raises(criu.CriuFailed, match="link_remap"):
        kill_tree(criu.restore(images, appended=(server.log,)))  # reached only by a restore that worked


def test_capture_restores_at_once_then_kill_then_restore_serves_the_same_ids(server: Server, tmp_path: Path) -> None:
    before, started = server.root, _started_at(server.root)
    engine = process_tree(server.root)[1]
    awake = held_bytes([engine], ["GPU-0"], server.records)
    booted = server.log.read_bytes().count(READY)
    gpu, images, captured, kept, tree = _capture(server, tmp_path)
    assert captured.holders == (engine,), "the engine core by its pid (its own again once restored)"
    assert any(shm.is_link_remap(n) for n in kept.names), "CRIU's link-remap of the semaphore, kept"
    assert server.root == before and _started_at(before) != started, "the dump ended the tree: restored, same pids"
    engine = process_tree(server.root)[1]
    assert list(captured.canary_ids[:5]) == _complete(server), "serving from the image"
    assert gpu.state(engine) == "running"
    assert held_bytes([engine], ["GPU-0"], server.records) == awake, "woken: its memory back"
    steps = set(captured.timings)
    assert {"sleep", "gpu_lock", "gpu_checkpoint", "criu_dump", "criu_restore", "gpu_restore", "wake"} <= steps
    assert outage_seconds(captured) > 0

    for _ in range(2):  # every later restore: the kept files put back
        _kill(server)
        kept.put_back()
        restored = restore(images, gpu, server.hooks(), **_restore_args(server, captured, tree))
        kept.clear()
        assert restored.ok, restored.reason
        assert restored.pid == tree[0]
        server.root = restored.pid
        assert process_tree(restored.pid) == list(tree) and tree[1] in restored.holders
        assert restored.canary_ids == captured.canary_ids
        assert _complete(server) == [100, 101, 102, 103, 104]
        assert server.log.read_bytes().count(READY) == booted, "a restored server does not boot again"


def test_a_failing_gpu_checkpoint_leaves_the_server_serving_with_the_reason(tmp_path: Path) -> None:
    server = _start(tmp_path, FAKE_VLLM_GPU_CHECKPOINT_FAIL="1")
    try:
        gpu = StandInGpuCheckpoint(server.records)
        images = tmp_path / "images"
        images.mkdir()
        outcome = capture(server.root, images, gpu, server.hooks())
        assert not outcome.ok and not outcome.server_lost
        assert outcome.failure is not None and outcome.failure.step.name == "gpu_checkpoint"
        assert "CUDA_ERROR_NOT_SUPPORTED" in (outcome.reason or "") and not outcome.undo_problems
        assert list(images.iterdir()) == [], "nothing of the capture is kept"
        engine = process_tree(server.root)[1]
        assert gpu.state(engine) == "running", "unlocked again"
        assert _complete(server) == [100, 101, 102, 103, 104], "woken and serving"
    finally:
        _kill(server)


def test_a_failing_restore_after_the_dump_says_the_server_is_lost(server: Server, tmp_path: Path) -> None:
    """The files the image refers to not kept (the semaphore's link-remap deleted): the tree ended at the
    dump, the restore fails, nothing serves, the outcome says so."""
    gpu = StandInGpuCheckpoint(server.records)
    images = tmp_path / "images"
    images.mkdir()
    deleted = shm.deleted_inodes(process_tree(server.root))

    def lose_remaps(_ids: tuple[int, ...], _holders: tuple[int, ...]) -> None:
        for name in shm.link_remaps(deleted):
            (Path("/dev/shm") / name).unlink()

    outcome = capture(server.root, images, gpu, server.hooks(), after_dump=lose_remaps, appended=(server.log,))
    assert not outcome.ok and outcome.server_lost
    assert outcome.failure is not None and outcome.failure.step.name == "criu_restore"
    assert (outcome.reason or "").startswith("capture failed at criu_restore")
    state = (
        Path(f"/proc/{server.root}/stat").read_text().rpartition(")")[2].split()[0]
        if Path(f"/proc/{server.root}").exists()
        else "gone"
    )
    assert state in ("gone", "Z"), "nothing serves"


def _captured_then_killed(
    server: Server, tmp_path: Path
) -> tuple[StandInGpuCheckpoint, Path, Outcome, Kept, tuple[int, ...]]:
    gpu, images, captured, kept, tree = _capture(server, tmp_path)
    _kill(server)
    kept.put_back()
    return gpu, images, captured, kept, tree


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_snapshot_fails_the_restore_cleanly(server: Server, tmp_path: Path, damage: str) -> None:
    gpu, images, captured, kept, tree = _captured_then_killed(server, tmp_path)
    damage_images(images, damage)
    outcome = restore(images, gpu, server.hooks(), **_restore_args(server, captured, tree))
    kept.clear()
    assert not any(Path("/dev/shm", name).exists() for name in kept.put), "what CRIU did not consume, deleted"
    _kill(server, outcome.pid)
    assert not outcome.ok and outcome.failure is not None
    assert outcome.failure.step.name == "criu_restore" and "criu restore failed" in (outcome.reason or "")
    assert outcome.pid is None or not Path(f"/proc/{outcome.pid}").exists()


def test_a_taken_host_pid_fails_the_restore_with_crius_reason(server: Server, tmp_path: Path) -> None:
    """The tree is restored with its own host pids: one another process took meanwhile fails `criu restore`
    (at once: no wait for a stranger) with CRIU's reason, the holder untouched; the lifecycle then discards
    the snapshot and boots normally (tests/supervisor/test_daemon_snapshots.py)."""
    gpu, images, captured, kept, tree = _captured_then_killed(server, tmp_path)
    gone = server.root
    wait_until(lambda: not Path(f"/proc/{gone}").exists(), 10, 0.02, what=f"the killed server's pid {gone} freed")
    taker = take_pid(gone)
    if taker is None:
        pytest.skip("another process took the pid first (a busy host)")
    try:
        began = time.monotonic()
        outcome = restore(images, gpu, server.hooks(), **_restore_args(server, captured, tree))
        kept.clear()
        assert not outcome.ok and outcome.failure is not None
        assert outcome.failure.step.name == "criu_restore" and "criu restore failed" in (outcome.reason or "")
        assert time.monotonic() - began < 9, "a stranger holding the pid is not waited for"
        assert taker.poll() is None, "the process holding the pid is untouched"
    finally:
        taker.send_signal(signal.SIGKILL)
        taker.wait()


def _capture_into(server: Server, images: Path, max_bytes: int | None) -> tuple[StandInGpuCheckpoint, Outcome]:
    gpu = StandInGpuCheckpoint(server.records)
    images.mkdir()
    return gpu, capture(server.root, images, gpu, server.hooks(), max_bytes=max_bytes)


def _undone_and_serving(server: Server, gpu: StandInGpuCheckpoint, outcome: Outcome, images: Path) -> None:
    assert not outcome.ok and not outcome.server_lost and not outcome.undo_problems
    assert gpu.state(process_tree(server.root)[1]) == "running", "GPU restored and unlocked again"
    assert _complete(server) == [100, 101, 102, 103, 104], "woken and serving"
    assert [p.name for p in images.iterdir() if p.name != "dump.log"] == [], "no image kept"


def test_an_image_over_the_budget_fails_before_criu_writes_and_serves_on(server: Server, tmp_path: Path) -> None:
    """Found on an H100: a capture without sleep mode checkpointed 74 GB of GPU memory into the tree and CRIU
    wrote until the disk was full. The image's size is now estimated after the GPU checkpoint, first."""
    images = tmp_path / "images"
    gpu, outcome = _capture_into(server, images, 2**20)
    assert outcome.failure is not None and outcome.failure.step.name == "room", outcome.reason
    assert "capture failed at room: the image would take about" in (outcome.reason or "")
    assert "over snapshot_max_bytes (0.0 GiB); nothing was written" in (outcome.reason or "")
    assert "criu_dump" not in outcome.timings, "CRIU never ran"
    assert list(images.iterdir()) == []
    _undone_and_serving(server, gpu, outcome, images)


def test_an_image_over_the_free_space_fails_before_criu_writes(server: Server, tmp_path: Path) -> None:
    """The store on an 8 MiB file system (the stand-in's image is about 30 MB): refused by the estimate."""
    from tests.harness.faults import small_snapshot_store

    with small_snapshot_store(tmp_path) as store_dir:
        images = store_dir / "images"
        gpu, outcome = _capture_into(server, images, 2**40)
        assert outcome.failure is not None and outcome.failure.step.name == "room", outcome.reason
        assert "but the snapshot store's filesystem has 0.0 GiB free and 2.0 GiB stay free" in (outcome.reason or "")
        _undone_and_serving(server, gpu, outcome, images)


def test_a_dump_that_still_runs_out_of_space_is_undone(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate can be wrong, or another writer fill the disk during the dump: CRIU's own "No space left"
    fails the capture at the dump, undone, as before the estimate (the estimate bypassed at its one seam)."""
    from dankserve.snapshot import room
    from tests.harness.faults import small_snapshot_store

    monkeypatch.setattr(room, "shortfall", lambda *_args: None)
    with small_snapshot_store(tmp_path) as store_dir:
        images = store_dir / "images"
        gpu, outcome = _capture_into(server, images, None)
        assert outcome.failure is not None and outcome.failure.step.name == "criu_dump", outcome.reason
        assert "space" in (outcome.reason or "").lower()
        _undone_and_serving(server, gpu, outcome, images)
