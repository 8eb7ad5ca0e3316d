"""`dankserve reload`, and the read-only commands while the config file on disk is refused: the real CLI
against a real daemon (process runtime, the stand-in vLLM, a recorded host)."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.harness.daemon import RunningDaemon, free_port, process_deployment, running_daemon


def ready(dep: dict[str, Any]) -> bool:
    return bool(dep["state"] == "ready")


def with_key(text: str, deployment: str, line: str) -> str:
    """The config text with one more line in a deployment's table."""
    header = f"[deployments.{deployment}]\n"
    assert header in text
    return text.replace(header, header + line + "\n")


def refused(daemon: RunningDaemon) -> dict[str, Any] | None:
    status = daemon.status()
    assert status is not None
    config: dict[str, Any] = status["daemon"]["config"]
    return config["refused"]  # type: ignore[no-any-return]


def wait_until(predicate: Any, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_refused_config_on_disk_leaves_status_logs_and_reload_working_against_the_running_daemon(
    tmp_path: Path,
) -> None:
    """A typo'd key on disk: `reload` exits 2 with the reason; `status` (text and --json), `logs` and `sleep` still
    reach the daemon and status names the refusal; the file fixed, `reload` is accepted and says which deployment
    restarts and which keeps running; SIGHUP (systemctl reload) still refuses and accepts the same way."""
    deployments = {"a": process_deployment(free_port(), gpus=[0]), "b": process_deployment(free_port(), gpus=[1])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        daemon.wait_for("b", ready)
        good = daemon.config.read_text()
        daemon.config.write_text(with_key(good, "b", "max_num_seq = 64"))

        done = daemon.cli("reload")
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert "refused" in done.stderr and "max_num_seq" in done.stderr and "max_num_seqs" in done.stderr

        done = daemon.cli("status")
        assert done.returncode == 0, done.stderr
        assert "the config on disk was refused at " in done.stdout and "max_num_seq" in done.stdout
        assert "; running the config loaded at " in done.stdout
        assert re.search(r"^a +ready ", done.stdout, re.M) and re.search(r"^b +ready ", done.stdout, re.M), done.stdout

        done = daemon.cli("status", "--json")
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        assert "max_num_seq" in doc["daemon"]["config"]["refused"]["error"]
        assert doc["daemon"]["config"]["on_disk"]["valid"] is False
        assert {d["name"]: d["state"] for d in doc["deployments"]} == {"a": "ready", "b": "ready"}

        done = daemon.cli("logs", "-n", "20")
        assert done.returncode == 0, done.stderr
        done = daemon.cli("sleep", "a")  # the daemon's own settings answer: a is in no swap group
        assert done.returncode == 2 and "in no swap group" in done.stderr, done.stderr

        daemon.config.write_text(with_key(good, "b", "max_num_seqs = 64"))
        done = daemon.cli("reload")
        assert done.returncode == 0, done.stderr
        assert "reload accepted" in done.stdout
        assert "b: restarts with the new settings" in done.stdout and "a: keeps running" in done.stdout
        daemon.wait_for("b", lambda d: ready(d) and d["boots"] == 2)
        assert daemon.deployment("a")["boots"] == 1  # type: ignore[index]
        done = daemon.cli("status")
        assert done.returncode == 0 and "refused" not in done.stdout, done.stdout

        # systemctl reload is SIGHUP (ExecReload): refused and accepted alike, reported in status
        daemon.config.write_text(with_key(good, "a", "max_model_len = 'lots'"))
        daemon.signal(signal.SIGHUP)
        assert wait_until(lambda: refused(daemon) is not None), daemon.log_tail()
        assert "max_model_len" in refused(daemon)["error"]  # type: ignore[index]
        daemon.config.write_text(good)
        daemon.signal(signal.SIGHUP)
        assert wait_until(lambda: refused(daemon) is None), daemon.log_tail()


def test_reload_without_a_running_daemon_says_so_with_exit_3(tmp_path: Path) -> None:
    """No daemon: `reload` exits 3 saying nothing runs and how to start it."""
    deployments = {"a": process_deployment(free_port(), gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        assert daemon.stop() == 0
        done = daemon.cli("reload")
    assert done.returncode == 3, done.stderr
    assert "not running" in done.stderr and "dankserve up" in done.stderr
