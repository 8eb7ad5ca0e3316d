"""Security: a loopback deployment is not reachable from off the host, not even through the container's
bridge address by a neighbour that routes the Podman subnet through this host.

The neighbour is a network namespace on a bridge with this host (tests/harness/netns.py), its
default route via this host, so it can reach every address here that forwarding allows: the
bridge-side address of this host and every container's Podman address. A deployment bound to
0.0.0.0 (with a key) is the control: the neighbour reaches it, through this host and through its
container's address, which proves the route works; the loopback one it must not reach at all.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from tests.harness import netns
from tests.harness.daemon import MODEL_FACTS, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.slow, pytest.mark.skipif(netns.available() is not None, reason=str(netns.available()))]

CONNECT = (
    "import socket, sys\n"
    "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()\n"
    "except OSError:\n sys.exit(1)\n"
)


@pytest.fixture
def neighbour() -> Iterator[netns.Lab]:
    """One neighbouring host (a namespace) whose default route is this host."""
    lab = netns.Lab.create(1)
    try:
        subprocess.run(
            ["ip", "-n", lab.hosts[0].name, "route", "add", "default", "via", f"{lab.prefix}1"],
            check=True,
            capture_output=True,
        )
        yield lab
    finally:
        lab.close()


def reachable(lab: netns.Lab, address: str, port: int) -> bool:
    """Whether the neighbour can open a TCP connection to address:port."""
    done = subprocess.run(
        lab.hosts[0].command([sys.executable, "-c", CONNECT, address, str(port)]),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


def container_addresses(env: PodmanEnv, name: str) -> list[str]:
    """The container's addresses on Podman networks (none with host networking)."""
    inspected = json.loads(env.podman("inspect", workload_name(name)).stdout)[0]
    networks = (inspected.get("NetworkSettings") or {}).get("Networks") or {}
    return [n["IPAddress"] for n in networks.values() if n.get("IPAddress")]


def stand_in(image: str, port: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "test/tiny",
        "image": image,
        "pull": "never",
        # A restart here is a boot of a new container: no snapshot, no launcher (their own tests:
        # test_daemon_snapshots_podman.py, test_daemon_podman_launcher.py).
        "snapshot": "off",
        "launcher": False,
        "port": port,
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02"},
        "model_facts": MODEL_FACTS,
        **extra,
    }


def test_a_loopback_deployment_is_unreachable_from_a_neighbour(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    gpus: StandInGpus,
    vllm_image: str,
    deployment: str,
    neighbour: netns.Lab,
) -> None:
    """A neighbour routing through this host reaches the exposed deployment, never the loopback one."""
    key = tmp_path / "api.key"
    key.write_text("sk-exposure-test\n")
    key.chmod(0o600)
    local, exposed = deployment, f"{deployment}-x"
    ports = {local: free_port(), exposed: free_port()}
    deployments = {
        local: stand_in(vllm_image, ports[local], gpus=[0]),
        exposed: stand_in(vllm_image, ports[exposed], gpus=[1], host="0.0.0.0", api_key_file=str(key)),
    }
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    (tmp_path / "hf").mkdir()
    try:
        with running_daemon(
            tmp_path, deployments, hardware=host, extra_globals={"podman_url": podman_env.url}
        ) as daemon:
            for name in deployments:
                daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=120)
            this_host = f"{neighbour.prefix}1"
            # The control: the route works, to this host and to a bridged container's address.
            assert reachable(neighbour, this_host, ports[exposed])
            exposed_addresses = container_addresses(podman_env, exposed)
            assert exposed_addresses and all(reachable(neighbour, a, 8000) for a in exposed_addresses)
            # The loopback deployment: no published port, no container address, nothing that answers.
            assert not reachable(neighbour, this_host, ports[local])
            local_addresses = container_addresses(podman_env, local)
            for address in local_addresses:
                assert not reachable(neighbour, address, 8000), f"the loopback deployment answers on {address}:8000"
            assert local_addresses == []
            for address in exposed_addresses:  # its neighbours on the Podman bridge
                assert not reachable(neighbour, address, ports[local])
            assert daemon.stop() == 0
    finally:
        podman_env.podman("rm", "-f", "-t", "0", workload_name(exposed), check=False)
