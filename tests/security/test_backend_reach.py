"""Security: a deployment's server behind the gateway is reachable by dankserve alone (issue 38, finding 1).

Round 3 found every backend behind a keyed gateway listening on loopback TCP without a key: any local
user skipped keys, scopes, limits and usage, unloaded the adapter `sql` and loaded its own weights under
that name (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), and, vLLM's key guarding only `/v1`, called a swap
member's `/sleep`, `/wake_up` and `/collective_rpc` (dev mode). Behind a gateway the servers now listen
on a unix socket in a 0700 directory of the daemon's user (vLLM's `--uds`; mounted into a container).

The attacker here is another local user (made with useradd, acted as with setpriv): it tries every
route of every backend, on the TCP port each deployment names and on the socket path, for the process
runtime and for Podman. Every attempt must fail to connect. Where a deployment must serve on TCP
(`listen = "tcp"`), `dankserve plan` names what is exposed.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.testing.config_file import write_config
from tests.gateway.test_daemon_lora import adapter_dir
from tests.harness.cli import dankserve_cli
from tests.harness.daemon import (
    MODEL_FACTS,
    RunningDaemon,
    container_deployment,
    free_port,
    launcher_deployment,
    process_deployment,
    running_daemon,
    server_socket,
    socket_client,
    write_host,
)
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.harness.users import LocalUser, unprivileged_user

pytestmark = pytest.mark.slow

GATEWAY_KEY = "sk-gateway-0123456789"

ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/version", None),
    ("GET", "/v1/models", None),
    ("GET", "/is_sleeping", None),
    ("POST", "/sleep?level=1", None),
    ("POST", "/wake_up", None),
    ("POST", "/collective_rpc", {"method": "reload_weights"}),
    ("POST", "/reset_prefix_cache", None),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "sql"}),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": "/tmp/mine"}),
    ("POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/tokenize", {"model": "tiny", "prompt": "hi"}),
]

# The attacker's program: the standard library only, run by the system's Python as the other user. For each
# target and route it connects and sends the request; "refused" when it cannot connect, else the status line.
ATTACK = r"""
import json, socket, sys
targets, routes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = []
for target in targets:
    for method, path, body in routes:
        data = json.dumps(body).encode() if body is not None else b""
        try:
            if target[0] == "tcp":
                conn = socket.create_connection((target[1], target[2]), timeout=5)
            else:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(5)
                conn.connect(target[1])
        except OSError as exc:
            out.append([target, method, path, "refused", type(exc).__name__])
            continue
        head = (f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
        try:
            conn.sendall(head + data)
            answer = conn.recv(200).split(b"\r\n")[0].decode("latin-1")
        except OSError as exc:
            answer = type(exc).__name__
        conn.close()
        out.append([target, method, path, "answered", answer])
print(json.dumps(out))
"""


@contextlib.contextmanager
def traversable(path: Path) -> Iterator[None]:
    """Every directory from / down to `path` searchable by others (o+x) while inside, as /var/lib is: the
    attacker then stops at the socket's own 0700 directory, not at pytest's private temporary one."""
    changed: list[tuple[Path, int]] = []
    for directory in [*reversed(path.parents), path]:
        mode = stat.S_IMODE(directory.stat().st_mode)
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)
            changed.append((directory, mode))
    try:
        yield
    finally:
        for directory, mode in reversed(changed):
            with contextlib.suppress(OSError):
                directory.chmod(mode)


def attack(user: LocalUser, targets: list[list[Any]]) -> list[list[Any]]:
    """Every route of every target tried as `user`: one entry per attempt."""
    argv = user.argv(["/usr/bin/python3", "-c", ATTACK, json.dumps(targets), json.dumps(ROUTES)])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    attempts: list[list[Any]] = json.loads(done.stdout)
    assert len(attempts) == len(targets) * len(ROUTES)
    return attempts


def gateway_globals(tmp_path: Path, **more: Any) -> tuple[dict[str, Any], str]:
    """A keyed gateway on a free loopback port; the settings and its URL."""
    key = tmp_path / "gateway.key"
    key.write_text(GATEWAY_KEY + "\n")
    key.chmod(0o600)
    port = free_port()
    return {"gateway": {"listen": f"127.0.0.1:{port}", "api_key_file": str(key)}, **more}, f"http://127.0.0.1:{port}"


def completion(gateway: str, model: str) -> int:
    body = {"model": model, "prompt": "hi", "max_tokens": 2}
    headers = {"Authorization": f"Bearer {GATEWAY_KEY}"}
    return httpx.post(gateway + "/v1/completions", json=body, headers=headers, timeout=120).status_code


def assert_unreachable(daemon: RunningDaemon, tmp_path: Path, deployments: dict[str, dict[str, Any]]) -> None:
    """The other user cannot connect to any deployment's port or socket, whatever the route; the servers
    still serve the daemon (asleep nowhere, adapters as configured), and the sockets' directories are the
    daemon's own, 0700."""
    user = unprivileged_user()
    targets: list[list[Any]] = []
    for name, dep in deployments.items():
        targets.append(["tcp", "127.0.0.1", dep["port"]])
        targets.append(["unix", str(server_socket(tmp_path, name))])
        info = server_socket(tmp_path, name).parent.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid(), oct(info.st_mode)
    with traversable(server_socket(tmp_path, next(iter(deployments))).parent.parent):
        attempts = attack(user, targets)
    answered = [a for a in attempts if a[3] != "refused"]
    assert not answered, answered
    for name in deployments:
        with socket_client(server_socket(tmp_path, name)) as server:  # the daemon's user (root) still can
            assert server.get("/health").status_code == 200
        state = daemon.deployment(name)
        assert state is not None and state["state"] == "ready" and state["restarts"] == 0, state


def test_another_local_user_reaches_no_route_of_any_process_backend(tmp_path: Path) -> None:
    """Process runtime: a swap group member (dev mode) and a deployment with runtime LoRA loading, behind a keyed
    gateway. As another user: every route of both, on their ports and their sockets, cannot connect."""
    sql = adapter_dir(tmp_path / "sql")
    deployments = {
        "chat": process_deployment(free_port(), served_model_name="tiny", gpus=[0], swap_group="g"),
        "lora": process_deployment(free_port(), served_model_name="base", gpus=[1], adapters={"sql": sql}),
    }
    globals_, gateway = gateway_globals(tmp_path)
    with running_daemon(tmp_path, deployments, extra_globals=globals_) as daemon:
        for name in deployments:
            daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=120)
        assert completion(gateway, "tiny") == 200 and completion(gateway, "sql") == 200
        assert_unreachable(daemon, tmp_path, deployments)
        assert completion(gateway, "sql") == 200  # still the configured adapter, through the gateway


def test_another_local_user_reaches_no_route_of_a_launcher_backend(tmp_path: Path) -> None:
    """The launcher's servers (forked per boot, `--uds` in each start request): a swap group member under it,
    behind a keyed gateway. As another user: every route, on its port and its socket, cannot connect."""
    deployments = {"chat": launcher_deployment(free_port(), served_model_name="tiny", gpus=[0], swap_group="g")}
    globals_, gateway = gateway_globals(tmp_path)
    with running_daemon(tmp_path, deployments, extra_globals=globals_) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready", timeout=120)
        assert completion(gateway, "tiny") == 200
        assert_unreachable(daemon, tmp_path, deployments)


@pytest.mark.podman
def test_another_local_user_reaches_no_route_of_a_podman_backend(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    """Podman runtime: a swap group member with an adapter, behind a keyed gateway; its socket's directory is
    mounted into the container. As another user: every route, on its port and its socket, cannot connect."""
    sql = adapter_dir(tmp_path / "sql")
    dep = container_deployment(
        vllm_image, free_port(), served_model_name="tiny", gpus=[0], swap_group="g", adapters={"sql": sql}
    )
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    globals_, gateway = gateway_globals(tmp_path, podman_url=podman_env.url)
    with running_daemon(tmp_path, {deployment: dep}, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=180)
        assert completion(gateway, "tiny") == 200
        assert_unreachable(daemon, tmp_path, {deployment: dep})
        assert completion(gateway, "sql") == 200


def test_plan_names_what_a_tcp_backend_exposes(tmp_path: Path) -> None:
    """Behind the gateway the plan says the server is reachable by dankserve alone (`--uds`); with listen = "tcp"
    it names the port, every local user, the routes without the key (dev mode's /sleep among them) and warns."""
    member = {
        "model": "test/tiny",
        "runtime": "process",
        "executable": "/usr/bin/true",
        "port": 8100,
        "swap_group": "g",
        "model_facts": MODEL_FACTS,
    }
    settings = {
        "state_dir": str(tmp_path / "state"),
        "vllm_version": "0.33.0",
        "gateway": {"listen": "127.0.0.1:9100"},
    }
    host = write_host(tmp_path / "host.json")
    for listen in ("auto", "tcp"):
        config = write_config(tmp_path / f"{listen}.toml", settings, {"chat": {**member, "listen": listen}})
        done = dankserve_cli(config, "plan", "chat", "--hardware", str(host))
        assert done.returncode == 0, done.stderr
        shown = " ".join(done.stdout.split())
        listed = dankserve_cli(config, "plan", "chat", "--json", "--hardware", str(host))
        exposure = json.loads(listed.stdout)[0]["exposure"]
        if listen == "auto":
            assert "--uds" in shown and "reachable by dankserve alone" in shown, shown
            assert exposure["unguarded"] == [] and exposure["listen"].startswith("unix:"), exposure
        else:
            assert "--uds" not in shown and "listens on 127.0.0.1:8100: reachable by every user of this host" in shown
            assert "/sleep" in shown and "dev mode (VLLM_SERVER_DEV_MODE): on" in shown, shown
            assert "warning: the server listens on 127.0.0.1:8100 with VLLM_SERVER_DEV_MODE=1" in shown, shown
            assert any("/collective_rpc" in route for route in exposure["unguarded"]), exposure
            assert any(route.startswith("/v1/*") for route in exposure["unguarded"]), exposure  # no key


def test_the_socket_directory_is_made_private_and_another_users_is_refused(tmp_path: Path) -> None:
    """Before a boot: the directory is 0700 (a looser one tightened), a stale socket removed; a directory another
    user owns, or a link in its place, is refused naming it (its owner could listen in the server's place)."""
    import socket as socket_module

    from dankserve.errors import EnvironmentUnusable
    from dankserve.runtime.base import prepare_socket

    path = tmp_path / "backends" / "chat" / "vllm.sock"
    path.parent.mkdir(parents=True, mode=0o755)
    path.parent.chmod(0o755)
    with socket_module.socket(socket_module.AF_UNIX) as stale:
        stale.bind(str(path))
    prepare_socket(path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and not path.exists()
    assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700

    if os.geteuid() == 0:
        os.chown(path.parent, 4242, 4242)
        with pytest.raises(EnvironmentUnusable, match="not a directory owned by this user"):
            prepare_socket(path)
    path.parent.rename(tmp_path / "elsewhere")
    path.parent.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvironmentUnusable, match=str(path.parent)):
        prepare_socket(path)
