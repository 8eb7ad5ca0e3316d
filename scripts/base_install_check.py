#!/usr/bin/env python3
"""CI check that the base install runs: `pip install .` (no extras) into a fresh venv, then one
`dankserve install` (into temporary directories: the unit and the example config ship with the package),
then one stand-in deployment through that venv's `dankserve run` (process runtime, a recorded host, the
stand-in vLLM as `vllm` on PATH) until ready, then SIGTERM and a clean stop.

A runtime dependency missing from [project.dependencies] fails here, as it would for a user.
Standard library only: it must not import the checkout's dankserve. `make base-install-check`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "base-install"
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
HOST = REPO / "dankserve" / "testing" / "hosts" / "h200x2-vm-real.json"
READY_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def fail(message: str, log: Path | None = None) -> None:
    print(f"base-install-check: FAILED: {message}", file=sys.stderr)
    if log is not None and log.exists():
        print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:]), file=sys.stderr)
    sys.exit(1)


def status(dankserve: Path, config: Path, env: dict[str, str]) -> dict[str, object] | None:
    done = subprocess.run(
        [str(dankserve), "--config", str(config), "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=WORK,
        check=False,
    )
    try:
        document: dict[str, object] = json.loads(done.stdout)
    except ValueError:
        return None
    return document


def deployment_state(document: dict[str, object] | None) -> str | None:
    deployments = document.get("deployments") if document else None
    if not isinstance(deployments, list) or not deployments:
        return None
    state = deployments[0].get("state")
    return str(state) if state is not None else None


def main() -> int:
    shutil.rmtree(WORK, ignore_errors=True)
    (WORK / "bin").mkdir(parents=True)
    started = time.monotonic()
    venv.create(WORK / "venv", with_pip=True)
    pip = WORK / "venv" / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", "--no-cache-dir", str(REPO)], check=True)
    dankserve = WORK / "venv" / "bin" / "dankserve"
    installed = WORK / "installed"  # `dankserve install` needs the unit and the example shipped in the package
    argv = [str(dankserve), "install", "--no-enable", "--unit-dir", str(installed / "units")]
    argv += ["--config-dir", str(installed / "etc"), "--man-dir", str(installed / "man")]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, cwd=WORK)
    example = installed / "etc" / "dankserve.toml"
    if done.returncode != 0 or "[deployments." not in (example.read_text() if example.exists() else ""):
        fail(f"`dankserve install` exited with {done.returncode} or wrote no example config: {done.stderr[-2000:]}")
    (WORK / "bin" / "vllm").symlink_to(STAND_IN)
    config = WORK / "dankserve.toml"
    config.write_text(
        f'state_dir = "{WORK / "state"}"\ncache_dir = "{WORK / "cache"}"\nhf_cache_dir = "{WORK / "hf"}"\n'
        'vllm_version = "0.33.0"\n\n[deployments.base]\nmodel = "test/tiny"\nruntime = "process"\n'
        f'executable = "vllm"\nport = {free_port()}\nenv = {{ FAKE_VLLM_TIME_SCALE = "0.02" }}\n'
        "model_facts = { parameter_bytes = 2000000000, num_attention_heads = 32, num_key_value_heads = 8, "
        "num_hidden_layers = 16, head_dim = 64, max_position_embeddings = 8192 }\n"
    )
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DANKSERVE_", "NOTIFY_SOCKET", "VIRTUAL_ENV"))}
    env["PATH"] = f"{WORK / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    log = WORK / "daemon.log"
    argv = [str(dankserve), "--config", str(config), "run", "--hardware", str(HOST), "--log-format", "json"]
    with log.open("wb") as out:
        daemon = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=WORK)
    try:
        deadline = time.monotonic() + READY_SECONDS
        state = None
        while state != "ready":
            if daemon.poll() is not None:
                fail(f"`dankserve run` exited with {daemon.returncode} before the deployment was ready", log)
            if state == "failed" or time.monotonic() > deadline:
                fail(f"the deployment did not get ready within {READY_SECONDS:.0f}s (state {state})", log)
            time.sleep(0.5)
            state = deployment_state(status(dankserve, config, env))
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(60)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    if code != 0:
        fail(f"`dankserve run` exited with {code} on SIGTERM (expected 0)", log)
    left = [path.name for path in (WORK / "state").rglob("*.json") if path.parent.name == "processes"]
    if left:
        fail(f"a server record was left after the stop: {left}", log)
    seconds = time.monotonic() - started
    print(
        f"base-install-check: ok: `pip install .`, `dankserve install`, a stand-in boot to ready and a clean stop"
        f" in {seconds:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
