"""The gateway inside a real daemon (subprocess) in front of the stand-in run by the process runtime."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon, server_socket, socket_client
from tests.harness.wait import wait_until

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

        def listed() -> httpx.Response | None:
            try:
                return httpx.get(url + "/v1/models", timeout=2)
            except httpx.TransportError:
                return None

        models = wait_until(listed, 30, 0.1, what=daemon.log_tail)
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


def test_daemon_gateway_keys_reload_metrics_and_usage(tmp_path: Path) -> None:
    """Keys from keys_dir in a real daemon: 401/404 by key, a `dankserve reload` adds a key without a restart,
    /metrics behind its key carries the key's name (never its value), and `dankserve usage` reads what the daemon
    saved at stop."""
    gateway_port, metrics_port = free_port(), free_port()
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    alice, bob = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"
    (keys / "alice.toml").write_text(f'key = "{alice}"\nmodels = ["tiny-*"]\n')
    (keys / "alice.toml").chmod(0o600)
    metrics_key = tmp_path / "metrics.key"
    metrics_key.write_text("metrics-key-0123456789abcdef")
    metrics_key.chmod(0o600)
    server_port = free_port()
    deployments = {"chat": process_deployment(server_port, served_model_name="tiny-chat", gpus=[0])}
    url = f"http://127.0.0.1:{gateway_port}"
    request = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    extra = {
        "gateway": {"listen": f"127.0.0.1:{gateway_port}", "keys_dir": str(keys)},
        "metrics_listen": f"127.0.0.1:{metrics_port}",
        "metrics_api_key_file": str(metrics_key),
    }
    with running_daemon(tmp_path, deployments, extra_globals=extra) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        assert httpx.post(url + "/v1/chat/completions", json=request, timeout=30).status_code == 401
        ok = httpx.post(url + "/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {alice}"})
        assert ok.status_code == 200, ok.text
        # /v1/models carries the server's context length, as the server's own card does (issue 39 item 14)
        card = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {alice}"}).json()["data"][0]
        with socket_client(server_socket(tmp_path, "chat")) as server:  # behind the gateway: on its socket
            own = server.get("/v1/models").json()["data"][0]
        assert isinstance(own["max_model_len"], int) and card["max_model_len"] == own["max_model_len"]
        assert (
            httpx.post(
                url + "/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {bob}"}
            ).status_code
            == 401
        )
        (keys / "bob.toml").write_text(f'key = "{bob}"\nmodels = ["other"]\n')
        (keys / "bob.toml").chmod(0o600)
        reloaded = daemon.cli("reload")
        assert reloaded.returncode == 0, reloaded.stderr
        forbidden = httpx.post(url + "/v1/chat/completions", json=request, headers={"Authorization": f"Bearer {bob}"})
        assert forbidden.status_code == 404, forbidden.text  # as a model that does not exist (issue 38 item 8)
        scrape = {"Authorization": "Bearer metrics-key-0123456789abcdef"}
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", headers=scrape, timeout=10).text
        assert 'dankserve_gateway_requests_total{code="200",key="alice",model="tiny-chat"} 1.0' in metrics
        assert 'dankserve_gateway_requests_total{code="404",key="bob",model="tiny-chat"} 1.0' in metrics
        assert alice not in metrics and bob not in metrics and alice not in daemon.log_tail()
    shown = daemon.cli("usage", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = {(r["key"], r["model"]): r for r in json.loads(shown.stdout)["rows"]}
    assert (
        rows[("alice", "tiny-chat")]["codes"] == {"200": 1} and rows[("alice", "tiny-chat")]["completion_tokens"] == 3
    )
    assert rows[("-", "-")]["codes"] == {"401": 2}


def test_restart_is_one_request_and_the_gateway_queues_requests_meanwhile(tmp_path: Path) -> None:
    """Issue 39.5: requests sent without pause while `dankserve restart chat` runs all get 200 (they wait for the
    new boot); none gets the 503 of a deployment taken down. After `down`, that 503 names the deployment."""
    import threading

    gateway_port = free_port()
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny-chat", gpus=[0])}
    url = f"http://127.0.0.1:{gateway_port}/v1/completions"
    request = {"model": "tiny-chat", "prompt": "hi", "max_tokens": 2}
    with running_daemon(
        tmp_path, deployments, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    ) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=120)
        codes: list[tuple[int, str]] = []
        done = threading.Event()

        def send() -> None:
            with httpx.Client(timeout=90) as client:
                while not done.is_set():
                    reply = client.post(url, json=request)
                    codes.append((reply.status_code, reply.text[:200]))

        senders = [threading.Thread(target=send, daemon=True) for _ in range(4)]
        for sender in senders:
            sender.start()
        restart = daemon.cli("restart", "chat")
        done.set()
        for sender in senders:
            sender.join(60)
        assert restart.returncode == 0, restart.stdout + restart.stderr
        assert daemon.deployment("chat")["boots"] == 2  # type: ignore[index]
        refused = [(code, text) for code, text in codes if code != 200]
        assert codes and not refused, refused
        assert daemon.request({"command": "down", "deployment": "chat"}) == {"ok": True}
        down = httpx.post(url, json=request, timeout=10)
        assert down.status_code == 503 and "`dankserve up chat` starts it" in down.json()["error"]["message"]
