"""The gateway inside a real daemon (subprocess) in front of the stand-in run by the process runtime."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow


def test_daemon_gateway_waits_for_boot_serves_and_refuses_when_down(tmp_path: Path) -> None:
    """A request sent while the server boots waits and is served; a server with its own key gets it from the
    gateway; after `down` a request gets 503 + Retry-After."""
    gateway_port = free_port()
    key = tmp_path / "keyed.key"
    key.write_text("server-key-0123456789\n")
    key.chmod(0o600)
    deployments = {
        "chat": process_deployment(
            free_port(),
            served_model_name="tiny-chat",
            aliases=["gpt-4o-mini"],
            gpus=[0],
            env={"FAKE_VLLM_TIME_SCALE": "0.05"},
        ),
        "keyed": process_deployment(free_port(), served_model_name="keyed", gpus=[1], api_key_file=str(key)),
    }
    url = f"http://127.0.0.1:{gateway_port}"
    request = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with running_daemon(
        tmp_path, deployments, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    ) as daemon:
        deadline = time.monotonic() + 30
        while True:
            try:
                models = httpx.get(url + "/v1/models", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, daemon.log_tail()
                time.sleep(0.1)
        assert [m["id"] for m in models.json()["data"]] == ["tiny-chat", "gpt-4o-mini", "keyed"]
        booting = daemon.deployment("chat")
        assert booting is not None and booting["phase"] != "ready"
        reply = httpx.post(url + "/v1/chat/completions", json=request, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == "tiny-chat"
        keyed = httpx.post(url + "/v1/chat/completions", json={**request, "model": "keyed"}, timeout=60)
        assert keyed.status_code == 200, keyed.text
        assert daemon.request({"command": "down", "deployment": "chat"}) == {"ok": True}
        down = httpx.post(url + "/v1/chat/completions", json=request, timeout=10)
        assert down.status_code == 503 and down.headers["Retry-After"] == "5"
        assert "taken down" in down.json()["error"]["message"]
