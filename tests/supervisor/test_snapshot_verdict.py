"""The planning verdict on a deployment's snapshot when the GPU checkpoint cannot work here (issue 41): a host
whose checkpoint edge is the driver's (a real GPU, the NVML reader) without cuda-bindings (the `[snapshot]`
extra) says `off` with the reason and the fix before any capture is tried, without importing CUDA; a recorded
host's stand-in edge needs nothing. The missing module is simulated at the seam (`importlib.util.find_spec`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from dankserve.host.recorded import read_host
from dankserve.plan.types import Plan
from dankserve.runtime.process import ProcessRuntime
from dankserve.settings import load_settings
from dankserve.snapshot import criu, gpu
from dankserve.snapshot.gpu_helper import IsolatedGpuCheckpoint, unavailable
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
from dankserve.supervisor.worker.snapshots import LAUNCHER_PROCESS, SnapshotEdge
from dankserve.testing import write_recorded_host
from dankserve.testing.config_file import write_config

pytestmark = pytest.mark.skipif(
    criu.criu_path() is None or os.geteuid() != 0, reason="the verdict asks CRIU first: needs it and root"
)


def _missing(name: str) -> Any:
    return None


_A_SPEC = importlib.util.find_spec("json")


def _found(name: str) -> Any:
    return _A_SPEC  # any spec: "installed"


def _edge(tmp_path: Path, checkpoint: Any) -> tuple[SnapshotEdge, Any, Plan]:
    config = write_config(
        tmp_path / "dankserve.toml",
        {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)},
        {"chat": {"model": "o/m", "runtime": "process", "executable": "/bin/true", "snapshot": "auto"}},
    )
    settings = load_settings(config)
    host = read_host(write_recorded_host(tmp_path / "host.json"))
    edge = SnapshotEdge(
        "chat",
        settings=lambda: settings,
        host=host,
        gpu=lambda: checkpoint,
        edges=None,
        logger=structlog.get_logger(),
    )
    plan = Plan(
        deployment="chat",
        image="",
        model="o/m",
        vllm_version="0.33.0",
        argv=("o/m",),
        env={},
        flags=(),
        warnings=(),
        gpu_indices=(0,),
        gpu_uuids=(host.gpus[0].uuid,),
        tensor_parallel_size=1,
        numa_bind=False,
        fingerprint="f",
        gpu_memory_utilization=0.9,
    )
    return edge, settings.deployments["chat"], plan


def test_the_drivers_edge_without_cuda_bindings_is_off_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", _missing)
    edge, dep, plan = _edge(tmp_path, IsolatedGpuCheckpoint())
    verdict = edge.verdict(dep, ProcessRuntime(tmp_path / "procs"), plan, None, "0.33.0")
    assert verdict.state == "off"
    assert "cuda-bindings is not installed" in verdict.reason
    assert "pip install 'dankserve[snapshot]'" in verdict.reason


def test_with_cuda_bindings_found_or_a_stand_in_edge_the_verdict_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", _found)
    edge, dep, plan = _edge(tmp_path, IsolatedGpuCheckpoint())
    assert edge.verdict(dep, ProcessRuntime(tmp_path / "procs"), plan, None, "0.33.0").state == "absent"
    monkeypatch.setattr(importlib.util, "find_spec", _missing)
    edge, dep, plan = _edge(tmp_path, StandInGpuCheckpoint(tmp_path / "records"))
    assert edge.verdict(dep, ProcessRuntime(tmp_path / "procs"), plan, None, "0.33.0").state == "absent"


def test_bindings_missing_is_found_without_importing_cuda() -> None:
    asked: list[str] = []

    def spy(name: str) -> Any:
        asked.append(name)
        return None

    missing = gpu.bindings_missing(spy)
    assert missing is not None and missing.remedy == "host" and "dankserve[snapshot]" in (missing.fix or "")
    assert asked == ["cuda.bindings"]
    assert gpu.bindings_missing(_found) is None

    def broken(name: str) -> Any:
        raise ModuleNotFoundError("No module named 'cuda'")

    assert gpu.bindings_missing(broken) is not None


def test_only_the_drivers_own_edge_is_judged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", _missing)
    assert unavailable(IsolatedGpuCheckpoint()) is not None
    assert unavailable(IsolatedGpuCheckpoint(["--stand-in", str(tmp_path)])) is None
    assert unavailable(StandInGpuCheckpoint(tmp_path)) is None


def test_a_kept_launcher_on_the_process_runtime_is_off_with_the_reason(tmp_path: Path) -> None:
    """Its server is the launcher's child: never captured, so status says off and why, not `absent` forever."""
    edge, dep, plan = _edge(tmp_path, StandInGpuCheckpoint(tmp_path / "records"))
    verdict = edge.verdict(
        dep.model_copy(update={"launcher": True}), ProcessRuntime(tmp_path / "p"), plan, None, "0.33.0"
    )
    assert (verdict.state, verdict.reason) == ("off", LAUNCHER_PROCESS)
    assert not edge.on
    auto = edge.verdict(
        dep.model_copy(update={"launcher": "auto"}), ProcessRuntime(tmp_path / "p"), plan, None, "0.33.0"
    )
    assert auto.state == "absent", "auto leaves the launcher off under snapshots"
