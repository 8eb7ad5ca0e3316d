"""The `vllm --version` probes a killed dankserve leaves behind (runtime/podman/probes.py): which ones are
abandoned (pure), and their removal on the real Podman service, by the next probe and by the next daemon.

Found by the stress of the upgrade tests: a daemon killed with -9 while its upgrade read the new image's
version left an exited probe container with a random name for good."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from dankserve.processes import is_same_process, start_time_of
from dankserve.runtime.podman.parsing import LABEL_PROBE
from dankserve.runtime.podman.probes import LABEL_PROBE_OWNER, PROBE_GRACE_SECONDS, ProbeOwner, abandoned_probes
from tests.harness.daemon import MODEL_FACTS, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv

BOOT = "7d4c1f0e-boot"
NOW = 1_800_000_000.0
TIMEOUT = 120.0


def _entry(cid: str, owner: object = None, created: object = "2027-01-15T08:00:00.123456789Z") -> dict[str, Any]:
    labels: dict[str, Any] = {LABEL_PROBE: "vllm-version"}
    if owner is not None:
        labels[LABEL_PROBE_OWNER] = owner
    return {"Id": cid, "Labels": labels, "Created": created}


def _abandoned(listed: list[dict[str, Any]], alive: frozenset[int] = frozenset(), now: float = NOW) -> list[str]:
    return abandoned_probes(listed, now=now, timeout=TIMEOUT, this_boot=BOOT, alive=lambda pid, _start: pid in alive)


def test_a_probe_whose_owner_on_this_boot_is_gone_is_abandoned_at_once() -> None:
    young = NOW - 1
    dead = _entry("dead", ProbeOwner(BOOT, 4242, 17.5).label(), created=int(young))
    live = _entry("live", ProbeOwner(BOOT, 77, 17.5).label(), created=int(young))
    assert _abandoned([dead, live], alive=frozenset({77})) == ["dead"]


def test_a_probe_from_elsewhere_or_without_an_owner_is_abandoned_only_past_its_timeout() -> None:
    """Another boot (a reboot, a remote Podman service) or no owner label: its pid means nothing here."""
    old, young = NOW - TIMEOUT - PROBE_GRACE_SECONDS - 1, NOW - TIMEOUT
    listed = [
        _entry("other-boot-old", ProbeOwner("another", 1, 1.0).label(), created=int(old)),
        _entry("other-boot-young", ProbeOwner("another", 1, 1.0).label(), created=int(young)),
        _entry("ownerless-old", created=int(old)),
        _entry("ownerless-young", created=int(young)),
    ]
    assert _abandoned(listed) == ["other-boot-old", "ownerless-old"]
    assert _abandoned(listed, alive=frozenset({1})) == [
        "other-boot-old",
        "ownerless-old",
    ]  # a pid elsewhere is no owner here


def test_libpod_and_docker_creation_times_are_read() -> None:
    """libpod's list writes a Go timestamp (nanoseconds), Docker's API an integer."""
    at = "2027-01-15T08:00:00.123456789Z"
    stamp = datetime.fromisoformat("2027-01-15T08:00:00.123456+00:00").timestamp()
    limit = TIMEOUT + PROBE_GRACE_SECONDS
    assert _abandoned([_entry("a", created=at)], now=stamp + limit + 1) == ["a"]
    assert _abandoned([_entry("a", created=at)], now=stamp + limit - 1) == []
    assert _abandoned([_entry("b", created=int(stamp))], now=stamp + limit + 1) == ["b"]


@pytest.mark.parametrize(
    "owner",
    [
        "garbage",
        "",
        f"{BOOT} -5 17.5",
        f"{BOOT} 0 17.5",
        f"{BOOT} 99999999999 17.5",
        f"{BOOT} 12 nan",
        f"{BOOT} 12 inf",
        f"{BOOT} 12 17.5 extra",
        f"{BOOT} 12 " + "9" * 200,
        12,
        ["a"],
    ],
)
def test_a_hostile_owner_label_is_no_owner(owner: object) -> None:
    """Whoever may create containers on the service writes the labels: one that does not parse names no
    process (never a pid to trust), so only the age counts; a young one is kept."""
    assert ProbeOwner.parse(owner) is None
    assert _abandoned([_entry("x", owner, created=int(NOW - 1))]) == []
    assert _abandoned([_entry("x", owner, created=int(NOW - 10_000))]) == ["x"]


@pytest.mark.parametrize(
    "entry",
    [
        {"Id": "x", "Labels": {"other": "1"}, "Created": 0},
        {"Id": "x", "Labels": None, "Created": 0},
        {"Id": 5, "Labels": {LABEL_PROBE: "vllm-version"}, "Created": 0},
        {"Labels": {LABEL_PROBE: "vllm-version"}, "Created": 0},
        {"Id": "x", "Labels": {LABEL_PROBE: "v"}, "Created": "yesterday"},
        {"Id": "x", "Labels": {LABEL_PROBE: "v"}, "Created": True},
        {"Id": "x", "Labels": {LABEL_PROBE: "v"}, "Created": None},
    ],
)
def test_entries_that_are_no_probe_or_have_no_readable_age_are_left(entry: dict[str, Any]) -> None:
    assert _abandoned([entry]) == []


def test_the_owner_label_round_trips() -> None:
    owner = ProbeOwner(BOOT, 4242, 1_765_000_000.125)
    assert ProbeOwner.parse(owner.label()) == owner


# -- on the real Podman service -------------------------------------------------------------------------


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _gone_process() -> ProbeOwner:
    """The owner record of a process that ran on this boot and exited."""
    proc = subprocess.Popen(["sleep", "30"])
    owner = ProbeOwner(_boot_id(), proc.pid, start_time_of(proc.pid))
    proc.kill()
    proc.wait()
    assert not is_same_process(owner.pid, owner.start_time)
    return owner


def _probe(env: PodmanEnv, image: str, owner: str | None) -> str:
    labels = ["--label", f"{LABEL_PROBE}=vllm-version"]
    if owner is not None:
        labels += ["--label", f"{LABEL_PROBE_OWNER}={owner}"]
    return env.podman("create", *labels, "--entrypoint", "true", image).stdout.strip()


def _exists(env: PodmanEnv, container_id: str) -> bool:
    return env.podman("container", "exists", container_id, check=False).returncode == 0


def test_the_next_probe_removes_those_of_a_killed_owner_and_keeps_a_live_ones(
    podman_env: PodmanEnv, busybox_image: str, gpus: StandInGpus, tmp_path: Path
) -> None:
    """Probes of a process that exited and of a reused pid go; this process's own, another boot's young one
    and an ownerless young one stay (another dankserve's may be in flight)."""
    from dankserve.runtime.podman import PodmanRuntime

    me = os.getpid()
    dead = _probe(podman_env, busybox_image, _gone_process().label())
    reused = _probe(podman_env, busybox_image, ProbeOwner(_boot_id(), me, start_time_of(me) - 500).label())
    live = _probe(podman_env, busybox_image, ProbeOwner(_boot_id(), me, start_time_of(me)).label())
    elsewhere = _probe(podman_env, busybox_image, ProbeOwner("another-boot", 1, 1.0).label())
    ownerless = _probe(podman_env, busybox_image, None)
    runtime = PodmanRuntime(podman_env.url, cache_dir=tmp_path, dev_root=gpus.dev_dir)
    try:
        assert runtime.ensure_image(busybox_image, "never").vllm_version == "0.33.0"  # a probe runs: it cleans first
        assert not _exists(podman_env, dead) and not _exists(podman_env, reused)
        assert all(_exists(podman_env, c) for c in (live, elsewhere, ownerless))
        assert runtime.remove_abandoned_probes() == []
    finally:
        runtime.close()
        podman_env.podman("rm", "-f", live, elsewhere, ownerless, check=False)


@pytest.mark.slow
def test_a_daemon_removes_the_probe_its_killed_predecessor_left(
    tmp_path: Path, podman_env: PodmanEnv, vllm_image: str, gpus: StandInGpus, deployment: str
) -> None:
    """The next daemon's first use of Podman removes it, whether or not it probes a version itself."""
    left = _probe(podman_env, vllm_image, _gone_process().label())
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    dep = {
        "model": "test/tiny",
        "image": vllm_image,
        "pull": "never",
        "snapshot": "off",
        "port": free_port(),
        "gpus": [0],
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02"},
        "model_facts": MODEL_FACTS,
    }
    try:
        with running_daemon(
            tmp_path, {deployment: dep}, hardware=host, extra_globals={"podman_url": podman_env.url}
        ) as daemon:
            daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
            assert not _exists(podman_env, left)
            # (The suite's workers share one storage and their daemons and probes clean too: which of them
            # removed it is not asked; alone, this daemon does, and says `version_probe_removed`.)
    finally:
        podman_env.podman("rm", "-f", left, check=False)
