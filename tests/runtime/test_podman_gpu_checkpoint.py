"""The stand-in's GPU checkpoint actions reach a container's engine core the way the driver's reach a CUDA
process: by its host pid (the stand-in vLLM image in a real Podman container, its GPU records in a mounted
directory, matched through the container's pid namespace)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dankserve.host.gpu_processes import held_bytes, process_tree
from dankserve.runtime.base import Mount, WorkloadSpec
from dankserve.runtime.podman import PodmanRuntime
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until


def test_the_stand_in_checkpoint_reaches_the_engine_core_in_a_container(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: Callable[..., WorkloadSpec], tmp_path: Path
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    spec = make_spec(
        mounts=(Mount(records, "/records"),),
        env={"FAKE_VLLM_BOOT_SECONDS": "0", "FAKE_VLLM_NVML_DIR": "/records"},
    )
    workload = podman_runtime.start(spec)
    try:
        wait_until(lambda: list(records.glob("*.json")), 60, 0.1, what="the stand-in listening (its GPU record)")
        pid = int(podman_env.podman("inspect", "-f", "{{.State.Pid}}", workload.name).stdout.strip())
        tree = process_tree(pid)
        gpu = StandInGpuCheckpoint(records)
        holders = gpu.holders(tree)
        assert len(holders) == 1 and holders[0] != pid, "the engine core, a child of the API server"
        engine = holders[0]
        awake = held_bytes(tree, ["GPU-0"], records)
        gpu.lock(engine)
        gpu.checkpoint(engine)
        assert gpu.state(engine) == "checkpointed"
        assert held_bytes(tree, ["GPU-0"], records) == {"GPU-0": 0}
        gpu.restore(engine)
        gpu.unlock(engine)
        assert gpu.state(engine) == "running"
        assert held_bytes(tree, ["GPU-0"], records) == awake
    finally:
        podman_runtime.remove(workload.id)
