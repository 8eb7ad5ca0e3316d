"""Podman's checkpoint and restore through its REST API (runtime/podman/checkpoint.py) on the real service with
real CRIU, and why a capture does not leave the container running (docs/snapshots.md, Podman).

The stand-in maps a /dev/shm file deleted from its first name (a named POSIX semaphore, as glibc's sem_open
leaves vLLM's semaphores): without link-remap CRIU refuses it; with `leaveRunning` the archive lacks the
link-remap file and a later restore fails; checkpointed (stopped) then restored in place, the archive
restores again and again."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from dankserve.runtime.base import Workload, WorkloadSpec
from dankserve.runtime.podman import PodmanRuntime
from dankserve.runtime.podman.checkpoint import CRIU_CONFIG, PodmanCheckpointFailed
from tests.harness.wait import wait_until
from tests.supervisor.test_daemon_snapshots import pytestmark as criu_marks

pytestmark = [*criu_marks, pytest.mark.podman]


def _ids(port: int) -> list[int]:
    body = {"model": "test/model", "prompt": "x", "max_tokens": 4, "temperature": 0, "return_token_ids": True}

    def answered() -> list[int] | None:
        try:
            answer = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=10)
        except httpx.HTTPError:
            return None
        return list(answer.json()["choices"][0]["token_ids"]) if answer.status_code == 200 else None

    return wait_until(answered, 60, what="the server's answer")


@contextlib.contextmanager
def _serving(
    runtime: PodmanRuntime, make_spec: Callable[..., WorkloadSpec], tmp_path: Path, *, link_remap: bool
) -> Iterator[tuple[WorkloadSpec, Workload, list[int]]]:
    """The stand-in serving in a container (its semaphore mapped, its own /dev/shm, CRIU's configuration by
    the annotation), its greedy ids; whatever container holds its name is removed after."""
    config = tmp_path / "criu.conf"
    config.write_text(CRIU_CONFIG if link_remap else "")
    env = {"FAKE_VLLM_BOOT_SECONDS": "0"}
    spec = make_spec(env=env, shm_size="64m", criu_config=config)
    workload = runtime.start(spec)
    try:
        yield spec, workload, _ids(spec.port)
    finally:
        left = runtime.find(spec.deployment)
        if left is not None:
            runtime.remove(left.id)


def _killed_and_removed(runtime: PodmanRuntime, workload_id: str) -> None:
    workload = runtime.inspect(workload_id)
    assert workload is not None and workload.pid is not None
    os.kill(workload.pid, 9)
    runtime.wait(workload_id, timeout=30)
    runtime.remove(workload_id)


def test_without_link_remap_crius_refusal_is_said(
    podman_runtime: PodmanRuntime, make_spec: Callable[..., WorkloadSpec], tmp_path: Path
) -> None:
    with _serving(podman_runtime, make_spec, tmp_path, link_remap=False) as (spec, workload, _):
        with pytest.raises(PodmanCheckpointFailed) as failed:
            podman_runtime.checkpoint(workload.id, tmp_path / "archive.tar")
        assert "Can't create link remap" in failed.value.message and "Use link-remap option" in failed.value.message
        _ids(spec.port)  # CRIU let it go: still serving


def test_left_running_the_archive_cannot_be_restored_later(
    podman_runtime: PodmanRuntime, make_spec: Callable[..., WorkloadSpec], tmp_path: Path
) -> None:
    archive = tmp_path / "archive.tar"
    with _serving(podman_runtime, make_spec, tmp_path, link_remap=True) as (spec, workload, _):
        podman_runtime.checkpoint(workload.id, archive, leave_running=True)
        _killed_and_removed(podman_runtime, workload.id)
        with pytest.raises(PodmanCheckpointFailed) as failed:
            podman_runtime.restore_import(archive, spec.deployment)
        assert "link_remap" in failed.value.message and "No such file or directory" in failed.value.message


def test_checkpointed_then_restored_in_place_the_archive_restores_again_and_again(
    podman_runtime: PodmanRuntime, make_spec: Callable[..., WorkloadSpec], tmp_path: Path
) -> None:
    archive = tmp_path / "archive.tar"
    with _serving(podman_runtime, make_spec, tmp_path, link_remap=True) as (spec, started, ids):
        assert podman_runtime.checkpoint(started.id, archive) == archive.stat().st_size > 0
        assert archive.stat().st_mode & 0o777 == 0o600
        restored = podman_runtime.restore_in_place(started.id)
        assert _ids(spec.port) == ids
        for _ in range(2):
            _killed_and_removed(podman_runtime, restored.id)
            restored = podman_runtime.restore_import(archive, spec.deployment)
            assert restored.name.endswith(spec.deployment) and restored.running
            assert _ids(spec.port) == ids


def test_an_archive_that_runs_out_of_space_restores_the_container_in_place(
    podman_runtime: PodmanRuntime, make_spec: Callable[..., WorkloadSpec], tmp_path: Path
) -> None:
    """The capture's estimate (snapshot/room.py) normally refuses such a store before Podman checkpoints; when
    the disk fills anyway (the estimate wrong, another writer), writing the archive fails after Podman's
    checkpoint stopped the container: the dump step restores it in place and fails with the reason."""
    from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
    from dankserve.snapshot.sequence import Step
    from dankserve.snapshot.steps import Hooks, Outcome
    from dankserve.supervisor.worker.podman_snapshots import PodmanRunner
    from tests.harness.faults import small_snapshot_store

    with (
        _serving(podman_runtime, make_spec, tmp_path, link_remap=True) as (spec, workload, ids),
        small_snapshot_store(tmp_path) as store_dir,
    ):
        hooks = Hooks(sleep=lambda: None, wake=lambda: None, canary=lambda: ())
        outcome = Outcome("capture", workload.pid, holders=())
        gpu = StandInGpuCheckpoint(tmp_path / "records")
        runner = PodmanRunner("capture", gpu, hooks, store_dir, outcome, runtime=podman_runtime, container=workload.id)
        runner.run((Step("criu_dump"),))
        assert outcome.failure is not None and outcome.failure.step.name == "criu_dump", outcome.reason
        assert "writing Podman's checkpoint archive failed" in (outcome.reason or "")
        assert "space" in (outcome.reason or "").lower()
        left = podman_runtime.find(spec.deployment)
        assert left is not None and left.running
        assert _ids(spec.port) == ids
