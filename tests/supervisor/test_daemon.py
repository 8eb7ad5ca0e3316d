"""End-to-end tests of the daemon: a real `dankserve run` supervising the stand-in vLLM.

These use the process runtime (the stand-in as a plain process group), so they need no Podman;
tests/supervisor/test_daemon_podman.py runs the container path on the real Podman service.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from dankserve.testing.config_file import write_config
from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon
from tests.harness.wait import hold_for, stays_true, wait_until

pytestmark = pytest.mark.slow


def ready(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "ready")


def failed(d: dict[str, Any]) -> bool:
    return bool(d["state"] == "failed")


def server_pid(daemon: RunningDaemon, name: str) -> int:
    record = json.loads((daemon.state_dir / "processes" / f"{name}.json").read_text())
    pid: int = record["pid"]
    return pid


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_first_boot_learns_and_a_killed_server_restarts_warm(tmp_path: Path) -> None:
    """A first boot learns the KV bytes; a server killed with -9 restarts with them and a compile-cache hit."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        first = daemon.wait_for("chat", ready)
        assert first["boots"] == 1 and first["kv_cache_learned_used"] is False
        assert first["compile_cache_hit"] is False
        assert first["kv_cache_memory_bytes"] and first["kv_cache_memory_bytes"] > 0
        learned = first["kv_cache_memory_bytes"]
        os.killpg(server_pid(daemon, "chat"), signal.SIGKILL)
        second = daemon.wait_for("chat", lambda d: ready(d) and d["boots"] == 2)
        assert second["kv_cache_learned_used"] is True
        assert second["kv_cache_memory_bytes"] == learned
        assert second["compile_cache_hit"] is True
        assert second["restarts"] == 1
        started = daemon.events_named("started")
        assert len(started) == 2
        argv = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["argv"]
        assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(learned)
        assert daemon.notifications.first("READY=1") is not None


def test_bad_argument_is_reported_and_not_retried(tmp_path: Path) -> None:
    """A flag vLLM rejects fails the deployment once, with vLLM's message, and is not restarted."""
    dep = process_deployment(free_port(), extra_args=["--max-num-seqz", "16"])
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        status = daemon.wait_for("chat", failed)
        assert status["last_failure"]["class"] == "bad_argument"
        assert "unrecognized arguments" in status["message"]
        assert status["restarts"] == 0
        stays_true(lambda: len(daemon.events_named("started")) == 1, 1.0, what="one boot (no retry)")
        assert daemon.notifications.first("READY=1") is not None


def test_a_too_long_context_is_remediated_once_with_vllms_estimate(tmp_path: Path) -> None:
    """vLLM's max-length error makes the next boot use its estimated maximum length, which then serves."""
    env = {
        "FAKE_VLLM_GPU_MEMORY_BYTES": str(8 * 2**30),
        "FAKE_VLLM_KV_BYTES_PER_TOKEN": str(131072),
    }
    with running_daemon(tmp_path, {"chat": process_deployment(free_port(), env=env)}) as daemon:
        status = daemon.wait_for("chat", ready)
        assert status["last_failure"]["class"] == "max_len_too_large"
        assert status["boots"] == 2
        argv = json.loads((daemon.state_dir / "processes" / "chat.json").read_text())["argv"]
        assert "--max-model-len" in argv


def test_no_kv_memory_raises_utilisation_once_then_gives_up(tmp_path: Path) -> None:
    """No KV memory: one boot at the top of the utilisation band, then a configuration error."""
    dep = process_deployment(free_port(), env={"FAKE_VLLM_FAIL": "no_kv_memory"})
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        status = daemon.wait_for("chat", failed)
        assert status["last_failure"]["class"] == "no_kv_memory"
        assert status["boots"] == 2
        decisions = [e["decision"] for e in daemon.events_named("boot_failed")]
        assert "gpu_memory_utilization raised from 0.9 to 0.95" in decisions[0]
        assert "'gpu_memory_utilization': 0.95" in (daemon.state_dir / "processes" / "chat.log").read_text()


def test_repeated_oom_backs_off_then_fails_this_deployment_only(tmp_path: Path) -> None:
    """Out of memory at every load: restarts with backoff, then failed after the window's limit; others serve on."""
    deployments = {
        "bad": process_deployment(free_port(), env={"FAKE_VLLM_FAIL": "oom_load"}, gpus=[0]),
        "good": process_deployment(free_port(), gpus=[1]),
    }
    with running_daemon(tmp_path, deployments, extra_globals={"max_failures_in_window": 2}) as daemon:
        status = daemon.wait_for("bad", failed, timeout=90)
        assert status["last_failure"]["class"] == "oom_load"
        assert status["boots"] == 3
        assert "failures within" in status["message"]
        assert daemon.wait_for("good", ready)["restarts"] == 0


def test_a_hung_boot_times_out_and_restarts(tmp_path: Path) -> None:
    """A boot that never becomes ready is stopped at the boot timeout and started again."""
    dep = process_deployment(free_port(), env={"FAKE_VLLM_FAIL": "hang"})
    with running_daemon(tmp_path, {"chat": dep}, extra_globals={"boot_timeout_seconds": 2}) as daemon:
        status = daemon.wait_for("chat", lambda d: d["boots"] >= 2, timeout=30)
        assert status["last_failure"]["class"] == "boot_timeout"


def test_engine_death_is_detected_within_10_seconds(tmp_path: Path) -> None:
    """An engine that dies while serving is detected, and the deployment restarted, within 10 s."""
    dep = process_deployment(free_port(), env={"FAKE_VLLM_FAIL": "engine_dead"})
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        daemon.wait_for("chat", ready)
        ready_at = time.time()
        status = daemon.wait_for("chat", lambda d: d["last_failure"] is not None, timeout=30)
        assert status["last_failure"]["class"] == "engine_dead"
        assert status["last_failure"]["at"] - ready_at <= 10


def test_sigterm_stops_everything_and_exits_0(tmp_path: Path) -> None:
    """SIGTERM stops the servers gracefully, says STOPPING=1, and the daemon exits 0."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        pid = server_pid(daemon, "chat")
        assert daemon.stop() == 0
        assert not alive(pid)
        assert daemon.notifications.first("STOPPING=1") is not None
        assert not (daemon.state_dir / "processes" / "chat.json").exists()


def test_sighup_restarts_only_the_changed_deployment(tmp_path: Path) -> None:
    """After SIGHUP, a deployment whose config changed boots again; the unchanged one keeps its server."""
    ports = {"a": free_port(), "b": free_port()}
    deployments = {"a": process_deployment(ports["a"], gpus=[0]), "b": process_deployment(ports["b"], gpus=[1])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", ready)
        pid_a = server_pid(daemon, "a")
        changed = {**deployments, "b": process_deployment(ports["b"], gpus=[1], max_num_seqs=16)}
        text = daemon.config.read_text()
        globals_text = text.split("[deployments.", 1)[0]
        write_config(daemon.config, {}, changed)
        daemon.config.write_text(globals_text + daemon.config.read_text())
        daemon.signal(signal.SIGHUP)
        daemon.wait_for("b", lambda d: ready(d) and d["boots"] == 2)
        assert server_pid(daemon, "a") == pid_a
        assert daemon.deployment("a")["boots"] == 1  # type: ignore[index]


def test_five_small_deployments_on_auto_kv_offload_start_sharing_the_hosts_ram(tmp_path: Path) -> None:
    """Five deployments on the default kv_offload = "auto" (252 GiB host): the daemon is not refused for RAM; each
    server gets its share (--kv-offloading-size 44, not 64) and all five become ready."""
    deployments = {f"d{i}": process_deployment(free_port(), gpus=[i % 2], gpu_memory_utilization=0.3) for i in range(5)}
    with running_daemon(tmp_path, deployments) as daemon:
        for name in deployments:
            daemon.wait_for(name, ready)
        for name in deployments:
            argv = psutil.Process(server_pid(daemon, name)).cmdline()
            assert argv[argv.index("--kv-offloading-size") + 1] == "44", argv


def test_a_daemon_killed_with_9_is_replaced_by_one_that_adopts_the_server(tmp_path: Path) -> None:
    """After kill -9 of the daemon, the next daemon adopts the running server: no second server, no reboot."""
    deployments = {"chat": process_deployment(free_port())}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("chat", ready)
        pid = server_pid(daemon, "chat")
        daemon.kill()
        assert alive(pid)
        daemon.start()
        status = daemon.wait_for("chat", ready)
        assert server_pid(daemon, "chat") == pid
        assert status["boots"] == 1
        assert len(daemon.events_named("adopting")) == 1


def test_corrupt_state_is_moved_aside_and_the_daemon_serves(tmp_path: Path) -> None:
    """A corrupt state file is moved aside with a warning; the daemon starts and serves."""
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "state.json").write_text('{"schema_version": 1, "deploym')
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        assert list((tmp_path / "state").glob("state.json.corrupt-*"))
        assert daemon.events_named("state_warning")


def test_two_deployments_share_a_gpu_with_split_utilisation_and_boot_one_after_another(tmp_path: Path) -> None:
    """Two deployments on one GPU at 0.45 each both serve, and their boots do not overlap."""
    deployments = {
        "a": process_deployment(free_port(), gpus=[0], gpu_memory_utilization=0.45),
        "b": process_deployment(free_port(), gpus=[0], gpu_memory_utilization=0.45),
    }
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", ready)
        starts = {e["deployment"]: e["timestamp"] for e in daemon.events_named("started")}
        readies = {e["deployment"]: e["timestamp"] for e in daemon.events_named("ready")}
        first, second = sorted(starts, key=lambda name: starts[name])
        assert readies[first] <= starts[second]


def test_down_stays_down_across_daemon_restarts_until_up(tmp_path: Path) -> None:
    """A deployment taken down is stopped, stays down when the daemon restarts, and comes back with up."""
    with running_daemon(tmp_path, {"chat": process_deployment(free_port())}) as daemon:
        daemon.wait_for("chat", ready)
        pid = server_pid(daemon, "chat")
        assert daemon.request({"command": "down", "deployment": "chat"}) == {"ok": True}
        assert not alive(pid)
        assert daemon.stop() == 0
        daemon.start()
        daemon.wait_for("chat", lambda d: d["state"] == "down")
        assert daemon.request({"command": "up", "deployment": "chat"}) == {"ok": True}
        daemon.wait_for("chat", ready)


def test_up_asked_while_the_daemon_starts_gives_one_worker_and_one_server(tmp_path: Path) -> None:
    """`up NAME` answered on the control socket before the start-up loop reaches NAME (taken down before):
    one worker, one server, ready; never a second boot that finds the port held by the first."""
    from dankserve.supervisor.records import StateBook

    StateBook(tmp_path / "state").set_down("chat", True)
    deployments = {"chat": process_deployment(free_port())}
    with running_daemon(tmp_path, deployments, extra_globals={"metrics_listen": f"127.0.0.1:{free_port()}"}) as d:
        # as soon as the control socket answers, before or while the workers start
        wait_until(lambda: d.request({"command": "up", "deployment": "chat"}), 30, 0.005, what="the control socket")
        d.wait_for("chat", ready)
        # a second worker would boot again within these 2 s and find the port held
        stays_true(lambda: [e["boot"] for e in d.events_named("started")] == [1], 2.0, what=d.log_tail)
        assert not d.events_named("port_in_use") and d.deployment("chat")["state"] == "ready"  # type: ignore[index]


def test_learned_bytes_wait_for_freed_memory_and_are_refused_while_others_hold_it(tmp_path: Path) -> None:
    """A restart waits for a dead server's memory to come back; while another tenant holds it, vLLM profiles."""
    from tests.harness.daemon import write_host

    host = write_host(tmp_path / "host.json")
    globals_ = {"gpu_memory_settle_seconds": 3}
    with running_daemon(
        tmp_path, {"chat": process_deployment(free_port())}, hardware=host, extra_globals=globals_
    ) as d:
        d.wait_for("chat", ready)
        write_host(host, free_fraction=0.5)  # memory still held just after the crash ...
        os.killpg(server_pid(d, "chat"), signal.SIGKILL)
        hold_for(1.0, "the dead server's memory stays held a moment, within the 3 s settle window")
        write_host(host)  # ... and freed a moment later
        second = d.wait_for("chat", lambda s: ready(s) and s["boots"] == 2)
        assert second["kv_cache_learned_used"] is True
        write_host(host, free_fraction=0.5)  # another process keeps half the GPU
        os.killpg(server_pid(d, "chat"), signal.SIGKILL)
        third = d.wait_for("chat", lambda s: ready(s) and s["boots"] == 3)
        assert third["kv_cache_learned_used"] is False
        reasons = [e["reason"] for e in d.events_named("kv_cache_decision")]
        assert "below 99 %" in reasons[-1]


def test_an_adopted_boot_keeps_its_gpu_until_ready(tmp_path: Path) -> None:
    """A daemon killed with -9 while one of two deployments sharing a GPU boots: the next daemon adopts that boot
    and starts the other only once the adopted one is ready (boots on one GPU stay serialised)."""
    slow = {"FAKE_VLLM_TIME_SCALE": "0.1"}  # a cold boot of about 12 s: time to kill the daemon while loading
    deployments = {
        "a": process_deployment(free_port(), gpus=[0], gpu_memory_utilization=0.45, env=slow),
        "b": process_deployment(free_port(), gpus=[0], gpu_memory_utilization=0.45, env=slow),
    }
    with running_daemon(tmp_path, deployments) as daemon:
        started = wait_until(lambda: daemon.events_named("started"), 30, what="a first boot")
        booting = started[0]["deployment"]
        daemon.wait_for(booting, lambda d: d["phase"] in ("loading", "compiling", "profiling", "capturing"))
        daemon.kill()
        daemon.log_path.write_text("")  # only the next daemon's events from here
        daemon.start()
        other = "b" if booting == "a" else "a"
        daemon.wait_for(booting, ready)
        daemon.wait_for(other, ready)
        adopted = [e["deployment"] for e in daemon.events_named("adopting")]
        assert adopted == [booting]
        ready_at = next(e["timestamp"] for e in daemon.events_named("ready") if e["deployment"] == booting)
        other_started = next(e["timestamp"] for e in daemon.events_named("started") if e["deployment"] == other)
        assert ready_at <= other_started


HEALTHY_SERVER = """
import http.server, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_server_left_on_the_port_is_named_and_never_taken_for_the_new_boot(tmp_path: Path) -> None:
    """Another process answering /health on the deployment's port: the boot waits, naming it, and is not ready;
    once it is gone the deployment boots and serves (no failure counted)."""
    import subprocess
    import sys

    port = free_port()
    squatter = subprocess.Popen([sys.executable, "-c", HEALTHY_SERVER, str(port)])
    try:
        wait_until(lambda: _listening(port), 10, what=f"the squatter on port {port}")
        with running_daemon(tmp_path, {"chat": process_deployment(port)}) as daemon:
            waiting = daemon.wait_for(
                "chat", lambda d: f"port {port} is in use by pid {squatter.pid}" in (d["message"] or "")
            )
            assert waiting["state"] == "restarting"
            stays_true(
                lambda: daemon.deployment("chat")["state"] != "ready" and daemon.events_named("started") == [],  # type: ignore[index]
                1.0,
                what="no boot while the squatter holds the port",
            )
            squatter.terminate()
            squatter.wait(10)
            status = daemon.wait_for("chat", ready)
            assert status["restarts"] == 0 and status["last_failure"] is None
    finally:
        squatter.kill()
        squatter.wait(10)


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_slow_stop_says_which_step_held_it(tmp_path: Path) -> None:
    """A server whose teardown takes 4 s: SIGTERM still exits 0, and the log names the step that took the time
    (`daemon_stop_slow`, the deployments), so a stop that runs long can be read, not guessed."""
    dep = process_deployment(free_port(), env={"FAKE_VLLM_SHUTDOWN_SECONDS": "4"})
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        daemon.wait_for("chat", ready)
        assert daemon.stop() == 0
        slow = daemon.events_named("daemon_stop_slow")
        assert [e["step"] for e in slow] == ["deployments"], slow
        assert slow[0]["seconds"] >= 3.0
        assert daemon.events_named("daemon_stopped")
