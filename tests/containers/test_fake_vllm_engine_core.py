"""The stand-in's process shape (containers/fake-vllm/fake_vllm/engine_core.py): the engine-core child holds
the GPU record, answers the checkpoint actions (a locked engine's completions wait), dies with its API
server, and is torn down with it on SIGTERM; hostile request files change nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.host.gpu_processes import process_tree, read_stand_in_record, stand_in_record_path
from dankserve.snapshot.gpu import GpuCheckpointError, GpuProcessNotFound, GpuWrongState
from dankserve.snapshot.gpu_helper import IsolatedGpuCheckpoint
from dankserve.snapshot.gpu_stand_in import ACTION_SIGNAL, StandInGpuCheckpoint
from tests.containers.test_fake_vllm import PROGRAM, base_env, free_port
from tests.harness.wait import wait_until

sys.path.insert(0, str(PROGRAM.parent))
from fake_vllm.knobs import KnobError, parse_knobs
from fake_vllm.nvml_record import write_record

MODEL = "stand-in/model"


def test_the_checkpoint_failure_knob_takes_a_cuda_error() -> None:
    assert parse_knobs({}).gpu_checkpoint_fail == 0
    assert parse_knobs({"FAKE_VLLM_GPU_CHECKPOINT_FAIL": "1"}).gpu_checkpoint_fail == 801
    assert parse_knobs({"FAKE_VLLM_GPU_CHECKPOINT_FAIL": "2"}).gpu_checkpoint_fail == 2
    assert parse_knobs({}).shm_dir == "/dev/shm"
    with pytest.raises(KnobError, match="FAKE_VLLM_GPU_CHECKPOINT_FAIL"):
        parse_knobs({"FAKE_VLLM_GPU_CHECKPOINT_FAIL": "often"})


class Running:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, records: Path, shm: Path) -> None:
        self.proc, self.port, self.records, self.shm = proc, port, records, shm

    @property
    def engine(self) -> int:
        return process_tree(self.proc.pid)[1]

    def complete(self) -> tuple[int, dict[str, object]]:
        body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 3, "return_token_ids": True}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions", body, {"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=20) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    port = free_port()
    records, shm = tmp_path / "records", tmp_path / "shm"
    records.mkdir()
    shm.mkdir()
    env = base_env(tmp_path, FAKE_VLLM_NVML_DIR=str(records), FAKE_VLLM_SHM_DIR=str(shm))
    proc = subprocess.Popen(
        [sys.executable, str(PROGRAM), "serve", MODEL, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def recorded() -> list[Path]:
        assert proc.poll() is None, "the stand-in exited before writing its GPU record"
        return list(records.glob("*.json"))

    wait_until(recorded, 20, what="the stand-in's GPU record")

    def serving() -> bool:  # a SIGTERM before it serves ends the boot as vLLM's does (by SIGINT), not gracefully
        assert proc.poll() is None, "the stand-in exited before serving"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    wait_until(serving, 30, what="the stand-in serving")
    try:
        yield Running(proc, port, records, shm)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_locked_engine_core_holds_completions_until_it_is_unlocked(running: Running) -> None:
    gpu = StandInGpuCheckpoint(running.records)
    engine = running.engine
    gpu.lock(engine)
    answers: list[tuple[int, dict[str, object]]] = []
    waiting = threading.Thread(target=lambda: answers.append(running.complete()))
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not answers, "a locked process's CUDA calls block"
    with pytest.raises(GpuWrongState):
        gpu.restore(engine)  # not checkpointed
    gpu.checkpoint(engine)
    record = stand_in_record_path(running.records, engine)
    assert record is not None
    data = read_stand_in_record(record)
    assert data is not None and data["used_bytes"] == 0 and data["gpu_state"] == "checkpointed"
    gpu.restore(engine)
    gpu.unlock(engine)
    waiting.join(20)
    assert answers and answers[0][0] == 200
    data = read_stand_in_record(record)
    assert data is not None and data["used_bytes"] > 0 and data["gpu_state"] == "running"


def test_hostile_request_files_change_nothing(running: Running) -> None:
    engine = running.engine
    record = stand_in_record_path(running.records, engine)
    assert record is not None
    request = record.with_suffix(".request")
    for body in (b"\xff" * 10000, b"[1, 2]", json.dumps({"id": 5, "action": "lock"}).encode(), b'{"id": "x"}'):
        request.write_bytes(body)
        os.kill(engine, ACTION_SIGNAL)
    request.unlink()
    assert StandInGpuCheckpoint(running.records).state(engine) == "running"
    assert running.complete()[0] == 200


def test_the_engine_core_s_death_is_the_engine_s(running: Running) -> None:
    os.kill(running.engine, signal.SIGKILL)
    status, body = running.complete()
    assert status == 500 and "error" in body
    with pytest.raises(urllib.error.HTTPError) as health:
        urllib.request.urlopen(f"http://127.0.0.1:{running.port}/health", timeout=5)
    assert health.value.code == 503


def test_sigterm_tears_down_the_engine_core_its_record_and_the_segment(running: Running) -> None:
    engine = running.engine
    assert list(running.shm.iterdir())
    running.proc.send_signal(signal.SIGTERM)
    assert running.proc.wait(20) == 0
    assert not list(running.records.glob("*.json")), "its GPU memory freed"
    assert not list(running.shm.iterdir())
    wait_until(lambda: _gone(engine), 10, what=f"the engine core (pid {engine}) gone or a zombie")


def _gone(pid: int) -> bool:
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True


def test_a_record_naming_another_process_is_never_signalled(tmp_path: Path) -> None:
    """A stale record whose pid now belongs to another process (here: this one, which SIGUSR2 would end)."""
    write_record(str(tmp_path), 123, gpu_state="running")
    gpu = StandInGpuCheckpoint(tmp_path)
    assert gpu.holders([os.getpid()]) == []
    with pytest.raises(GpuProcessNotFound):
        gpu.lock(os.getpid())


def test_the_helper_process_runs_the_actions_and_returns_typed_errors(running: Running) -> None:
    """IsolatedGpuCheckpoint (the driver's way: a helper process) over the stand-in's implementation."""
    gpu = IsolatedGpuCheckpoint(["--stand-in", str(running.records)], deadline_s=20)
    try:
        engine = running.engine
        assert gpu.holders(process_tree(running.proc.pid)) == [engine]
        gpu.lock(engine)
        with pytest.raises(GpuWrongState) as err:
            gpu.restore(engine)
        assert err.value.pid == engine and err.value.code == 401
        gpu.checkpoint(engine)
        assert gpu.state(engine) == "checkpointed"
        gpu.restore(engine)
        gpu.unlock(engine)
        assert gpu.state(engine) == "running" and gpu.restore_thread_id(engine) == engine
    finally:
        gpu.close()


def test_an_action_past_its_deadline_kills_the_helper_and_the_next_one_starts_afresh(running: Running) -> None:
    gpu = IsolatedGpuCheckpoint(["--stand-in", str(running.records)], deadline_s=1)
    engine = running.engine
    try:
        os.kill(engine, signal.SIGSTOP)  # a driver call that never returns
        with pytest.raises(GpuCheckpointError) as err:
            gpu.checkpoint(engine)
        assert "no answer in 1 s" in err.value.reason and err.value.remedy == "undo"
        os.kill(engine, signal.SIGCONT)
        assert gpu.state(engine) == "running"
    finally:
        os.kill(engine, signal.SIGCONT)
        gpu.close()
