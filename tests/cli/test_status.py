"""`dankserve status` through the real CLI against a real daemon (the stand-in vLLM as a process)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from tests.harness.daemon import dankserve_cli, free_port, process_deployment, running_daemon, write_host
from tests.harness.terminal import run_in_terminal

pytestmark = pytest.mark.slow


def _ready(d: dict[str, object]) -> bool:
    return d["state"] == "ready"


def test_status_is_a_row_per_deployment_with_details_under_its_name_and_colour_only_on_a_terminal(
    tmp_path: Path,
) -> None:
    """Two deployments: a header and one row each (no `ready (ready)`, no None, no `?`); `status NAME` the details;
    an unknown NAME exit 2; colour on a terminal, none piped or with NO_COLOR; `--json` keeps its shape."""
    deployments = {"chat": process_deployment(free_port()), "embed": process_deployment(free_port(), gpus=[1])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("chat", _ready)
        daemon.wait_for("embed", _ready)
        done = dankserve_cli(daemon.config, "status")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert len(lines) == 4 and lines[0].startswith("daemon: running (pid ")
        assert lines[1].split() == [
            "NAME",
            "STATE",
            "MODEL",
            "PORT",
            "GPU",
            "MEM",
            "UPTIME",
            "BOOTS",
            "BOOT",
            "s",
            "KV",
            "WHY",
        ]
        assert lines[2].split()[:4] == ["chat", "ready", "test/tiny", str(deployments["chat"]["port"])]
        for bad in ("ready (ready)", "None", " ? ", "\x1b["):
            assert bad not in done.stdout

        one = dankserve_cli(daemon.config, "status", "chat")
        assert one.returncode == 0 and "chat: ready, up " in one.stdout and "embed" not in one.stdout
        assert "vLLM 0.33.0" in one.stdout and "compile cache" in one.stdout and "None" not in one.stdout
        unknown = dankserve_cli(daemon.config, "status", "nosuch")
        assert unknown.returncode == 2 and "unknown deployment 'nosuch'" in unknown.stderr

        argv = [sys.executable, "-m", "dankserve", "--config", str(daemon.config), "status"]
        coloured = run_in_terminal(argv, env={"DANKSERVE_CONFIG": ""})
        assert coloured.returncode == 0 and "\x1b[32mready" in coloured.output
        plain = run_in_terminal(argv, env={"DANKSERVE_CONFIG": "", "NO_COLOR": "1"})
        assert plain.returncode == 0 and "\x1b[" not in plain.output and "ready" in plain.output

        doc = json.loads(dankserve_cli(daemon.config, "status", "--json").stdout)
        assert {"daemon", "deployments", "warnings"} <= set(doc) and len(doc["deployments"]) == 2
        assert {"state", "phase", "endpoint", "uptime_seconds", "rests", "why"} <= set(doc["deployments"][0])


def test_status_after_the_daemon_is_killed_says_how_many_servers_still_serve_and_uptime_survives_adoption(
    tmp_path: Path,
) -> None:
    """kill -9 of the daemon: status says "daemon not running; 1 server still serving" with the row `serving`;
    a new daemon adopts the server and its uptime goes on from before, not from the adoption."""
    deployments = {"chat": process_deployment(free_port())}
    with running_daemon(tmp_path, deployments) as daemon:
        first = daemon.wait_for("chat", lambda d: _ready(d) and (d["uptime_seconds"] or 0) >= 2)
        daemon.kill()
        offline = dankserve_cli(daemon.config, "status")
        assert offline.returncode == 0, offline.stderr
        assert offline.stdout.startswith("daemon not running; 1 server still serving")
        assert " serving " in offline.stdout.splitlines()[2] and "`dankserve up` adopts it" in offline.stdout
        assert json.loads(dankserve_cli(daemon.config, "status", "--json").stdout)["deployments"][0]["state"] == (
            "serving"
        )
    with running_daemon(tmp_path, deployments) as again:
        adopted = again.wait_for("chat", _ready)
        assert again.events_named("adopting"), "the server was adopted, not restarted"
        assert adopted["uptime_seconds"] >= first["uptime_seconds"]


def test_status_after_the_daemon_is_killed_tells_a_sleeping_swap_member_from_a_serving_one(tmp_path: Path) -> None:
    """kill -9 of the daemon of a swap pair: the awake member's row says serving, the sleeping one's asleep,
    and the first line counts both ("1 server still serving, 1 asleep")."""
    swap = {"swap_group": "g", "gpu_memory_utilization": 0.9}
    deployments = {"chat": process_deployment(free_port(), **swap), "code": process_deployment(free_port(), **swap)}
    with running_daemon(tmp_path, deployments) as daemon:
        for name in deployments:
            daemon.wait_for(name, lambda d: d["state"] in ("ready", "asleep"))
        awake = next(d["name"] for d in daemon.status()["deployments"] if d["state"] == "ready")  # type: ignore[index]
        daemon.kill()
        offline = dankserve_cli(daemon.config, "status", "--json")
        states = {d["name"]: d["state"] for d in json.loads(offline.stdout)["deployments"]}
        assert states == {name: ("serving" if name == awake else "asleep") for name in deployments}
        shown = dankserve_cli(daemon.config, "status").stdout
        assert shown.startswith("daemon not running; 1 server still serving, 1 asleep"), shown
        assert "(its server sleeps)" in shown
    with running_daemon(tmp_path, deployments) as again:  # adopted as they were; stopped cleanly at the end
        again.wait_for(awake, _ready)


def test_a_refusal_of_a_file_whose_keys_are_valid_is_not_said_to_be_applied_by_a_reload() -> None:
    """The daemon refused the file for its plan (a broken adapter): status does not promise that a reload applies it."""
    from dankserve.cli.status import config_lines

    refused = {
        "at": 0.0,
        "error": "deployments.chat.adapters.sql: rank r = 1000 ...",
        "fix": "point the adapter at ...",
    }
    daemon = {"config": {"loaded_at": 0.0, "refused": refused, "on_disk": {"valid": True}}}
    lines = config_lines(daemon)
    assert "rank r = 1000" in lines[0]
    assert "validates now" not in lines[1] and "unless what it plans is refused again" in lines[1], lines
    assert "fix: point the adapter at ..." in lines[1], lines


def test_status_at_80_columns_keeps_why_whole_and_shows_gpu_memory_idle_countdown_and_the_gateway(
    tmp_path: Path,
) -> None:
    """Issue 39.11: at COLUMNS=80 no line is wider and WHY is whole (under its row, not `swa…`; a long model
    name is cut instead, `status NAME` has it whole); each row has
    the GPU memory its server holds (the stand-in's per-process NVML readings) and an awake member with
    idle_sleep_seconds its countdown (SLEEPS IN); a line says where the gateway listens and that it is up,
    and once the daemon stopped, that it is down."""
    gateway = free_port()
    host = write_host(tmp_path / "host.json")
    nvml = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
    member = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "pair", "env": nvml}
    model = "an-organisation/a-rather-long-model-name-7B-Instruct"
    deployments = {
        "alpha": process_deployment(free_port(), model=model, idle_sleep_seconds=3600, **member),
        "beta": process_deployment(free_port(), served_model_name="beta", **member),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        for name in deployments:
            daemon.wait_for(name, lambda d: d["state"] in ("ready", "asleep"))
        woken = dankserve_cli(daemon.config, "wake", "alpha", "--json")  # alpha awake (its countdown runs)
        assert woken.returncode == 0, woken.stderr
        daemon.wait_for("beta", lambda d: d["state"] == "asleep")
        # issue 39 (low): `wake --json` is `status NAME --json`'s document, and a process deployment has no image
        woken_doc = json.loads(woken.stdout)
        status_doc = json.loads(dankserve_cli(daemon.config, "status", "alpha", "--json").stdout)
        assert set(woken_doc) == set(status_doc) and [d["name"] for d in woken_doc["deployments"]] == ["alpha"]
        assert {s["deployment"] for s in status_doc["swaps"]} <= {"alpha"}  # NAME's swaps only
        assert set(woken_doc["deployments"][0]) == set(status_doc["deployments"][0])
        assert woken_doc["deployments"][0]["state"] == "ready" and woken_doc["deployments"][0]["image"] is None
        asleep, awake = "beta", "alpha"
        done = dankserve_cli(daemon.config, "status", env={"COLUMNS": "80"})
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), done.stdout
        assert "swa…" not in done.stdout and "-7B-Instruct" not in done.stdout  # the long model is cut, not WHY
        assert lines[1] == f"gateway: up at http://127.0.0.1:{gateway}/v1"
        header = lines[2]
        assert "GPU MEM" in header and "WHY" not in header
        why = json.loads(dankserve_cli(daemon.config, "status", "--json").stdout)
        sentence = next(d["why"] for d in why["deployments"] if d["name"] == asleep)
        assert ("beta", "sleep") in {(s["deployment"], s["kind"]) for s in why["swaps"]}  # every member's
        assert sentence.startswith("swap group pair, asleep")
        assert sentence in " ".join(line.strip().removeprefix("why: ") for line in lines[3:]), done.stdout
        row = {line.split()[0]: line for line in lines[3:] if line.split()[0] in deployments}
        held = row[awake].split()[header.split().index("GPU")]
        assert held.endswith("G") and float(held[:-1]) > 100, row[awake]  # 0.9 of an H200, held by its server
        assert "SLEEPS IN" in header and ("59m" in row["alpha"] or "1h00m" in row["alpha"]), done.stdout
        one = json.loads(dankserve_cli(daemon.config, "status", awake, "--json").stdout)["deployments"][0]
        assert one["gpu_memory_held_bytes"] > 100 * 2**30
        detail = dankserve_cli(daemon.config, "status", "alpha").stdout
        assert "sleeps after 3600 s idle: sleeps in " in detail, detail
        assert "GPU memory held by its server: " in detail
    stopped = dankserve_cli(daemon.config, "status")
    assert f"gateway: down: nothing accepts connections on 127.0.0.1:{gateway}" in stopped.stdout
    with socket.create_server(("127.0.0.1", gateway)):  # another program on the address: not "up"
        squatted = dankserve_cli(daemon.config, "status")
    assert f"gateway: 127.0.0.1:{gateway} accepts connections but no dankserve daemon runs" in squatted.stdout


def test_an_adopted_server_keeps_its_kv_source_and_boot_seconds(tmp_path: Path) -> None:
    """Issue 39 (low): chat's second boot used its learned KV bytes; the daemon is killed with -9 and the next one
    adopts the server: status still says `learned` and the last boot's seconds (which the new daemon never saw)."""
    deployments = {"chat": process_deployment(free_port())}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=120)
        assert daemon.cli("restart", "chat").returncode == 0
        before = daemon.wait_for("chat", lambda d: d["state"] == "ready" and d["boots"] == 2)
        assert before["kv_cache_source"] == "learned" and before["last_boot"]["seconds"] is not None, before
        daemon.kill()
    with running_daemon(tmp_path, deployments) as again:
        after = again.wait_for("chat", lambda d: d["state"] == "ready", timeout=60)
        assert after["boots"] == 2, "adopted, not booted again"
        assert after["kv_cache_source"] == "learned", after
        assert after["last_boot"] == before["last_boot"], after
        table = again.cli("status")
        row = next(line for line in table.stdout.splitlines() if line.startswith("chat "))
        assert f"{before['last_boot']['seconds']:.1f}" in row, table.stdout
