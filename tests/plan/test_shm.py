"""A Podman container's /dev/shm (issue 41): private by default where snapshots are on, the host's otherwise."""

from __future__ import annotations

from dankserve.plan.plan import plan_deployment
from dankserve.plan.shm import SHARED_REASON, fingerprinted, private_default, shares_host_ipc, shm_choice
from dankserve.settings import DeploymentSettings
from tests.plan.builders import GIB, QWEN3_30B, caps, host


def test_a_snapshot_deployment_gets_a_private_dev_shm_of_half_the_hosts_ram_with_a_floor() -> None:
    dep = DeploymentSettings(model="m")  # Podman, snapshot = "auto": the defaults
    chosen = shm_choice(dep, 64 * GIB)
    assert chosen.value == "32768m" and "half the host's RAM" in chosen.reason and "ceiling" in chosen.reason
    assert private_default(512 << 20) == "1024m", "at least 1 GiB"
    assert not shares_host_ipc(dep)


def test_snapshot_off_keeps_ipc_host_an_explicit_size_wins_and_host_is_an_explicit_opt_in() -> None:
    off = DeploymentSettings(model="m", snapshot="off")
    assert shm_choice(off, 64 * GIB).value is None and shares_host_ipc(off)
    sized = DeploymentSettings(model="m", shm_size="8g", snapshot="off")
    assert shm_choice(sized, 64 * GIB).value == "8g" and not shares_host_ipc(sized)
    opted = DeploymentSettings(model="m", shm_size="host")
    assert shm_choice(opted, 64 * GIB).value is None and shares_host_ipc(opted)
    assert "ipc=host" in SHARED_REASON and "shm_size" in SHARED_REASON


def test_the_plan_carries_the_choice_with_its_reason_and_only_the_new_default_changes_the_fingerprint() -> None:
    the_host = host()
    plan = plan_deployment("d", DeploymentSettings(model="m"), the_host, caps(), QWEN3_30B)
    assert plan.shm_size == private_default(the_host.memory.total_bytes)
    assert any(n.startswith(f"/dev/shm: {plan.shm_size} (a private /dev/shm") for n in plan.notes), plan.notes
    off = plan_deployment("d", DeploymentSettings(model="m", snapshot="off"), the_host, caps(), QWEN3_30B)
    assert off.shm_size is None and any(n.startswith("/dev/shm: ipc=host") for n in off.notes)
    process = DeploymentSettings(model="m", runtime="process", executable="/usr/bin/vllm")
    assert not any(n.startswith("/dev/shm") for n in plan_deployment("d", process, the_host, caps(), QWEN3_30B).notes)
    # A container an older dankserve started on ipc=host is replaced once (another fingerprint), not adopted;
    # one whose /dev/shm did not change keeps its fingerprint.
    sized = DeploymentSettings(model="m", shm_size="8g")
    assert plan.fingerprint != plan_deployment("d", sized, the_host, caps(), QWEN3_30B).fingerprint
    assert fingerprinted(DeploymentSettings(model="m", snapshot="off")) == {}
    assert fingerprinted(DeploymentSettings(model="m", shm_size="8g")) == {}
    assert fingerprinted(DeploymentSettings(model="m")) == {"shm_size": "private"}
