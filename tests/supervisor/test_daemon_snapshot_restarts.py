"""Restarts through a restore (issue 41) through a real daemon on the process runtime, real CRIU and the stand-in
vLLM: a swap member asleep by stop (`sleep_level = "stop"`: no sleep mode) is booted again on wake, and with a
valid snapshot that boot is a restore (boot kind `restore`, the same greedy ids, no second boot in its log); a
vLLM 0.34 server is captured through `/checkpoint/prepare` and served again by `/checkpoint/restore` instead of
a level-2 sleep and wake; an upgrade's rollback boots the old image through the snapshot kept aside for it.

The rollback test here keeps the process runtime and stands the image change in by the executable's identity
(its modification time, which is its digest: `runtime.process.executable_digest`) with the upgrade's record
written into state.json, as a switch leaves it; `dankserve rollback` then runs for real. On Podman itself, with a
real `dankserve upgrade` between two images: tests/supervisor/test_snapshot_rollback_podman.py."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import httpx

from dankserve.host.gpu_processes import process_tree
from tests.harness.daemon import (
    STAND_IN,
    RunningDaemon,
    free_port,
    process_deployment,
    running_daemon,
    write_host,
)
from tests.harness.pids import adopting_orphans, reap_gone
from tests.supervisor.test_daemon_snapshots import READY, pytestmark

__all__ = ["pytestmark"]  # root, a working CRIU >= 4.2, slow: as the other snapshot daemon tests


def _member(host: Path, port: int, model: str) -> dict[str, Any]:
    env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
    return process_deployment(
        port,
        gpus=[0],
        listen="tcp",
        snapshot="auto",
        env=env,
        served_model_name=model,
        swap_group="g",
        sleep_level="stop",
        gpu_memory_utilization=0.9,
    )


def _ids(url: str, model: str) -> list[int]:
    body = {"model": model, "prompt": "x", "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


def _boots_in_log(daemon: RunningDaemon, name: str) -> int:
    return (daemon.state_dir / "processes" / f"{name}.log").read_text(errors="replace").count(READY)


def _ready_captured(daemon: RunningDaemon, name: str) -> dict[str, Any]:
    return daemon.wait_for(name, lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=90)


def test_a_member_asleep_by_stop_is_woken_by_a_restore_serving_the_same_ids(tmp_path: Path) -> None:
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    host = write_host(tmp_path / "host.json")
    deployments = {"a": _member(host, free_port(), "ma"), "b": _member(host, free_port(), "mb")}
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        _ready_captured(daemon, "a")
        ids_a = _ids(url, "ma")
        daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)

        ids_b = _ids(url, "mb")  # a stopped, b woken (by a restore or a first boot, then captured)
        _ready_captured(daemon, "b")
        asleep = daemon.wait_for("a", lambda d: d["state"] == "asleep", timeout=60)
        assert asleep["swap"]["level"] == "stop"
        booted_a = _boots_in_log(daemon, "a")

        assert _ids(url, "ma") == ids_a  # b stopped, a woken by its stop+boot: a restore
        woken = daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        assert (woken["last_boot"] or {}).get("kind") == "restore", woken["last_boot"]
        assert _boots_in_log(daemon, "a") == booted_a, "restored, not booted"
        assert woken["snapshot"]["last_restore_seconds"] > 0
        daemon.wait_for("b", lambda d: d["state"] == "asleep" and d["swap"]["level"] == "stop", timeout=60)

        booted_b = _boots_in_log(daemon, "b")
        assert _ids(url, "mb") == ids_b  # and b's next wake restores too
        woken_b = daemon.wait_for("b", lambda d: d["state"] == "ready", timeout=60)
        assert (woken_b["last_boot"] or {}).get("kind") == "restore", woken_b["last_boot"]
        assert _boots_in_log(daemon, "b") == booted_b
        wakes = [e for e in daemon.events_named("ready") if e.get("restored")]
        assert [e["deployment"] for e in wakes][-2:] == ["a", "b"]
        assert not daemon.events_named("snapshot_restore_failed")


def test_a_0_34_server_is_captured_through_checkpoint_prepare_and_restored(tmp_path: Path) -> None:
    """vLLM 0.34 with sleep mode (a swap member): the capture prepares the server (`/checkpoint/prepare`, no
    `/sleep`) and serves again through `/checkpoint/restore`; the manifest says so, and a kill -9 restores the
    prepared image, served again by `/checkpoint/restore`, with the same greedy ids."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    member = _member(host, port, "ma")
    member.update(sleep_level="auto", env={**member["env"], "FAKE_VLLM_VERSION": "0.34.0"})
    extra = {"vllm_version": "0.34.0"}
    with running_daemon(tmp_path, {"a": member}, hardware=host, extra_globals=extra) as daemon:
        _ready_captured(daemon, "a")
        url = f"http://127.0.0.1:{port}"
        ids = _ids(url, "ma")
        manifest = json.loads((daemon.state_dir / "snapshots" / "a" / "manifest.json").read_text())
        assert manifest["prepares"] is True and manifest["sleeps"] is True
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'operation_duration_seconds_count{operation="sleep"}' not in metrics, "prepared, not slept"
        assert httpx.get(f"{url}/checkpoint/status", timeout=10).json() == {"state": "running"}
        booted = _boots_in_log(daemon, "a")
        pid: int = json.loads((daemon.state_dir / "processes" / "a.json").read_text())["pid"]
        os.kill(pid, signal.SIGKILL)
        restored = daemon.wait_for(
            "a", lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore", timeout=60
        )
        assert restored["snapshot"]["last_restore_seconds"] > 0
        assert httpx.get(f"{url}/checkpoint/status", timeout=10).json() == {"state": "running"}
        assert _ids(url, "ma") == ids
        assert _boots_in_log(daemon, "a") == booted, "restored, not booted"
        assert not daemon.events_named("snapshot_restore_failed")


def _switched(state_dir: Path) -> None:
    """The upgrade's record as a switch leaves it (state.json is the daemon's, written while none runs)."""
    path = state_dir / "state.json"
    state = json.loads(path.read_text())
    state["deployments"]["chat"]["upgrade"] = {
        "step": "switched",
        "old_image": "example/vllm:old",
        "new_image": "example/vllm:new",
        "started_at": 1.0,
        "room": "stop",
    }
    path.write_text(json.dumps(state))


def _stopped_with_the_server(daemon: RunningDaemon) -> None:
    """The daemon killed, then its server's tree (its pids freed for a later restore: the orphans come to this
    test, which reaps them, whatever pid 1 does)."""
    pid: int = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["pid"]
    tree = process_tree(pid)
    with adopting_orphans():
        daemon.kill()
        os.killpg(pid, signal.SIGKILL)
        reap_gone(tree)


def _listed(daemon: RunningDaemon) -> dict[str, str]:
    listed = json.loads(daemon.cli("snapshot", "list", "--json").stdout)["snapshots"]
    return {e["deployment"]: e["state"] for e in listed}


def test_an_upgrades_rollback_restores_the_snapshot_kept_from_before_the_switch(tmp_path: Path) -> None:
    """Captured on the old image; the switched upgrade's new image plans the deployment: the old snapshot is
    kept as chat@previous (listed, not deleted as invalid), the new image boots and is captured; `dankserve
    rollback` boots the old image again through a restore of the kept snapshot (boot kind `restore`, the same
    greedy ids), which becomes chat again while the new image's is deleted."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    executable = tmp_path / "vllm"
    executable.write_text(f'#!/bin/sh\nexec {sys.executable} {STAND_IN} "$@"\n')
    executable.chmod(0o755)
    old, new = (1_700_000_000, 1_700_000_000), (1_700_000_100, 1_700_000_100)
    os.utime(executable, old)
    env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
    dep = process_deployment(port, gpus=[0], listen="tcp", snapshot="auto", env=env, executable=str(executable))
    url = f"http://127.0.0.1:{port}"
    with running_daemon(tmp_path, {"chat": dep}, hardware=host) as daemon:
        _ready_captured(daemon, "chat")
        ids = _ids(url, "test/tiny")
        _stopped_with_the_server(daemon)
    _switched(tmp_path / "state")
    os.utime(executable, new)  # the new image
    with running_daemon(tmp_path, {"chat": dep}, hardware=host) as daemon:
        _ready_captured(daemon, "chat")
        (kept,) = daemon.events_named("snapshot_kept_for_rollback")
        assert kept["kept"] == "chat@previous" and "image" in kept["reason"]
        assert not daemon.events_named("snapshot_discarded")
        assert _listed(daemon) == {"chat": "ready", "chat@previous": "ready"}
        assert (daemon.deployment("chat") or {})["last_boot"]["kind"] != "restore"
        boots = (daemon.deployment("chat") or {})["boots"]

        os.utime(executable, old)  # what the rollback boots: the old image
        done = daemon.cli("rollback", "chat")
        assert done.returncode == 0, done.stdout + done.stderr
        restored = daemon.wait_for(
            "chat",
            lambda d: d["state"] == "ready" and d["boots"] > boots and (d["last_boot"] or {}).get("kind") == "restore",
            timeout=90,
        )
        assert restored["snapshot"]["state"] == "ready"
        assert _ids(url, "test/tiny") == ids
        assert daemon.events_named("snapshot_taken_back")
        assert _listed(daemon) == {"chat": "ready"}, "the new image's snapshot deleted, the kept one is chat again"
        assert not daemon.events_named("snapshot_restore_failed")
