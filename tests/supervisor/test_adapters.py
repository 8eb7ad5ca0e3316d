"""Tests for dankserve.supervisor.worker.adapters: which reloads load and unload adapters in place, and the edge that
does it against the real stand-in server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dankserve.backend_address import TcpAddress
from dankserve.errors import ConfigError
from dankserve.settings import DeploymentSettings
from dankserve.supervisor.worker.adapters import AdapterChanges, apply, changes
from tests.harness.daemon import STAND_IN, free_port
from tests.harness.wait import wait_until

BASE = DeploymentSettings(model="org/base", runtime="process", adapters={"sql": "/srv/sql", "chat": "org/chat"})


def test_only_adapter_changes_are_applied_in_place() -> None:
    """Added and changed adapters load, removed and changed ones unload; anything else changed restarts."""
    new = BASE.model_copy(update={"adapters": {"chat": "org/chat-v2", "code": "org/code"}})
    assert changes(BASE, new) == AdapterChanges({"chat": "org/chat-v2", "code": "org/code"}, ("sql", "chat"))
    assert changes(BASE, BASE.model_copy(update={"adapters": {}})) == AdapterChanges({}, ("sql", "chat"))
    assert changes(BASE, new.model_copy(update={"max_num_seqs": 8})) is None


def test_lora_turned_on_or_a_new_local_directory_in_a_container_restarts() -> None:
    """No adapters before (no --enable-lora), or a local directory a container has no mount for: restart."""
    plain = BASE.model_copy(update={"adapters": {}})
    assert changes(plain, BASE) is None
    container = BASE.model_copy(update={"runtime": "podman"})
    assert changes(container, container.model_copy(update={"adapters": {**BASE.adapters, "new": "/srv/new"}})) is None
    hub_added = container.model_copy(update={"adapters": {**BASE.adapters, "new": "org/new"}})
    assert changes(container, hub_added) == AdapterChanges({"new": "org/new"}, ())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DeploymentSettings]:
    """The stand-in with LoRA and runtime updating, one adapter loaded at boot."""
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text(
        json.dumps({"r": 8, "lora_alpha": 8, "target_modules": ["q"]})
    )
    port = free_port()
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "FAKE_VLLM_TIME_SCALE": "0.01"}
    argv = [sys.executable, str(STAND_IN), "serve", "org/base", "--port", str(port), "--enable-lora"]
    argv += ["--max-lora-rank", "8", "--lora-modules", f"sql={tmp_path / 'sql'}"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def answers() -> bool:
            assert proc.poll() is None, "the stand-in exited"
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, 30, what="the stand-in's /health")
        yield BASE.model_copy(update={"port": port, "adapters": {"sql": str(tmp_path / "sql")}})
    finally:
        proc.terminate()
        proc.wait(10)


def served(dep: DeploymentSettings) -> list[str]:
    return [m["id"] for m in httpx.get(f"http://127.0.0.1:{dep.port}/v1/models").json()["data"]]


def test_apply_unloads_and_loads_on_the_running_server(server: DeploymentSettings, tmp_path: Path) -> None:
    """The edge posts vLLM's unload and load routes; the server then serves the new set."""
    sql = str(tmp_path / "sql")
    assert apply(
        TcpAddress(server.host, server.port), None, AdapterChanges({"again": sql}, ("sql",)), lambda: {"again": sql}
    )
    assert served(server) == ["org/base", "again"]


def test_apply_answers_false_when_the_server_refuses_or_a_path_is_missing(server: DeploymentSettings) -> None:
    """A load the server refuses (no such directory: 404), or an adapter not found before posting: False."""
    assert not apply(
        TcpAddress(server.host, server.port), None, AdapterChanges({"x": "/absent"}, ()), lambda: {"x": "/absent"}
    )

    def missing() -> dict[str, str]:
        raise ConfigError("adapter not in the HF cache", fix="pull it")

    assert not apply(TcpAddress(server.host, server.port), None, AdapterChanges({"x": "org/x"}, ()), missing)
    assert served(server) == ["org/base", "sql"]


def test_apply_answers_false_when_nothing_listens() -> None:
    """No server on the port: False (the reload restarts it instead)."""
    dep = BASE.model_copy(update={"port": free_port()})
    assert not apply(
        TcpAddress(dep.host, dep.port), None, AdapterChanges({"x": "/a"}, ()), lambda: {"x": "/a"}, timeout=2
    )
