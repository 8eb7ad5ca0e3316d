"""config/try-it.toml, booted as docs/TRY-IT.md says (the real CLI, a background daemon, the stand-in vLLM as
the process runtime's `vllm`, a recorded host): the gateway serves all three and the swap group swaps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.harness.daemon import BASE_HOST, STAND_IN, free_port

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

    def dankserve(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dankserve", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

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


def wait_for(dankserve: Any, predicate: Any, timeout: float = 90) -> dict[str, str]:
    """Poll `status --json` until predicate(state by deployment) holds; the states then."""
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        done = dankserve("status", "--json")
        if done.returncode == 0:
            states = {d["name"]: d["state"] for d in json.loads(done.stdout)["deployments"]}
            if predicate(states):
                return states
        time.sleep(0.3)
    raise AssertionError(f"not reached in {timeout}s: {states}")


def complete(gateway: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(
        f"http://{gateway}/v1/completions", body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer
