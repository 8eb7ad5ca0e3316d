"""Tests for dankserve.supervisor.worker.launching: what a found launcher is to the next boot."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.launcher import protocol
from dankserve.runtime.base import (
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_LAUNCHER,
    LauncherSpec,
    Workload,
    WorkloadSpec,
    container_fingerprint,
)
from dankserve.supervisor.worker.launching import found_launcher

SERVER = {"id": 3, "pid": 42, "mode": "fork", "mode_reason": "", "fingerprint": "plan-1", "exited": False}


def _spec(run_dir: Path) -> WorkloadSpec:
    return WorkloadSpec(
        deployment="chat",
        image="vllm/vllm-openai:v0.33.0",
        argv=("org/model",),
        env={},
        port=18000,
        launcher=LauncherSpec(Path("/opt/dankserve/launcher"), run_dir),
    )


def _workload(spec: WorkloadSpec) -> Workload:
    labels = {LABEL_LAUNCHER: "true", LABEL_CONTAINER_FINGERPRINT: container_fingerprint(spec)}
    return Workload("c1", "dankserve-chat", "chat", "running", labels)


@pytest.fixture
def answering(tmp_path: Path) -> Iterator[dict[str, object]]:
    """A socket in the run directory that answers every `status` with the dict the test fills in."""
    answer: dict[str, object] = {}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / protocol.SOCKET_NAME))
    listener.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(json.dumps({"ok": True, **answer}).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield answer
    listener.close()


def test_a_launcher_of_this_version_with_the_same_container_settings_is_reused(
    tmp_path: Path, answering: dict[str, object]
) -> None:
    """Same version, same container fingerprint: reusable, its running server adoptable by the same plan."""
    answering.update(version=protocol.VERSION, pid=7, server=SERVER)
    spec = _spec(tmp_path)
    found = found_launcher(_workload(spec), tmp_path, spec, "plan-1")
    assert found.launcher is not None and found.launcher.reusable
    assert found.launcher.server == 3 and found.launcher.server_running and found.same_plan


def test_an_older_dankserves_launcher_keeps_its_server_for_adoption_but_is_not_reused(
    tmp_path: Path, answering: dict[str, object]
) -> None:
    """A launcher that speaks another protocol version (left by an older dankserve): its server may be adopted,
    but the next boot gets a new launcher."""
    answering.update(version=protocol.VERSION - 1, pid=7, server=SERVER)
    spec = _spec(tmp_path)
    found = found_launcher(_workload(spec), tmp_path, spec, "plan-1")
    assert found.launcher is not None and not found.launcher.reusable
    assert found.launcher.server_running and found.same_plan


def test_a_launcher_that_does_not_answer_is_replaced(tmp_path: Path) -> None:
    """No socket: not the same plan and no launcher to reuse."""
    spec = _spec(tmp_path)
    found = found_launcher(_workload(spec), tmp_path, spec, "plan-1")
    assert found.launcher is None and not found.same_plan
