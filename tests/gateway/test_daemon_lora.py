"""LoRA adapters by name through the real gateway and daemon, in front of the stand-in (process runtime and Podman)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import (
    RunningDaemon,
    container_deployment,
    free_port,
    process_deployment,
    running_daemon,
    server_socket,
    socket_client,
    write_host,
)
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until

pytestmark = pytest.mark.slow


def adapter_dir(root: Path, rank: int = 8) -> str:
    root.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (root / "adapter_config.json").write_text(json.dumps(config))
    (root / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
    return str(root)


def ids(url: str, model: str) -> tuple[int, list[int]]:
    """A completion's status and token ids (through the gateway at `url`)."""
    body = {"model": model, "prompt": "hi", "max_tokens": 4, "return_token_ids": True}
    reply = httpx.post(url + "/v1/completions", json=body, timeout=60)
    if reply.status_code != 200:
        return reply.status_code, []
    return 200, list(reply.json()["choices"][0]["token_ids"])


def models(target: str | httpx.Client) -> dict[str, Any]:
    """/v1/models as id -> parent, from the gateway's URL or a server's socket client."""

    def listed() -> list[dict[str, Any]] | None:
        try:
            reply = target.get("/v1/models") if isinstance(target, httpx.Client) else httpx.get(target + "/v1/models")
        except httpx.TransportError:
            return None
        data: list[dict[str, Any]] = reply.json()["data"]
        return data

    return {m["id"]: m.get("parent") for m in wait_until(listed, 30, 0.1, what="/v1/models")}


def reload_with(daemon: RunningDaemon, old: str, new: str) -> str:
    text = daemon.config.read_text()
    assert old in text
    daemon.config.write_text(text.replace(old, new))
    done = daemon.cli("reload")
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done.stdout


def test_adapters_are_served_by_name_and_a_reload_loads_and_unloads_them_without_a_restart(tmp_path: Path) -> None:
    """The gateway lists an adapter with its parent and routes it to the base deployment, whose server answers with
    the adapter's token ids; a reload swapping adapters loads and unloads them in the running server (one boot);
    an adapter whose rank exceeds the server's --max-lora-rank restarts it with a larger rank."""
    sql, chat, wide = adapter_dir(tmp_path / "sql"), adapter_dir(tmp_path / "chat"), adapter_dir(tmp_path / "wide", 64)
    port, gateway_port = free_port(), free_port()
    deployments = {"base": process_deployment(port, served_model_name="tiny", gpus=[0], adapters={"sql": sql})}
    # Behind the gateway the server is on its private socket (the test runs as the daemon's user, root).
    gateway, server = f"http://127.0.0.1:{gateway_port}", socket_client(server_socket(tmp_path, "base"))
    globals_ = {"gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    with running_daemon(tmp_path, deployments, extra_globals=globals_) as daemon:
        assert models(gateway) == {"tiny": None, "sql": "tiny"}
        base_status, base_ids = ids(gateway, "tiny")  # waits for the boot in the gateway's queue
        sql_status, sql_ids = ids(gateway, "sql")
        assert (base_status, sql_status) == (200, 200) and sql_ids != base_ids
        assert models(server) == {"tiny": None, "sql": "tiny"}  # vLLM's own listing: parent = the base

        out = reload_with(daemon, f'sql = "{sql}"', f'chat = "{chat}"')
        assert "base: keeps running" in out, out
        assert models(server) == {"tiny": None, "chat": "tiny"}
        assert models(gateway) == {"tiny": None, "chat": "tiny"}
        assert ids(gateway, "chat")[0] == 200 and ids(gateway, "sql")[0] == 404
        assert daemon.deployment("base")["boots"] == 1  # type: ignore[index]
        assert daemon.events_named("adapters_reloaded")[-1]["loaded"] == ["chat"]

        reload_with(daemon, f'chat = "{chat}"', f'chat = "{chat}"\nwide = "{wide}"')
        daemon.wait_for("base", lambda d: d["state"] == "ready" and d["boots"] == 2)
        refused = daemon.events_named("adapters_not_loaded")[-1]
        assert refused["status"] == 500 and "greater than max_lora_rank 8" in refused["answer"]
        assert ids(gateway, "wide")[0] == 200 and set(models(server)) == {"tiny", "chat", "wide"}


def test_lora_turned_on_by_a_reload_restarts_the_server(tmp_path: Path) -> None:
    """No adapters before: --enable-lora is fixed at start-up, so the first adapter restarts the server."""
    sql = adapter_dir(tmp_path / "sql")
    deployments = {"base": process_deployment(free_port(), served_model_name="tiny", gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("base", lambda d: d["state"] == "ready")
        out = reload_with(
            daemon, 'served_model_name = "tiny"', f'served_model_name = "tiny"\nadapters = {{ sql = "{sql}" }}'
        )
        assert "base: restarts with the new settings" in out, out
        daemon.wait_for("base", lambda d: d["state"] == "ready" and d["boots"] == 2)


@pytest.mark.podman
def test_a_local_adapter_is_mounted_into_the_container_and_served_through_the_gateway(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """On real Podman: the adapter directory is mounted read-only, the server loads it at boot, and the gateway
    routes the adapter's name to it (different token ids than the base)."""
    sql = adapter_dir(tmp_path / "sql")
    dep = container_deployment(vllm_image, free_port(), served_model_name="tiny", gpus=[0], adapters={"sql": sql})
    gateway_port = free_port()
    gateway = f"http://127.0.0.1:{gateway_port}"
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway_port}"}}
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
        assert models(gateway) == {"tiny": None, "sql": "tiny"}
        (base_status, base_ids), (sql_status, sql_ids) = ids(gateway, "tiny"), ids(gateway, "sql")
        assert (base_status, sql_status) == (200, 200) and sql_ids != base_ids
        inspect = json.loads(podman_env.podman("inspect", workload_name(deployment)).stdout)
        mounts = {m["Destination"]: m for m in inspect[0]["Mounts"]}
        lora_mount = next(m for d, m in mounts.items() if d.startswith("/dankserve/adapters/sql-"))
        assert lora_mount["Source"] == sql and lora_mount["RW"] is False
