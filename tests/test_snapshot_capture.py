"""Capture and restore (dankserve/snapshot/capture.py, restore.py) against the real CRIU and the real
stand-in vLLM run as a process: an API server and its engine-core child (a unix socket, a /dev/shm
segment, the listening port, the engine core's GPU record) driven through the stand-in GpuCheckpoint.

Captured while serving, the tree killed with SIGKILL, restored: it serves again with the same greedy
ids, without booting again. Each failure leaves things clean with its reason: the GPU checkpoint
failing (FAKE_VLLM_GPU_CHECKPOINT_FAIL), corrupt and truncated images, a pid taken by another process.
"""

from __future__ import annotations

import contextlib
import ctypes
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
from dankserve.snapshot.capture import capture, outage_seconds
from dankserve.snapshot.criu import criu_path
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
from dankserve.snapshot.restore import restore
from dankserve.snapshot.steps import Hooks, Outcome, StepFailed, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import canary_ids
from dankserve.supervisor.probes.sleep_mode import sleep_server, wake_server
from tests.containers.test_fake_vllm import free_port
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
def _subreaper() -> None:
    """Orphans of the stand-in (a restored tree's root, the engine core of a killed one) come to this
    process, which reaps them so their pids are free for a restore."""
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


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
    end = time.monotonic() + 30
    while READY not in log.read_bytes():
        assert proc.poll() is None and time.monotonic() < end, log.read_text()
        time.sleep(0.05)
    return Server(proc, port, records, log)


def _kill(server: Server, pid: int | None = None) -> None:
    kill_tree(pid or server.proc.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(5)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = _start(tmp_path)
    try:
        yield started
    finally:
        _kill(started)
        for shm in Path("/dev/shm").glob(f"fake-vllm-*-{started.proc.pid}"):
            shm.unlink(missing_ok=True)


def _restore_args(server: Server, captured: Outcome) -> dict[str, Any]:
    return {"holders": captured.holders, "expected_ids": captured.canary_ids, "appended": (server.log,)}


def _complete(server: Server) -> list[int]:
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 5, "return_token_ids": True}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return list(json.loads(answer.read())["choices"][0]["token_ids"])


def test_the_stand_in_has_vllm_s_process_shape(server: Server) -> None:
    tree = process_tree(server.proc.pid)
    assert len(tree) == 2, "an API server and its engine core"
    gpu = StandInGpuCheckpoint(server.records)
    assert gpu.holders(tree) == [tree[1]], "the engine core holds the GPU"
    assert list(Path("/dev/shm").glob(f"fake-vllm-*-{server.proc.pid}")), "the shared segment"
    engine_bytes = held_bytes([tree[1]], ["GPU-0"], server.records)
    assert engine_bytes is not None and engine_bytes["GPU-0"] > 0
    assert held_bytes(tree, ["GPU-0"], server.records) == engine_bytes, "the API server holds none"
    assert _complete(server) == [100, 101, 102, 103, 104], "completions go through the engine core"


def test_capture_then_kill_then_restore_serves_the_same_ids_without_booting(server: Server, tmp_path: Path) -> None:
    gpu = StandInGpuCheckpoint(server.records)
    images = tmp_path / "images"
    images.mkdir()
    engine = process_tree(server.proc.pid)[1]
    awake = held_bytes([engine], ["GPU-0"], server.records)
    captured = capture(server.proc.pid, images, gpu, server.hooks())
    assert captured.ok, captured.reason
    assert captured.holders == (engine,)
    assert captured.canary_ids and list(captured.canary_ids[:5]) == _complete(server), "still serving"
    assert gpu.state(engine) == "running"
    assert held_bytes([engine], ["GPU-0"], server.records) == awake, "woken: its memory back"
    steps = set(captured.timings)
    assert {"sleep", "gpu_lock", "gpu_checkpoint", "criu_dump", "gpu_restore", "gpu_unlock", "wake"} <= steps
    assert outage_seconds(captured) > 0
    booted = server.log.read_bytes().count(READY)

    _kill(server)
    restored = restore(images, gpu, server.hooks(), **_restore_args(server, captured))
    try:
        assert restored.ok, restored.reason
        assert restored.pid == server.proc.pid
        assert process_tree(restored.pid) == [server.proc.pid, engine]
        assert restored.canary_ids == captured.canary_ids
        assert {"criu_restore", "gpu_restore", "gpu_unlock", "wake", "canary"} <= set(restored.timings)
        assert gpu.state(engine) == "running"
        assert _complete(server) == [100, 101, 102, 103, 104]
        assert server.log.read_bytes().count(READY) == booted, "a restored server does not boot again"
    finally:
        _kill(server, restored.pid)


def test_a_failing_gpu_checkpoint_leaves_the_server_serving_with_the_reason(tmp_path: Path) -> None:
    server = _start(tmp_path, FAKE_VLLM_GPU_CHECKPOINT_FAIL="1")
    try:
        gpu = StandInGpuCheckpoint(server.records)
        images = tmp_path / "images"
        images.mkdir()
        outcome = capture(server.proc.pid, images, gpu, server.hooks())
        assert not outcome.ok
        assert outcome.failure is not None and outcome.failure.step.name == "gpu_checkpoint"
        assert "CUDA_ERROR_NOT_SUPPORTED" in (outcome.reason or "") and not outcome.undo_problems
        assert list(images.iterdir()) == [], "nothing of the capture is kept"
        engine = process_tree(server.proc.pid)[1]
        assert gpu.state(engine) == "running", "unlocked again"
        assert _complete(server) == [100, 101, 102, 103, 104], "woken and serving"
    finally:
        _kill(server)


def _captured_then_killed(server: Server, tmp_path: Path) -> tuple[StandInGpuCheckpoint, Path, Outcome]:
    gpu = StandInGpuCheckpoint(server.records)
    images = tmp_path / "images"
    images.mkdir()
    captured = capture(server.proc.pid, images, gpu, server.hooks())
    assert captured.ok, captured.reason
    _kill(server)
    return gpu, images, captured


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_snapshot_fails_the_restore_cleanly(server: Server, tmp_path: Path, damage: str) -> None:
    gpu, images, captured = _captured_then_killed(server, tmp_path)
    damage_images(images, damage)
    outcome = restore(images, gpu, server.hooks(), **_restore_args(server, captured))
    _kill(server, outcome.pid)
    assert not outcome.ok and outcome.failure is not None
    assert outcome.failure.step.name == "criu_restore" and "criu restore failed" in (outcome.reason or "")
    assert not any(Path(f"/proc/{pid}").exists() for pid in (server.proc.pid, *captured.holders))


def _take_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A process with exactly this pid (ns_last_pid as CRIU itself sets it), or None after some tries."""
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        taker = subprocess.Popen(["sleep", "60"])
        if taker.pid == pid:
            return taker
        taker.kill()
        taker.wait()
    return None


def test_a_taken_pid_fails_the_restore_and_leaves_the_taker_alone(server: Server, tmp_path: Path) -> None:
    gpu, images, captured = _captured_then_killed(server, tmp_path)
    taker = _take_pid(captured.holders[0])
    if taker is None:
        pytest.skip("another process took the pid first (a busy host)")
    try:
        outcome = restore(images, gpu, server.hooks(), **_restore_args(server, captured))
        _kill(server, outcome.pid)
        assert not outcome.ok and outcome.failure is not None
        assert outcome.failure.step.name == "criu_restore"
        assert f"pid {captured.holders[0]} is taken by another process" in (outcome.reason or "")
        assert taker.poll() is None, "the process holding the pid is untouched"
    finally:
        taker.send_signal(signal.SIGKILL)
        taker.wait()
