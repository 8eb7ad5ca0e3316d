"""End to end: a group of dankserve daemons, each in its own network namespace, forming a real Ray
cluster (fake GPU resources) under the stand-in vLLM in leader mode; faults and recovery."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dankserve.cluster.ray_node import ray_executable, ray_temp_dir
from tests.harness import netns
from tests.harness.certs import HostCert, group_certs
from tests.harness.daemon import (
    Notifications,
    RunningDaemon,
    daemon_globals,
    free_port,
    process_deployment,
    write_config,
    write_host,
)
from tests.harness.wait import hold_for

TOKEN = "group-token-0123456789abcdef0123"
API_PORT = 7390
RAY_PORT = 6379

why_not = netns.available()
try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(why_not is not None, reason=why_not or ""),
    pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed (pip install -e '.[cluster]')"),
]


@dataclass
class NsDaemon(RunningDaemon):
    """A dankserve daemon started inside a network namespace."""

    ns: netns.NsHost | None = None

    def _argv(self) -> list[str]:
        assert self.ns is not None
        argv = [sys.executable, "-m", "dankserve", "--config", str(self.config), "run"]
        return self.ns.command([*argv, "--hardware", str(self.hardware), "--log-format", "json"])


def _spawn(daemon: NsDaemon) -> NsDaemon:
    import subprocess

    from tests.harness.daemon import REPO

    env = {**os.environ, "NOTIFY_SOCKET": str(daemon.notifications.path), "PYTHONUNBUFFERED": "1", **daemon.extra_env}
    env.pop("DANKSERVE_CONFIG", None)
    with daemon.log_path.open("ab") as out:
        daemon.proc = subprocess.Popen(daemon._argv(), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return daemon


def make_daemon(
    root: Path, ns: netns.NsHost, deployments: dict[str, Any], token: Path, certs: dict[str, HostCert]
) -> NsDaemon:
    root.mkdir(parents=True, exist_ok=True)
    cluster = {
        "listen": f"{ns.address}:{API_PORT}",
        "token_file": str(token),
        "ray_port": RAY_PORT,
        **certs[ns.address].settings(),
    }
    globals_ = daemon_globals(
        root, {"restart_backoff_initial_seconds": 0.5, "max_failures_in_window": 10, "cluster": cluster}
    )
    config = write_config(root / "dankserve.toml", globals_, deployments)
    notifications = Notifications(root / "notify.sock")
    notifications.start()
    # The stand-in (#!/usr/bin/env python3) must find the Python that has Ray.
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return NsDaemon(
        config,
        write_host(root / "host.json"),
        root / "state",
        root / "daemon.log",
        notifications,
        extra_env={"PATH": path},
        ns=ns,
    )


@dataclass
class Group:
    lab: netns.Lab
    leader: NsDaemon
    followers: list[NsDaemon]


@pytest.fixture
def group(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    size = getattr(request, "param", 2)
    lab = netns.Lab.create(size)
    daemons: list[NsDaemon] = []
    try:
        token = tmp_path / "token"
        token.write_text(TOKEN)
        token.chmod(0o600)
        leader_ns, *follower_ns = lab.hosts
        certs = group_certs(tmp_path / "certs", [ns.address for ns in lab.hosts])
        followers = [make_daemon(tmp_path / f"host{i + 1}", ns, {}, token, certs) for i, ns in enumerate(follower_ns)]
        dep = process_deployment(
            free_port(),
            hosts=[f"{ns.address}:{API_PORT}" for ns in follower_ns],
            env={"FAKE_VLLM_TIME_SCALE": "0.02", "FAKE_VLLM_PG_WAIT_SECONDS": "20"},
        )
        leader = make_daemon(tmp_path / "host0", leader_ns, {"big": dep}, token, certs)
        daemons = [*followers, leader]
        for daemon in followers:
            _spawn(daemon)
        _spawn(leader)
        yield Group(lab, leader, followers)
    finally:
        running = [d for d in reversed(daemons) if d.proc is not None and d.proc.poll() is None]
        for daemon in running:  # all stop at once: each one's shutdown (its Ray node's too) takes seconds
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGTERM)
        for daemon in reversed(daemons):
            if daemon.proc is not None:
                try:
                    daemon.proc.wait(40)
                except Exception:
                    daemon.proc.kill()
            daemon.notifications.close()
            shutil.rmtree(ray_temp_dir(daemon.state_dir / "ray"), ignore_errors=True)
        lab.close()


def ready(d: dict[str, Any]) -> bool:
    return d["phase"] == "ready" and all(h["state"] == "joined" for h in d.get("hosts", []))


def ray_nodes(group: Group) -> list[dict[str, Any]]:
    """The live Ray nodes as the leader's namespace sees them."""
    import subprocess

    from dankserve.cluster.ray_node import WAIT_SCRIPT, ray_python

    leader = group.lab.hosts[0]
    ray = ray_executable(None)
    argv = leader.command([ray_python(ray), "-c", WAIT_SCRIPT, f"{leader.address}:{RAY_PORT}", "1", "0", "1"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    nodes: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])["nodes"]
    return nodes


def wait_unready(daemon: NsDaemon, since: float, timeout: float = 15) -> float:
    """Seconds from `since` until the leader no longer reports the group ready."""
    daemon.wait_for("big", lambda d: d["phase"] != "ready", timeout=timeout)
    return time.monotonic() - since


def test_two_hosts_form_serve_and_survive_a_killed_worker(group: Group) -> None:
    """Two hosts form one Ray cluster (2 nodes, 4 GPUs) and serve; a follower's Ray worker killed is
    detected within 15 s and the whole group restarts to ready, never as two groups."""
    status = group.leader.wait_for("big", ready, timeout=120)
    assert [h["role"] for h in status["hosts"]] == ["leader", "follower"]
    nodes = ray_nodes(group)
    assert sorted(n["address"] for n in nodes) == sorted(h.address for h in group.lab.hosts)
    assert sum(n["gpus"] for n in nodes) == 4

    follower = group.followers[0]
    record = json.loads((follower.state_dir / "ray" / "worker-big.json").read_text())
    killed = time.monotonic()
    os.killpg(record["pid"], signal.SIGKILL)
    assert wait_unready(group.leader, killed) < 15
    after = group.leader.wait_for("big", ready, timeout=120)
    assert after["restarts"] >= 1
    assert len(ray_nodes(group)) == 2


def test_link_cut_and_restored(group: Group) -> None:
    """A follower's link cut is detected within 15 s; once restored, the group forms again and serves."""
    group.leader.wait_for("big", ready, timeout=120)
    cut = time.monotonic()
    group.lab.hosts[1].link(False)
    try:
        assert wait_unready(group.leader, cut) < 15
        hold_for(3, "the link stays cut a while after the loss was seen")
    finally:
        group.lab.hosts[1].link(True)
    group.leader.wait_for("big", ready, timeout=150)
    assert len(ray_nodes(group)) == 2


def test_leader_restarted(group: Group) -> None:
    """The leader killed with -9 and started again replaces its old group (never adopts it): one group serves."""
    group.leader.wait_for("big", ready, timeout=120)
    group.leader.kill()
    _spawn(group.leader)
    group.leader.wait_for("big", lambda d: d["phase"] == "ready" and d["boots"] >= 2, timeout=150)
    assert len(ray_nodes(group)) == 2


def worker_pid(daemon: NsDaemon) -> int:
    record: dict[str, Any] = json.loads((daemon.state_dir / "ray" / "worker-big.json").read_text())
    return int(record["pid"])


def cache_log(daemon: NsDaemon) -> list[str]:
    """What the stand-in's Ray workers on this host wrote to its compile cache dir (`rank R hit|miss`)."""
    path = daemon.config.parent / "cache" / "deployments" / "big" / "vllm" / "stand-in-ray-workers.log"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def learned_entries(daemon: NsDaemon) -> list[dict[str, Any]]:
    state = json.loads((daemon.state_dir / "state.json").read_text())
    entries: dict[str, dict[str, Any]] = state["deployments"]["big"].get("learned_kv") or {}
    return list(entries.values())


@pytest.mark.parametrize("group", [3], indirect=True)
def test_three_hosts_form_and_restart_whole_group_when_a_follower_is_killed(group: Group) -> None:
    """Three hosts form one Ray cluster (TP 2 x PP 3: 3 nodes, 6 GPUs) and serve, each host's workers compiling
    into that host's cache dir; the last follower's Ray worker killed is detected within 15 s and every member's
    worker is replaced (one group); the second boot passes the KV bytes learned for all 6 GPUs and every host's
    workers hit their own compile cache."""
    status = group.leader.wait_for("big", ready, timeout=150)
    assert [h["role"] for h in status["hosts"]] == ["leader", "follower", "follower"]
    assert status["kv_cache_learned_used"] is False
    nodes = ray_nodes(group)
    assert sorted(n["address"] for n in nodes) == sorted(h.address for h in group.lab.hosts)
    assert sum(n["gpus"] for n in nodes) == 6
    daemons = [group.leader, *group.followers]
    for daemon in daemons:  # two ranks per host, each compiling into that host's own cache dir
        assert [line.split()[-1] for line in cache_log(daemon)] == ["miss", "miss"], daemon.config
    [learned] = learned_entries(group.leader)
    assert len(learned["baseline_free_bytes"]) == 6  # the leader's 2 GPUs and each follower's 2

    before = [worker_pid(f) for f in group.followers]
    killed = time.monotonic()
    os.killpg(before[-1], signal.SIGKILL)
    assert wait_unready(group.leader, killed) < 15
    after = group.leader.wait_for("big", ready, timeout=150)
    assert after["restarts"] >= 1
    assert all(worker_pid(f) != pid for f, pid in zip(group.followers, before, strict=True))
    assert len(ray_nodes(group)) == 3
    assert after["kv_cache_learned_used"] is True
    assert after["kv_cache_memory_bytes"] == learned["kv_cache_memory_bytes"]
    for daemon in daemons:
        lines = cache_log(daemon)
        assert len(lines) == 4 and all(line.endswith("hit") for line in lines[2:]), (daemon.config, lines)
