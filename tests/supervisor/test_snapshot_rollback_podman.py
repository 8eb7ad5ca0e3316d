"""An upgrade's rollback through a restore, on Podman itself (issue 41, docs/snapshots.md "An upgrade's
rollback"): a real daemon, the real Podman service, real CRIU and two releases of the stand-in image (0.33.0
and 0.33.1: `stand_in_release`). Captured on image A, `dankserve upgrade` to image B (its trial server handed
over), B captured while A's archive is kept as NAME@previous; `dankserve rollback` serves A again by a restore
of that archive (boot kind `restore`, A's greedy ids, A's version). A's kept archive damaged: the rollback
boots A normally, the reason in status."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from dankserve.supervisor.upgrade.edge import trial_name
from tests.harness.daemon import RunningDaemon, free_port
from tests.harness.gpus import StandInGpus
from tests.harness.images import stand_in_release
from tests.harness.podman_service import PodmanEnv
from tests.supervisor.test_daemon_snapshots_podman import _daemon, _deployment, _host, _ids
from tests.supervisor.test_daemon_snapshots_podman import pytestmark as podman_criu_marks

pytestmark = [*podman_criu_marks, pytest.mark.slow]


@pytest.fixture
def images(podman_env: PodmanEnv, vllm_image: str, deployment: str) -> Iterator[dict[str, str]]:
    """Image A (0.33.0) and image B (0.33.1); the upgrade's trial container is removed afterwards."""
    yield {
        "A": stand_in_release(podman_env, vllm_image, "0.33.0"),
        "B": stand_in_release(podman_env, vllm_image, "0.33.1"),
    }
    podman_env.podman("rm", "-f", "-t", "0", workload_name(trial_name(deployment)), check=False)


def _listed(daemon: RunningDaemon) -> dict[str, str]:
    listed = json.loads(daemon.cli("snapshot", "list", "--json").stdout)["snapshots"]
    return {e["deployment"]: e["state"] for e in listed}


def _upgraded_and_captured(daemon: RunningDaemon, name: str, image: str) -> dict[str, Any]:
    """`dankserve upgrade` to `image`, switched; its server captured while A's snapshot is kept aside."""
    done = daemon.cli("upgrade", name, "--image", image, "--timeout", "300", timeout=320)
    assert done.returncode == 0, done.stdout + done.stderr
    return daemon.wait_for(
        name,
        lambda d: (
            d["state"] == "ready"
            and d["vllm_version"] == "0.33.1"
            and d["upgrade"]["step"] == "switched"
            and d["snapshot"]["state"] == "ready"
        ),
        timeout=180,
    )


def _captured_on_a_then_upgraded(daemon: RunningDaemon, name: str, image_b: str, port: int) -> list[int]:
    """A captured, upgraded to B, B captured, A's snapshot kept aside: A's greedy ids."""
    daemon.wait_for(name, lambda d: d["state"] == "ready" and d["snapshot"]["state"] == "ready", timeout=180)
    ids = _ids(port)
    _upgraded_and_captured(daemon, name, image_b)
    (kept,) = daemon.events_named("snapshot_kept_for_rollback")
    assert kept["kept"] == f"{name}@previous" and "image" in kept["reason"], kept
    assert _listed(daemon) == {name: "ready", f"{name}@previous": "ready"}
    return ids


def _rolled_back(daemon: RunningDaemon, name: str, booted: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """`dankserve rollback NAME`, then its status once A serves again from a boot as `booted` says."""
    boots = daemon.deployment(name)["boots"]  # type: ignore[index]
    back = daemon.cli("rollback", name, "--timeout", "180", timeout=200)
    assert back.returncode == 0, back.stdout + back.stderr
    return daemon.wait_for(
        name,
        lambda d: d["state"] == "ready" and d["boots"] > boots and d["vllm_version"] == "0.33.0" and bool(booted(d)),
        timeout=180,
    )


def test_a_rollback_on_podman_restores_the_old_images_kept_archive(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, images: dict[str, str]
) -> None:
    """A captured; upgraded to B (A's snapshot kept as NAME@previous, B captured as NAME); `dankserve rollback`
    serves A again by a restore of A's archive (the container Podman restored, of image A): boot kind `restore`,
    A's version and greedy ids; A's snapshot is NAME again and B's is deleted."""
    port = free_port()
    dep = _deployment(images["A"], port)
    with _daemon(tmp_path, podman_env, deployment, dep, _host(tmp_path, gpus)) as daemon:
        ids = _captured_on_a_then_upgraded(daemon, deployment, images["B"], port)
        after = _rolled_back(daemon, deployment, lambda d: (d["last_boot"] or {}).get("kind") == "restore")
        assert after["upgrade"]["step"] == "rolled_back" and after["image"] == images["A"]
        assert after["snapshot"]["state"] == "ready" and after["snapshot"]["last_failure"] is None, after["snapshot"]
        assert _ids(port) == ids
        inspected = json.loads(podman_env.podman("inspect", workload_name(deployment)).stdout)[0]
        assert inspected["State"]["Restored"] is True and inspected["ImageName"] == images["A"], inspected["ImageName"]
        assert daemon.events_named("snapshot_taken_back")
        assert _listed(daemon) == {deployment: "ready"}, "B's snapshot deleted, A's kept one is NAME again"
        assert not daemon.events_named("snapshot_restore_failed")


def test_a_rollback_whose_kept_archive_is_corrupt_boots_the_old_image_normally(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, deployment: str, images: dict[str, str]
) -> None:
    """A's kept archive truncated while B serves: the rollback's restore fails, the snapshot is discarded with
    the reason, and A boots normally in the same restart (not counted), then is captured again."""
    port = free_port()
    dep = _deployment(images["A"], port)
    with _daemon(tmp_path, podman_env, deployment, dep, _host(tmp_path, gpus)) as daemon:
        ids = _captured_on_a_then_upgraded(daemon, deployment, images["B"], port)
        archive = daemon.state_dir / "snapshots" / f"{deployment}@previous" / "images" / "checkpoint.tar"
        with archive.open("r+b") as damaged:
            damaged.truncate(archive.stat().st_size // 3)
        after = _rolled_back(
            daemon,
            deployment,
            lambda d: (d["last_boot"] or {}).get("kind") not in (None, "restore") and d["snapshot"]["last_failure"],
        )
        failure = after["snapshot"]["last_failure"]
        assert "restore failed at criu_restore" in failure, failure
        (failed,) = daemon.events_named("snapshot_restore_failed")
        assert failed["then"] == "a normal boot"
        assert after["image"] == images["A"] and _ids(port) == ids
        assert not daemon.events_named("deployment_failed")
        shown = daemon.cli("status", deployment).stdout
        assert "restore failed at criu_restore" in shown, shown
        daemon.wait_for(deployment, lambda d: d["snapshot"]["state"] == "ready", timeout=120)
        assert _listed(daemon) == {deployment: "ready"}, "A captured again; nothing else kept"
