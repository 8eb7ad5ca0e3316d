"""Snapshots in the lifecycle (issue 41) through a real daemon on the process runtime, with real CRIU and the
stand-in vLLM (with its host pids, an API server holding a named POSIX semaphore as vLLM's does, and its engine
core, whose GPU record is checkpointed through the stand-in's GPU edge): the ready server is captured once
(dumped, which ends it, and restored at once from the image, with the same pids: the restored tree is the
deployment's server); a kill -9 of it restores the snapshot (boot kind `restore`, the same greedy ids, no boot
in its log); with its old host pid taken the restore fails and the same start boots; each failure (a corrupt or
truncated snapshot, one of another plan, CRIU missing) falls back to the normal boot in the same restart, with
the reason in status, no failure counted, and the server serving; a capture whose restore fails boots the server
again at once."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.doctor import read_criu
from dankserve.host.gpu_processes import process_tree
from dankserve.snapshot import shm
from dankserve.snapshot.criu import criu_path
from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon, write_host
from tests.harness.faults import small_snapshot_store
from tests.harness.pids import adopting_orphans, reap_gone, take_pid
from tests.harness.wait import wait_until
from tests.test_snapshot_criu import damage_images

_reading = read_criu(criu_path())
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _reading.path is None or not _reading.check_ok or os.geteuid() != 0,
        reason="needs root and a working CRIU >= 4.2 (make system-deps)",
    ),
]
READY = "Application startup complete."


def _deployment(host: Path, port: int, **extra: Any) -> dict[str, Any]:
    env = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes")), **extra.pop("env", {})}
    return process_deployment(port, **{"gpus": [0], "listen": "tcp", "snapshot": "auto", "env": env, **extra})


def _server_pid(daemon: RunningDaemon) -> int:
    pid: int = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["pid"]
    return pid


def _started(pid: int) -> str:
    """When the process started (clock ticks since boot): a restored tree has its pids, not their start times."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def _ids(port: int) -> list[int]:
    body = {"model": "test/tiny", "prompt": "x", "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["choices"][0]["token_ids"])


def _captured(daemon: RunningDaemon) -> dict[str, Any]:
    status = daemon.wait_for("chat", lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=90)
    assert not (daemon.state_dir / "snapshots" / "chat" / "dump-inodes.json").exists(), "the dump's note goes"
    return status


def _boots_in_log(daemon: RunningDaemon) -> int:
    return (daemon.state_dir / "processes" / "chat.log").read_text(errors="replace").count(READY)


def _kill(daemon: RunningDaemon) -> int:
    pid = _server_pid(daemon)
    os.kill(pid, signal.SIGKILL)
    return pid


def test_captured_then_killed_with_9_the_server_is_restored_serving_the_same_ids(tmp_path: Path) -> None:
    host = write_host(tmp_path / "host.json")
    port, metrics_port = free_port(), free_port()
    listen = {"metrics_listen": f"127.0.0.1:{metrics_port}"}
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host, extra_globals=listen) as daemon:
        first = _captured(daemon)
        assert first["snapshot"]["last_capture_outage_seconds"] > 0
        captured = _server_pid(daemon)
        (booted_id,) = [e["container_id"] for e in daemon.events_named("started")]
        (event,) = daemon.events_named("snapshot_captured")
        assert event["container_id"] == f"process-chat-{captured}" == booted_id, "restored from the image, same pids"
        tree = process_tree(captured)
        assert len(tree) == 2, "the API server and its engine core, with their host pids"
        restored_at = _started(captured)
        assert first["gpu_memory_held_bytes"], "its GPU holder found by host pid"
        manifest = json.loads((daemon.state_dir / "snapshots" / "chat" / "manifest.json").read_text())
        assert manifest["link_remaps"], "CRIU's link-remap of the API server's semaphore, kept"
        ids = _ids(port)
        booted = _boots_in_log(daemon)
        pid = _kill(daemon)
        restored = daemon.wait_for(
            "chat", lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore", timeout=60
        )
        assert process_tree(_server_pid(daemon)) == tree, "CRIU restores the tree with its own pids"
        assert _server_pid(daemon) == pid and _started(pid) != restored_at
        assert _ids(port) == ids
        assert _boots_in_log(daemon) == booted, "restored, not booted"
        assert restored["snapshot"]["last_restore_seconds"] > 0
        assert restored["restarts"] == 1
        shown = daemon.cli("status", "chat").stdout
        assert "snapshot ready: restored from it" in shown and "last restore" in shown, shown
        assert "restore 1" in shown, "boots by kind"
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert 'dankserve_boots_total{deployment="chat",kind="restore"} 1.0' in scraped
        assert 'dankserve_snapshot_captures_total{deployment="chat",result="ok"} 1.0' in scraped
        assert 'dankserve_snapshot_restores_total{deployment="chat",result="restored"} 1.0' in scraped
        assert 'dankserve_snapshot_seconds_total{deployment="chat",kind="restore"}' in scraped
        listed = json.loads(daemon.cli("snapshot", "list", "--json").stdout)
        (entry,) = [e for e in listed["snapshots"] if e["deployment"] == "chat"]
        assert entry["state"] == "ready" and entry["last_restore_seconds"] > 0 and entry["bytes"] > 0


def _booted_normally(daemon: RunningDaemon, boots: int) -> dict[str, Any]:
    """Ready after a normal boot (not a restore), captured again."""
    return daemon.wait_for(
        "chat",
        lambda d: (
            d["state"] == "ready"
            and d["boots"] == boots
            and (d["last_boot"] or {}).get("kind") != "restore"
            and d["snapshot"]["state"] == "ready"
        ),
        timeout=90,
    )


def _no_failure_counted(daemon: RunningDaemon) -> None:
    assert not daemon.events_named("deployment_failed")
    assert [e["failure"] for e in daemon.events_named("boot_failed")] in ([], ["engine_dead"])


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_corrupt_or_truncated_snapshot_is_discarded_and_the_same_restart_boots(tmp_path: Path, damage: str) -> None:
    host = write_host(tmp_path / "host.json")
    port = free_port()
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
        _captured(daemon)
        ids = _ids(port)
        damage_images(daemon.state_dir / "snapshots" / "chat" / "images", damage)
        _kill(daemon)
        after = _booted_normally(daemon, 2)
        assert "criu restore failed" in after["snapshot"]["last_failure"]
        assert after["restarts"] == 1
        assert _ids(port) == ids
        (failed,) = daemon.events_named("snapshot_restore_failed")
        assert failed["then"] == "a normal boot"
        _no_failure_counted(daemon)
        shown = daemon.cli("status", "chat").stdout
        assert "snapshot ready" in shown and "last failure: restore failed at criu_restore" in shown, shown


def _second_daemon(tmp_path: Path, deployment: dict[str, Any], host: Path, **extra: Any) -> Any:
    return running_daemon(tmp_path, {"chat": deployment}, hardware=host, **extra)


def _captured_then_daemon_and_server_killed(tmp_path: Path, deployment: dict[str, Any], host: Path) -> int:
    """Daemon 1 captures; it is killed with -9, then its server: the pid the tree had (its pids freed: the
    orphans come to this test, which reaps them, whatever pid 1 does)."""
    with running_daemon(tmp_path, {"chat": deployment}, hardware=host) as daemon, adopting_orphans():
        _captured(daemon)
        pid = _server_pid(daemon)
        tree = process_tree(pid)
        daemon.kill()
        os.killpg(pid, signal.SIGKILL)  # the whole server: its process group
        reap_gone(tree)
    return pid


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def test_a_changed_plan_deletes_the_snapshot_with_its_reason_and_boots(tmp_path: Path) -> None:
    host = write_host(tmp_path / "host.json")
    port = free_port()
    _captured_then_daemon_and_server_killed(tmp_path, _deployment(host, port), host)
    changed = _deployment(host, port, max_num_seqs=16)
    with _second_daemon(tmp_path, changed, host) as daemon:
        after = _booted_normally(daemon, 2)
        assert after["snapshot"]["last_failure"] == "the plan's arguments changed since the capture"
        (discarded,) = daemon.events_named("snapshot_discarded")
        assert "16" not in discarded["reason"], "argv values are never shown"
        assert not daemon.events_named("restoring_snapshot")
        _ids(port)


def test_a_daemon_restart_with_the_old_host_pid_taken_boots_normally_with_the_reason(tmp_path: Path) -> None:
    """The tree is restored with its own host pids: another process holding one fails the restore with CRIU's
    reason, and the same start boots normally (not counted as a failure); the holder is untouched."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    deployment = _deployment(host, port)
    pid = _captured_then_daemon_and_server_killed(tmp_path, deployment, host)
    taker = take_pid(pid)
    if taker is None:
        pytest.skip(f"could not take pid {pid} for the test")
    try:
        with _second_daemon(tmp_path, deployment, host) as daemon:
            after = _booted_normally(daemon, 2)
            failure = after["snapshot"]["last_failure"] or ""
            assert "criu restore failed" in failure, failure
            assert after["restarts"] == 0 and not daemon.events_named("boot_failed"), "not counted"
            assert taker.poll() is None, "the process holding the pid is untouched"
            _ids(port)
    finally:
        taker.kill()
        taker.wait()


def test_criu_missing_boots_normally_and_keeps_the_snapshot(tmp_path: Path) -> None:
    host = write_host(tmp_path / "host.json")
    port = free_port()
    _captured_then_daemon_and_server_killed(tmp_path, _deployment(host, port), host)
    with _second_daemon(tmp_path, _deployment(host, port), host, extra_env={"DANKSERVE_CRIU": ""}) as daemon:
        after = daemon.wait_for("chat", lambda d: d["state"] == "ready")
        assert after["snapshot"]["state"] == "off"
        assert "CRIU is not installed" in after["snapshot"]["reason"]
        assert (daemon.state_dir / "snapshots" / "chat" / "manifest.json").exists(), "nothing lost"
        _ids(port)


def test_down_then_up_and_restart_restore_after_a_graceful_stop(tmp_path: Path) -> None:
    """A graceful stop deletes the server's /dev/shm segment; the snapshot keeps a copy, put back at restore."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
        _captured(daemon)
        ids = _ids(port)
        manifest = json.loads((daemon.state_dir / "snapshots" / "chat" / "manifest.json").read_text())
        assert manifest["shm"], "the engine core's segment is kept"
        assert manifest["link_remaps"], "and CRIU's link-remap of the API server's semaphore"
        assert daemon.cli("down", "chat").returncode == 0
        assert not any((Path("/dev/shm") / name).exists() for name in manifest["shm"]), "deleted by the stop"
        assert daemon.cli("up", "chat").returncode == 0
        daemon.wait_for("chat", lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore")
        assert _ids(port) == ids
        assert daemon.cli("restart", "chat").returncode == 0
        after = daemon.wait_for(
            "chat", lambda d: d["state"] == "ready" and d["boots_by_kind"].get("restore") == 2, timeout=60
        )
        assert after["snapshot"]["last_failure"] is None
        assert _ids(port) == ids


def test_a_capture_interrupted_by_a_kill_9_of_the_daemon_is_undone_and_done_again(tmp_path: Path) -> None:
    """The daemon killed with -9 between the GPU checkpoint and the manifest leaves the server locked and
    checkpointed beside an entry without a manifest (made here as that moment leaves them): the next daemon
    restores and unlocks it, adopts it serving, deletes the entry with its reason (and the link-remap files its
    dump made) and captures again."""
    from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint

    host = write_host(tmp_path / "host.json")
    port = free_port()
    deployment = _deployment(host, port)
    with running_daemon(tmp_path, {"chat": deployment}, hardware=host) as daemon:
        _captured(daemon)
        ids = _ids(port)
        pid = _server_pid(daemon)
        daemon.kill()
    gpu = StandInGpuCheckpoint(host.with_name(host.name + ".processes"))
    (engine,) = gpu.holders(process_tree(pid))
    gpu.lock(engine)
    gpu.checkpoint(engine)
    entry = tmp_path / "state" / "snapshots" / "chat"
    (entry / "manifest.json").unlink()
    # The dump's link-remap file of a deleted /dev/shm file (a stand-in for the semaphore's), noted in the entry
    # before the dump as the capture does: the unfinished entry's discard deletes it, not another's.
    held, remap = Path(f"/dev/shm/dankserve-test-{os.getpid()}"), Path(f"/dev/shm/link_remap.{9 * 10**8 + os.getpid()}")
    held.write_bytes(b"semaphore")
    os.link(held, remap)
    shm.note_dump(entry, frozenset({held.stat().st_ino}))
    held.unlink()
    with _second_daemon(tmp_path, deployment, host) as daemon:
        after = _booted_normally(daemon, 1)
        assert not remap.exists(), "the unfinished dump's link-remap file went with its entry"
        (adopted,) = daemon.events_named("adopting")
        assert adopted["container_id"] == f"process-chat-{pid}", "adopted, not booted again"
        (now,) = gpu.holders(process_tree(_server_pid(daemon)))  # captured again: the tree restored from it
        assert gpu.state(now) == "running"
        (repaired,) = daemon.events_named("snapshot_capture_interrupted")
        assert repaired["repaired"] == [f"GPU restore of pid {engine}", f"GPU unlock of pid {engine}"]
        assert after["snapshot"]["last_failure"] == "no manifest: the capture did not finish"
        assert _ids(port) == ids
        assert daemon.events_named("snapshot_captured"), "captured again"


def test_a_restore_interrupted_by_a_kill_9_of_the_daemon_is_taken_over(tmp_path: Path) -> None:
    """The daemon killed with -9 after `criu restore` and before it recorded the tree (made here as that moment
    leaves it: the tree restored from the snapshot, its engine core still checkpointed, asleep): the next daemon
    finds the captured command line at the captured pid, takes the tree over, finishes its GPU restore and
    unlock, and serves the captured ids (boot kind restore), without a second restore or a boot."""
    from dankserve.snapshot import criu, shm
    from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint

    host = write_host(tmp_path / "host.json")
    port = free_port()
    deployment = _deployment(host, port)
    _captured_then_daemon_and_server_killed(tmp_path, deployment, host)
    entry = tmp_path / "state" / "snapshots" / "chat"
    manifest = json.loads((entry / "manifest.json").read_text())
    with shm.turn():  # as the daemon's own restore: no other test's dump meets its link-remap files
        put = shm.put_back((*manifest["shm"], *manifest["link_remaps"]), entry / "shm")
        try:
            pid = criu.restore(entry / "images", appended=(tmp_path / "state" / "processes" / "chat.log",))
        finally:
            shm.clear_remaps(put)
    gpu = StandInGpuCheckpoint(host.with_name(host.name + ".processes"))
    (engine,) = _children(pid)  # the API server's, with their own pids again
    assert gpu.state(engine) == "checkpointed"
    with _second_daemon(tmp_path, deployment, host) as daemon:
        after = daemon.wait_for(
            "chat", lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore"
        )
        assert _server_pid(daemon) == pid and gpu.state(engine) == "running"
        (resumed,) = daemon.events_named("snapshot_restore_resumed")
        assert resumed["done"] == [f"GPU restore of pid {engine}", f"GPU unlock of pid {engine}"]
        assert resumed["canary"] == "the captured ids"
        assert after["snapshot"]["state"] == "ready" and after["snapshot"]["last_failure"] is None
        _ids(port)


def test_a_disk_full_while_capturing_leaves_the_server_serving_with_the_reason(tmp_path: Path) -> None:
    """The store on an 8 MiB file system (the stand-in's image is about 30 MB): the image's estimate, taken
    after the GPU checkpoint, does not fit, so CRIU never writes (the dump's own "No space left" is
    test_snapshot_capture's); the capture is undone (engine core unlocked, awake), nothing is kept, the
    reason is in status, and the server serves throughout."""
    with small_snapshot_store(tmp_path) as store_dir:
        host = write_host(tmp_path / "host.json")
        port = free_port()
        with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
            after = daemon.wait_for(
                "chat", lambda d: d["state"] == "ready" and d["snapshot"]["last_failure"] is not None, timeout=60
            )
            assert after["snapshot"]["state"] == "off", "not tried again at every boot"
            assert "not captured again by this daemon" in after["snapshot"]["reason"]
            failure = after["snapshot"]["last_failure"]
            assert "capture failed at room: the image would take about" in failure, failure
            assert "filesystem has 0.0 GiB free" in failure and "nothing was written" in failure
            assert list(store_dir.iterdir()) == [], "nothing kept"
            _ids(port)
            assert not daemon.events_named("boot_failed")


def test_requests_during_a_capture_wait_in_the_gateway_and_are_served(tmp_path: Path) -> None:
    """A swap group member (sleep mode: the capture sleeps it at level 2) whose sleep takes 3 s: while it is
    captured, status says `snapshotting` and a request through the gateway waits, then is served (not refused)."""
    import threading

    host = write_host(tmp_path / "host.json")
    port, gateway = free_port(), free_port()
    dep = _deployment(host, port, swap_group="g", env={"FAKE_VLLM_SLEEP_SECONDS": "3"})
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, {"chat": dep}, hardware=host, extra_globals=settings) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "snapshotting", timeout=60)
        answers: list[httpx.Response] = []
        body = {"model": "test/tiny", "prompt": "x", "max_tokens": 2}
        sender = threading.Thread(
            target=lambda: answers.append(
                httpx.post(f"http://127.0.0.1:{gateway}/v1/completions", json=body, timeout=60)
            )
        )
        sender.start()
        sender.join(1.0)
        assert not answers, "held while the server is captured"
        after = _captured(daemon)
        sender.join(30)
        assert answers and answers[0].status_code == 200, answers[0].text if answers else "no answer"
        assert after["snapshot"]["last_capture_outage_seconds"] >= 3


def test_launcher_auto_uses_the_launcher_for_vllms_own_command_unless_snapshots_restore(tmp_path: Path) -> None:
    """`launcher = "auto"` (the default) on the process runtime: a `vllm` executable boots through the launcher
    when snapshots are off, and not when `snapshot = "auto"` restores the restarts; status says why."""
    from tests.harness.daemon import LAUNCHER_ENV, STAND_IN

    vllm = tmp_path / "bin" / "vllm"
    vllm.parent.mkdir()
    vllm.symlink_to(STAND_IN)
    host = write_host(tmp_path / "host.json")
    env = {**LAUNCHER_ENV, "DANKSERVE_LAUNCHER_PATH": str(STAND_IN.parent)}
    deployments = {
        "a": process_deployment(free_port(), gpus=[0], executable=str(vllm), env=env, launcher="auto"),
        "b": _deployment(host, free_port(), executable=str(vllm), env=env, launcher="auto") | {"gpus": [1]},
    }
    with running_daemon(tmp_path, deployments, hardware=host) as daemon:
        a = daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=90)
        b = daemon.wait_for("b", lambda d: d["state"] == "ready", timeout=90)
        assert a["launcher"]["used"] and "vLLM's own" in a["launcher"]["why"]
        assert not b["launcher"]["used"] and 'snapshot = "auto" restores' in b["launcher"]["why"]
        assert (daemon.state_dir / "launchers" / "a").exists() and not (daemon.state_dir / "launchers" / "b").exists()
        shown = daemon.cli("status", "a").stdout
        assert "launcher used: launcher = auto" in shown, shown


def test_a_capture_whose_restore_fails_boots_the_server_again_at_once(tmp_path: Path) -> None:
    """A swap member (sleep mode) whose woken server answers other ids (FAKE_VLLM_WAKE_TOKENS_DIFFER): the dump
    ended the tree, the restore from the image fails its canary, so no server serves; the snapshot is discarded
    with its reason and the deployment boots normally at once (no failure counted), and is not captured again."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    dep = _deployment(host, port, swap_group="g", env={"FAKE_VLLM_WAKE_TOKENS_DIFFER": "1"})
    with running_daemon(tmp_path, {"chat": dep}, hardware=host) as daemon:
        after = daemon.wait_for("chat", lambda d: d["state"] == "ready" and d["boots"] == 2, timeout=90)
        (lost,) = daemon.events_named("snapshot_capture_lost")
        assert lost["then"] == "a normal boot" and "capture failed at canary" in lost["reason"]
        assert "capture failed at canary" in after["snapshot"]["last_failure"]
        assert after["snapshot"]["state"] == "off" and "not captured again" in after["snapshot"]["reason"]
        assert after["restarts"] == 0 and after["last_failure"] is None, "not the deployment's failure"
        _no_failure_counted(daemon)
        assert not (daemon.state_dir / "snapshots" / "chat" / "manifest.json").exists()
        _ids(port)
        assert len(daemon.events_named("snapshot_capturing")) == 1


def test_an_engine_core_killed_with_9_is_engine_death_and_the_restart_restores(tmp_path: Path) -> None:
    """The engine core killed alone: the API server answers vLLM's engine-dead errors, the daemon sees engine
    death, stops the server through its process group (the whole tree goes) and the restart restores the
    snapshot, with its own pids again."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
        _captured(daemon)
        ids = _ids(port)
        root = _server_pid(daemon)
        tree = process_tree(root)
        before = [_started(p) for p in tree]
        os.kill(tree[-1], signal.SIGKILL)
        body = {"model": "test/tiny", "prompt": "x", "max_tokens": 5}
        dead = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
        assert dead.status_code == 500, "vLLM's engine-dead error (its /health says 503 from now on)"
        after = daemon.wait_for(
            "chat", lambda d: d["state"] == "ready" and d["boots_by_kind"].get("restore") == 1, timeout=90
        )
        assert after["restarts_by_cause"] == {"engine_dead": 1}, after["restarts_by_cause"]
        assert process_tree(root) == tree and [_started(p) for p in tree] != before, "the old tree gone, restored"
        assert _ids(port) == ids


def test_two_deployments_captured_at_once_both_restore(tmp_path: Path) -> None:
    """Both ready together, both captured: CRIU numbers link-remap files per dump in the one /dev/shm, so
    the captures take turns (shm.turn) instead of failing on each other's `link_remap.N` ("File exists")."""
    host = write_host(tmp_path / "host.json")
    ports = {"chat": free_port(), "code": free_port()}
    deployments = {"chat": _deployment(host, ports["chat"]), "code": _deployment(host, ports["code"], gpus=[1])}
    with running_daemon(tmp_path, deployments, hardware=host) as daemon:
        ready = {
            name: daemon.wait_for(
                name, lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=120
            )
            for name in ports
        }
        assert all(d["snapshot"]["last_failure"] is None for d in ready.values()), ready
        ids = {name: _ids(port) for name, port in ports.items()}
        for name in ports:
            pid: int = json.loads((daemon.state_dir / "processes" / f"{name}.json").read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
        for name, port in ports.items():
            daemon.wait_for(
                name, lambda d: d["state"] == "ready" and (d["last_boot"] or {}).get("kind") == "restore", timeout=90
            )
            assert _ids(port) == ids[name]


def _hold_connection(port: int) -> socket.socket:
    """A client's idle connection straight to the server's port (no request sent), once it accepts."""

    def connected() -> socket.socket | None:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return None

    return wait_until(connected, 60, 0.05, what=f"a connection to port {port}")


def test_a_client_connection_the_server_keeps_open_fails_the_capture_which_is_tried_again(tmp_path: Path) -> None:
    """Found driving the daemon: a client connected straight to the server during the capture was saved in
    the image, and a later restore failed on its addresses ("Can't connect inet socket back"). Now the capture
    waits for client connections to close; one the server never closes (VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 0)
    fails the capture with the reason, the server serving; once it is gone, the capture tried again 30 s
    later keeps the snapshot, with no restart."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    dep = _deployment(host, port, env={"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "0"})
    with running_daemon(tmp_path, {"chat": dep}, hardware=host) as daemon:
        client = _hold_connection(port)
        try:
            after = daemon.wait_for(
                "chat", lambda d: d["state"] == "ready" and d["snapshot"]["last_failure"] is not None, timeout=90
            )
            failure = after["snapshot"]["last_failure"]
            assert "capture failed at quiet" in failure and "client connection(s)" in failure, failure
            assert f"127.0.0.1:{client.getsockname()[1]} -> 127.0.0.1:{port}" in failure
            assert after["snapshot"]["state"] == "absent" and "tried again in 30 s" in after["snapshot"]["reason"]
            assert not (daemon.state_dir / "snapshots" / "chat").exists(), "nothing kept"
            assert _ids(port), "the server serves (woken again)"
        finally:
            client.close()
        captured = _captured(daemon)
        assert captured["boots"] == 1 and captured["restarts"] == 0
        assert not daemon.events_named("boot_failed")


def test_an_idle_client_connection_is_waited_out_and_the_snapshot_restores(tmp_path: Path) -> None:
    """A client's idle keep-alive connection opened as the capture begins: the capture waits until the server
    closes it (3 s here; vLLM's default is 5 s), so the image holds none, and every restore restores. (A client
    connecting between that wait and CRIU's freeze is caught after the restore: the image is not kept and the
    restored server serves on; seen once while writing this test.)"""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    # A swap group member: the capture sleeps it (1 s here) once it holds the host's CRIU turn; the client
    # connects when this daemon holds it (other tests' dumps and restores take it too, 7 s seen under load, longer
    # than the connection lives): the connection outlives the sleep by about 2 s.
    env = {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3", "FAKE_VLLM_SLEEP_SECONDS": "1"}
    dep = _deployment(host, port, swap_group="g", env=env)
    with running_daemon(tmp_path, {"chat": dep}, hardware=host) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "snapshotting", timeout=60)
        wait_until(lambda: _holds_the_turn(daemon), 120, 0.01, what="the daemon's capture holding the CRIU turn")
        client = _hold_connection(port)
        try:
            _captured(daemon)
            manifest = json.loads((daemon.state_dir / "snapshots" / "chat" / "manifest.json").read_text())
            assert manifest["timings"]["quiet"] > 0.3, "it waited for the client's connection to close"
            ids = _ids(port)
            for kills in (1, 2):
                _kill(daemon)
                restored = daemon.wait_for("chat", functools.partial(_restores_counted, kills), timeout=60)
                assert restored["snapshot"]["last_failure"] is None
                assert _ids(port) == ids
        finally:
            client.close()


def _holds_the_turn(daemon: RunningDaemon) -> bool:
    """The daemon holds the host's CRIU turn (shm.turn's flock), as /proc/locks says."""
    try:
        inode = os.stat(shm.SHM / shm.TURN_FILE).st_ino
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    assert daemon.proc is not None
    wanted = ("FLOCK", str(daemon.proc.pid), str(inode))
    for fields in (line.split() for line in locks.splitlines()):  # N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...
        if len(fields) >= 6 and (fields[1], fields[4], fields[5].rsplit(":", 1)[-1]) == wanted:
            return True
    return False


def _restores_counted(count: int, d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready" and d["boots_by_kind"].get("restore") == count)


def test_after_a_capture_the_worker_still_follows_the_servers_log_and_a_stop_is_prompt(tmp_path: Path) -> None:
    """Found timing the suite's stops: the dump ended the tree and its log's follower; the tree restored with
    its pids kept its id, so it was not followed again, and the old follower's end read as an exit to wait
    for: every look waited 10 s, and SIGTERM took the whole stop timeout (then SIGKILL). Now the stop is prompt."""
    host = write_host(tmp_path / "host.json")
    port = free_port()
    with running_daemon(tmp_path, {"chat": _deployment(host, port)}, hardware=host) as daemon:
        _captured(daemon)
        _ids(port)
        assert daemon.stop() == 0
        assert not daemon.events_named("daemon_stop_slow"), daemon.events_named("daemon_stop_slow")
        assert "Application shutdown complete." in (daemon.state_dir / "processes" / "chat.log").read_text(), (
            "stopped by SIGINT, not killed at the timeout"
        )
