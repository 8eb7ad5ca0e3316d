"""config/try-it.toml, booted as docs/TRY-IT.md says (the real CLI, a background daemon, the stand-in vLLM as
the process runtime's `vllm`, a recorded host): the gateway serves all three and the swap group swaps."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemon import BASE_HOST, STAND_IN, free_port
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
TRY_IT = REPO / "config" / "try-it.toml"
DOCS = REPO / "docs" / "TRY-IT.md"


def test_the_try_it_config_boots_serves_through_the_gateway_and_swaps_the_pair(tmp_path: Path) -> None:
    """The documented steps boot config/try-it.toml: `up chat` returns with chat serving, the gateway answers for
    each deployment (waking the sleeping member of the pair, which puts the other to sleep), `down` stops all."""
    text = TRY_IT.read_text().replace("/tmp/dankserve-try-it", str(tmp_path))
    for fixed in ("19400", "19000", "18001", "18002", "18003"):
        assert fixed in text
        text = text.replace(fixed, str(free_port()))
    config = tmp_path / "dankserve.toml"
    config.write_text(text)
    config.chmod(0o600)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").symlink_to(STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DANKSERVE_", "NOTIFY_SOCKET"))}
    env.update(
        PATH=f"{tmp_path / 'bin'}:{env['PATH']}", DANKSERVE_CONFIG=str(config), DANKSERVE_HARDWARE=str(BASE_HOST)
    )

    dankserve = cli_in(env)

    gateway = next(line.split('"')[1] for line in text.splitlines() if line.startswith("listen = "))
    try:
        up = dankserve("up", "chat", "--timeout", "90")
        assert up.returncode == 0, up.stdout + up.stderr
        assert "chat: ready, serving at http://127.0.0.1:" in up.stdout
        states = wait_for(dankserve, lambda s: s["alpha"] in ("ready", "asleep") and s["beta"] in ("ready", "asleep"))
        assert sorted([states["alpha"], states["beta"]]) == ["asleep", "ready"]
        asleep = "alpha" if states["alpha"] == "asleep" else "beta"
        for model in ("try-it/chat", f"try-it/{asleep}"):
            assert complete(gateway, model)["model"] == model
        after = wait_for(dankserve, lambda s: s[asleep] == "ready" and "asleep" in (s["alpha"], s["beta"]))
        assert after["chat"] == "ready"
    finally:
        down = dankserve("down")
    assert down.returncode == 0 and "dankserve stopped" in down.stdout, down.stdout + down.stderr
    assert not list((tmp_path / "state" / "processes").glob("*.json")), "a server was left running"
    assert "dankserve up chat" in DOCS.read_text() and "config/try-it.toml" in DOCS.read_text()


def cli_in(env: dict[str, str], timeout: float = 120) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`dankserve ARGS...` as a terminal with `env` runs it: its exit code and output (never raises on the code)."""

    def dankserve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dankserve", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )

    return dankserve


def wait_for(dankserve: Any, predicate: Any, timeout: float = 90) -> dict[str, str]:
    """Poll `status --json` until predicate(state by deployment) holds; the states then."""
    states: dict[str, str] = {}

    def reached() -> dict[str, str] | None:
        nonlocal states
        done = dankserve("status", "--json")
        if done.returncode == 0:
            states = {d["name"]: d["state"] for d in json.loads(done.stdout)["deployments"]}
            if predicate(states):
                return states
        return None

    return wait_until(reached, timeout, 0.3, what=lambda: f"the states; last {states}")


def complete(gateway: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{gateway}/v1/completions", body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def _env_of(workdir: Path) -> dict[str, str]:
    """The environment a terminal has after `. D/env.sh` (the exports `make try-it` prints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DANKSERVE_", "NOTIFY_SOCKET"))}
    script = f". {workdir / 'env.sh'} && env -0"
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=True)
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)


def _try_it(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dankserve.testing.try_it", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_make_try_it_gives_each_copy_its_own_ports_and_plan_and_status_agree(tmp_path: Path) -> None:
    """Issue 39 (low): `make try-it` writes a private copy with free ports (a second user's never clashes), the
    exports in env.sh; booted from them, status's context and KV tokens are the plan's (the stand-in loads what
    model_facts declares) and each server's GPU memory shows; a copy is refused while its daemon runs."""
    first, second = _try_it("--dir", str(tmp_path / "a")), _try_it("--dir", str(tmp_path / "b"))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert f". {tmp_path / 'a' / 'env.sh'}" in first.stdout and "export DANKSERVE_CONFIG=" in first.stdout
    configs = [tomllib.loads((tmp_path / d / "dankserve.toml").read_text()) for d in ("a", "b")]
    ports = [
        {c["metrics_listen"], c["gateway"]["listen"], *(d["port"] for d in c["deployments"].values())} for c in configs
    ]
    assert len(ports[0]) == 5 and not ports[0] & ports[1], ports
    assert "/tmp/dankserve-try-it" not in (tmp_path / "a" / "dankserve.toml").read_text()
    assert (
        "try-it: setup" in (REPO / "Makefile").read_text()
        and "dankserve.testing.try_it --podman" in (REPO / "Makefile").read_text()
    )

    env = _env_of(tmp_path / "a")

    dankserve = cli_in(env)

    try:
        up = dankserve("up", "chat", "--timeout", "90")
        assert up.returncode == 0, up.stdout + up.stderr
        plan = json.loads(dankserve("plan", "chat", "--json").stdout)
        status = json.loads(dankserve("status", "chat", "--json").stdout)["deployments"][0]
        promised = plan[0]["capacity"]
        assert status["context_tokens"] == promised["context_tokens"] == 8192, status  # 131,072 before
        assert abs(status["kv_cache_tokens"] - promised["kv_cache_tokens"]) < 0.01 * promised["kv_cache_tokens"]
        assert status["gpu_memory_held_bytes"] > 100 * 2**30, status
        assert _try_it("--dir", str(tmp_path / "a")).returncode == 3  # its daemon runs: not overwritten
        # one word for a deployment taken down (issue 39, low): status and the gateway's /v1/models say `down`
        assert dankserve("down", "chat").returncode == 0
        assert json.loads(dankserve("status", "chat", "--json").stdout)["deployments"][0]["state"] == "down"
        with urllib.request.urlopen(f"{env['GATEWAY']}/v1/models", timeout=30) as response:
            models = {m["id"]: m for m in json.loads(response.read())["data"]}
        assert models["try-it/chat"]["state"] == "down", models["try-it/chat"]
    finally:
        down = dankserve("down")
    assert down.returncode == 0, down.stdout + down.stderr


@pytest.mark.podman
def test_make_try_it_podman_sets_up_stand_in_gpus_and_a_private_podman_service_until_ctrl_c(tmp_path: Path) -> None:
    """Issue 39.8: TRY-IT's Podman paragraph left out the API service and the GPUs, so `up` failed. `make
    try-it-podman` sets up stand-in GPUs (nodes and a CDI spec), a private Podman service and the image: doctor
    says the deployments' GPU devices are ok, `up chat` serves from a container; Ctrl-C removes it all."""
    from dankserve.testing.podman_service import missing_requirements

    missing = missing_requirements(("podman", "runc", "conmon", "mmdebstrap"))
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    tests_root = os.environ.get("DANKSERVE_TEST_PODMAN_ROOT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DANKSERVE_", "NOTIFY_SOCKET"))}
    if tests_root:  # beside the tests' storage, never in it (another service uses that one)
        env["DANKSERVE_TRYIT_PODMAN_ROOT"] = f"{tests_root}-tryit"
    workdir = tmp_path / "try"
    kept = subprocess.Popen(
        [sys.executable, "-m", "dankserve.testing.try_it", "--podman", "--dir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert kept.stdout is not None
    said: list[str] = []
    try:
        for line in kept.stdout:  # the first build of the image into a fresh storage takes minutes
            said.append(line)
            if line.startswith("kept until Ctrl-C"):
                break
        assert said and said[-1].startswith("kept until Ctrl-C"), "".join(said)
        spec = next(
            Path(w)
            for line in said
            for w in line.replace(",", " ").replace(";", " ").split()
            if w.startswith("/etc/cdi/")
        )
        assert spec.exists()
        terminal = _env_of(workdir)

        dankserve = cli_in(terminal, timeout=300)

        doctor = dankserve("doctor", "--json")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["GPU devices for chat"]["verdict"] == "ok" and checks["podman"]["verdict"] == "ok"
        try:
            up = dankserve("up", "chat", "--timeout", "240")
            assert up.returncode == 0, up.stdout + up.stderr
            status = json.loads(dankserve("status", "chat", "--json").stdout)["deployments"][0]
            assert status["state"] == "ready" and status["image"] == "localhost/fake-vllm:latest"
            assert status["gpu_memory_held_bytes"] > 100 * 2**30, status  # the container's, as NVML would list it
        finally:
            dankserve("down")
    finally:
        kept.send_signal(signal.SIGINT)
        rest = kept.communicate(timeout=120)[0]
    assert kept.returncode == 0, "".join(said) + rest
    assert "removed the stand-in GPUs" in rest
    assert not spec.exists() and not (workdir / "gpus" / "dev").exists()
    assert not (workdir / "podman" / "podman.sock").exists()
