"""Security: no secret (HF token, API key) shows in a log line, `podman inspect`, argv or status.

Each test starts a real daemon whose deployment has an api_key_file and an hf_token_file with
recognisable values, waits until the stand-in serves (and checks the key reached it), then
searches every place a secret could leak. The container path runs on the real Podman service.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from dankserve.runtime.base import workload_name
from dankserve.testing.gpus import StandInGpus
from dankserve.testing.podman_service import PodmanEnv
from tests.harness.daemon import container_deployment, free_port, process_deployment, running_daemon, write_host

pytestmark = pytest.mark.slow

HF_TOKEN = "hf_dankserveSECRETtoken0123456789abcdef"
API_KEY = "sk-dankserveSECRETkey0123456789abcdef"


def settled(d: dict[str, Any]) -> bool:
    return d["state"] in ("ready", "failed")


def write_secrets(tmp_path: Path) -> dict[str, str]:
    """An API key file and an HF token file (0600 in a 0700 dir), as the settings keys naming them."""
    directory = tmp_path / "secrets"
    directory.mkdir(mode=0o700)
    key, token = directory / "api.key", directory / "hf.token"
    for path, value in ((key, API_KEY), (token, HF_TOKEN)):
        path.write_text(value + "\n")
        path.chmod(0o600)
    return {"api_key_file": str(key), "hf_token_file": str(token)}


def assert_no_secret(where: str, text: str) -> None:
    for name, secret in (("HF token", HF_TOKEN), ("API key", API_KEY)):
        assert secret not in text, f"the {name} shows in {where}"


def every_argv() -> str:
    """The command lines of every process on the machine (containers' processes included)."""
    lines = []
    for proc in psutil.process_iter(["cmdline"]):
        lines.append(" ".join(proc.info["cmdline"] or []))
    return "\n".join(lines)


def cli_status(config: Path) -> str:
    """`dankserve status` and `dankserve status --json`, as a user runs them."""
    out = []
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(config), "status", *extra],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out.append(done.stdout + done.stderr)
    return "\n".join(out)


def models_status(port: int, key: str | None) -> int:
    """HTTP status of GET /v1/models, with the key as a bearer token or without one."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_container_path_keeps_secrets_out_of_logs_inspect_argv_and_status(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """With Podman the key reaches vLLM, yet no log, inspect, argv or status shows a secret; the port is loopback."""
    port = free_port()
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    dep = container_deployment(vllm_image, port, gpus=[0], **write_secrets(tmp_path))
    globals_ = {"podman_url": podman_env.url}
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        status = daemon.wait_for(deployment, settled, timeout=120)
        assert status["state"] == "ready", status["message"]
        assert models_status(port, None) == 401
        assert models_status(port, API_KEY) == 200
        name = workload_name(deployment)
        inspect = podman_env.podman("inspect", name).stdout
        assert_no_secret("podman inspect", inspect)
        logs = podman_env.podman("logs", name)
        assert logs.stdout or logs.stderr
        assert_no_secret("the container log", logs.stdout + logs.stderr)
        assert_no_secret("a process's argv", every_argv())
        assert_no_secret("dankserve status", cli_status(daemon.config))
        inspected = json.loads(inspect)[0]
        # Loopback: the host's network, bound to 127.0.0.1 by vLLM itself; nothing published.
        assert inspected["HostConfig"]["NetworkMode"] == "host" and not inspected["HostConfig"].get("PortBindings")
        args = inspected["Args"]
        assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == str(port)
    assert_no_secret("the daemon log", daemon.log_path.read_text(errors="replace"))
    assert_no_secret("the Podman service log", podman_env.service_log.read_text(errors="replace"))


def test_process_path_keeps_secrets_out_of_argv_logs_records_and_status(tmp_path: Path) -> None:
    """With the process runtime, the key reaches vLLM, yet argv, logs, records and status show no secret."""
    port = free_port()
    dep = process_deployment(port, **write_secrets(tmp_path))
    with running_daemon(tmp_path, {"chat": dep}) as daemon:
        status = daemon.wait_for("chat", settled)
        assert status["state"] == "ready", status["message"]
        assert models_status(port, None) == 401
        assert models_status(port, API_KEY) == 200
        assert_no_secret("a process's argv", every_argv())
        assert_no_secret("dankserve status", cli_status(daemon.config))
        for path in sorted((daemon.state_dir / "processes").iterdir()):
            assert_no_secret(str(path), path.read_text(errors="replace"))
        assert_no_secret("state.json", (daemon.state_dir / "state.json").read_text())
    assert_no_secret("the daemon log", daemon.log_path.read_text(errors="replace"))
