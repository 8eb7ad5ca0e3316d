"""`dankserve reload`, and the read-only commands while the config file on disk is refused: the real CLI
against a real daemon (process runtime, the stand-in vLLM, a recorded host)."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.request
from pathlib import Path
from typing import Any

from tests.harness.daemon import (
    RunningDaemon,
    daemon_globals,
    free_port,
    process_deployment,
    running_daemon,
    write_config,
)
from tests.harness.wait import wait_until


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
        wait_until(lambda: refused(daemon) is not None, 30, 0.1, what=daemon.log_tail)
        assert "max_model_len" in refused(daemon)["error"]  # type: ignore[index]
        daemon.config.write_text(good)
        daemon.signal(signal.SIGHUP)
        wait_until(lambda: refused(daemon) is None, 30, 0.1, what=daemon.log_tail)


def test_reload_without_a_running_daemon_says_so_with_exit_3(tmp_path: Path) -> None:
    """No daemon: `reload` exits 3 saying nothing runs and how to start it."""
    deployments = {"a": process_deployment(free_port(), gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        assert daemon.stop() == 0
        done = daemon.cli("reload")
    assert done.returncode == 3, done.stderr
    assert "not running" in done.stderr and "dankserve up" in done.stderr


def running_settings(daemon: RunningDaemon) -> dict[str, Any]:
    """The settings the daemon runs with (its `settings` request, what the CLI reads)."""
    reply = daemon.request({"command": "settings"})
    assert reply is not None and reply["ok"], reply
    settings: dict[str, Any] = reply["settings"]
    return settings


def test_a_reload_applies_a_global_key_that_takes_effect_at_its_next_use(tmp_path: Path) -> None:
    """stop_timeout_seconds changed: `reload` names it applied, the daemon runs with the new value, nothing
    restarts and nothing waits for a daemon restart."""
    deployments = {"a": process_deployment(free_port(), gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        write_config(daemon.config, daemon_globals(tmp_path, {"stop_timeout_seconds": 7.0}), deployments)
        done = daemon.cli("reload")
        assert done.returncode == 0, done.stderr
        assert "applied: stop_timeout_seconds" in done.stdout and "a: keeps running" in done.stdout, done.stdout
        assert "restart the daemon" not in done.stdout
        assert running_settings(daemon)["stop_timeout_seconds"] == 7.0
        doc = json.loads(daemon.cli("status", "--json").stdout)
        assert doc["daemon"]["config"]["needs_restart"] == []
        assert daemon.deployment("a")["boots"] == 1  # type: ignore[index]


def test_a_reload_keeps_a_global_key_that_needs_a_restart_and_says_so(tmp_path: Path) -> None:
    """metrics_listen set by a reload: the new deployment starts, but no metrics endpoint appears, the daemon keeps
    running without one everywhere, and `reload` (and SIGHUP), `status` and `status --json` say
    "restart the daemon to apply: metrics_listen"; after a restart the endpoint serves."""
    first = {"a": process_deployment(free_port(), gpus=[0])}
    with running_daemon(tmp_path, first) as daemon:
        daemon.wait_for("a", ready)
        metrics = free_port()
        both = {**first, "b": process_deployment(free_port(), gpus=[1])}
        changed = daemon_globals(tmp_path, {"metrics_listen": f"127.0.0.1:{metrics}"})
        write_config(daemon.config, changed, both)
        done = daemon.cli("reload")
        assert done.returncode == 0, done.stderr
        assert "b: starts" in done.stdout and "restart the daemon to apply: metrics_listen" in done.stdout, done.stdout
        daemon.wait_for("b", ready)
        assert running_settings(daemon)["metrics_listen"] is None
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", metrics)) != 0  # nothing bound it

        done = daemon.cli("status")
        assert done.returncode == 0 and "restart the daemon to apply: metrics_listen" in done.stdout, done.stdout
        doc = json.loads(daemon.cli("status", "--json").stdout)
        assert doc["daemon"]["config"]["needs_restart"] == ["metrics_listen"]

        daemon.signal(signal.SIGHUP)  # the same file again: still waiting, named in the log
        wait_until(lambda: len(daemon.events_named("reload_needs_restart")) >= 2, 30, 0.1, what=daemon.log_tail)
        assert daemon.events_named("reload_needs_restart")[-1]["keys"] == ["metrics_listen"]
        assert daemon.stop() == 0

    with running_daemon(tmp_path, both, extra_globals={"metrics_listen": f"127.0.0.1:{metrics}"}) as daemon:
        daemon.wait_for("a", ready)
        doc = json.loads(daemon.cli("status", "--json").stdout)
        assert doc["daemon"]["config"]["needs_restart"] == []
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as answer:
            assert b"dankserve" in answer.read()


def adapter_dir(root: Path) -> str:
    """A rank-8 LoRA adapter directory the stand-in loads."""
    root.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (root / "adapter_config.json").write_text(json.dumps(config))
    (root / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
    return str(root)


def test_a_reload_names_the_adapters_it_loaded_and_unloaded_in_the_running_server(tmp_path: Path) -> None:
    """Adapters swapped in place: `reload` says which it loaded, unloaded and replaced (a new source), text and
    --json alike, and the server keeps its one boot."""
    a1, a2, a2_new, a3 = (adapter_dir(tmp_path / n) for n in ("a1", "a2", "a2-new", "a3"))
    port = free_port()
    first = {"chat": process_deployment(port, gpus=[0], adapters={"a1": a1})}
    with running_daemon(tmp_path, first) as daemon:
        daemon.wait_for("chat", ready)
        write_config(daemon.config, daemon_globals(tmp_path), {"chat": {**first["chat"], "adapters": {"a2": a2}}})
        done = daemon.cli("reload")
        assert done.returncode == 0, done.stderr
        assert "chat: keeps running" in done.stdout, done.stdout
        assert "chat: adapters loaded in place: a2; unloaded: a1" in done.stdout, done.stdout

        changed = {"chat": {**first["chat"], "adapters": {"a2": a2_new, "a3": a3}}}
        write_config(daemon.config, daemon_globals(tmp_path), changed)
        done = daemon.cli("reload", "--json")
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout)
        assert outcome["keep"] == ["chat"] and outcome["restart"] == []
        assert outcome["adapters"] == {"chat": {"loaded": ["a3"], "unloaded": [], "replaced": ["a2"]}}
        served = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10).read())
        assert {m["id"] for m in served["data"]} == {"test/tiny", "a2", "a3"}
        assert daemon.deployment("chat")["boots"] == 1  # type: ignore[index]


def test_status_and_plan_say_when_the_config_on_disk_differs_from_the_running_one(tmp_path: Path) -> None:
    """Issue 39 (low): the file edited (valid) but not reloaded: `status` says the config on disk differs and
    names what (a deployment, a global key), `status --json` lists it under `on_disk.pending`, `plan` notes it on
    stderr; after `reload` all three are silent."""
    deployments = {"a": process_deployment(free_port(), gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("a", ready)
        assert "differs" not in daemon.cli("status").stdout
        edited = {"a": {**deployments["a"], "max_num_seqs": 32}}
        write_config(daemon.config, daemon_globals(tmp_path, {"stop_timeout_seconds": 7.0}), edited)
        shown = daemon.cli("status")
        assert shown.returncode == 0, shown.stderr
        line = "the config on disk differs from the running one (stop_timeout_seconds, deployments.a): "
        assert line + "`dankserve reload` applies it" in shown.stdout, shown.stdout
        doc = json.loads(daemon.cli("status", "--json").stdout)
        assert doc["daemon"]["config"]["on_disk"]["pending"] == ["stop_timeout_seconds", "deployments.a"]
        planned = daemon.cli("plan", "a", "--hardware", str(daemon.hardware))
        assert planned.returncode == 0, planned.stderr
        assert "note: this plans the file; the config on disk differs" in planned.stderr, planned.stderr
        assert daemon.cli("reload").returncode == 0
        assert "differs" not in daemon.cli("status").stdout
        assert "differs" not in daemon.cli("plan", "a", "--hardware", str(daemon.hardware)).stderr
