"""The process runtime's server as the init of its own PID namespace (issue 41; runtime/pid_init.py), with
real child processes: the record names the init (what CRIU dumps), the server runs as pid 2 inside; stop's
SIGINT reaches the whole tree once, its grace period and SIGKILL hold, exit codes and signals come back as
the server's own, a restarted runtime finds and stops it, logs read as before."""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path

import pytest

from dankserve.host.gpu_processes import process_tree
from dankserve.processes import inner_pid, is_namespace_init, namespace_pids
from dankserve.runtime.base import WorkloadSpec
from dankserve.runtime.process import ProcessRuntime
from tests.runtime.test_process import _runtime, _spec, _wait_for, write_server

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a PID namespace needs root")


@pytest.fixture
def fake_vllm(tmp_path: Path) -> str:
    return write_server(tmp_path)


def _in_namespace(tmp_path: Path, executable: str, **env: str) -> WorkloadSpec:
    return dataclasses.replace(_spec(tmp_path, executable, **env), pid_namespace=True)


def _started(runtime: ProcessRuntime, spec: WorkloadSpec) -> tuple[str, int]:
    workload = runtime.start(spec)
    assert workload.pid is not None
    _wait_for(lambda: len(list(runtime.logs(workload.id))) >= 4 and len(process_tree(workload.pid or 0)) == 3)
    return workload.id, workload.pid


def test_the_record_names_the_namespace_s_init_and_the_server_is_pid_2_inside(tmp_path: Path, fake_vllm: str) -> None:
    runtime = _runtime(tmp_path)
    wid, pid = _started(runtime, _in_namespace(tmp_path, fake_vllm))
    try:
        assert is_namespace_init(pid) and wid == f"process-chat-{pid}"
        assert [inner_pid(p) for p in process_tree(pid)] == [1, 2, 3], "init, server, its child"
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "dankserve-init"
        lines = list(runtime.logs(wid))
        assert lines[0] == "argv serve org/model --max-model-len 4096 --host 127.0.0.1 --port 18000"
        assert runtime.find("chat") is not None and runtime.find("chat").running  # type: ignore[union-attr]
    finally:
        runtime.stop(wid, 5)
    assert "shutting down" in list(runtime.logs(wid)), "the stop's SIGINT reached the server"
    event = runtime.wait(wid, timeout=5)
    assert event is not None and event.exit_code == 0
    runtime.remove(wid)


def test_stop_kills_the_whole_namespace_after_its_grace_period(tmp_path: Path, fake_vllm: str) -> None:
    runtime = _runtime(tmp_path)
    wid, pid = _started(runtime, _in_namespace(tmp_path, fake_vllm, MODE="ignore-int"))
    tree = process_tree(pid)
    runtime.stop(wid, 0.5)
    _wait_for(lambda: not any(namespace_pids(p) for p in tree))
    assert not runtime.inspect(wid).running  # type: ignore[union-attr]
    runtime.remove(wid)


def test_exit_codes_and_signals_are_the_server_s(tmp_path: Path, fake_vllm: str) -> None:
    runtime = _runtime(tmp_path)
    workload = runtime.start(_in_namespace(tmp_path, fake_vllm, MODE="crash"))
    event = runtime.wait(workload.id, timeout=10)
    assert event is not None and event.exit_code == 3
    runtime.remove(workload.id)
    wid, pid = _started(runtime, _in_namespace(tmp_path, fake_vllm))
    server = process_tree(pid)[1]
    os.kill(server, signal.SIGKILL)  # the OOM killer's choice: the server, not the init
    event = runtime.wait(wid, timeout=10)
    assert event is not None and event.exit_code == -signal.SIGKILL and not event.oom_killed
    assert not any(namespace_pids(p) for p in process_tree(pid)), "the namespace ended with its init"
    runtime.remove(wid)


def test_a_kill_9_of_the_recorded_pid_ends_the_whole_server(tmp_path: Path, fake_vllm: str) -> None:
    runtime = _runtime(tmp_path)
    wid, pid = _started(runtime, _in_namespace(tmp_path, fake_vllm))
    tree = process_tree(pid)
    os.kill(pid, signal.SIGKILL)
    event = runtime.wait(wid, timeout=10)
    assert event is not None and event.exit_code == -signal.SIGKILL
    _wait_for(lambda: not any(namespace_pids(p) for p in tree))
    runtime.remove(wid)


def test_a_restarted_runtime_finds_the_init_and_stops_the_server(tmp_path: Path, fake_vllm: str) -> None:
    first = _runtime(tmp_path)
    wid, pid = _started(first, _in_namespace(tmp_path, fake_vllm))
    second = _runtime(tmp_path)
    found = second.find("chat")
    assert found is not None and found.running and found.pid == pid
    second.stop(found.id, 5)
    _wait_for(lambda: not second.inspect(found.id).running)  # type: ignore[union-attr]
    assert "shutting down" in list(second.logs(found.id))
    second.remove(found.id)
    first.wait(wid, timeout=1)
