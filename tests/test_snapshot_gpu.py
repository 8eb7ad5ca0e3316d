"""The GPU checkpoint edge (dankserve/snapshot/gpu.py): CUresult codes → typed errors grouped by what the
caller can do, and the driver implementation fed the codes a real driver returns (no GPU here)."""

from __future__ import annotations

import importlib.util
import os
import sys
from enum import IntEnum
from types import SimpleNamespace
from typing import Any

import pytest

from dankserve.snapshot import gpu
from dankserve.snapshot.gpu import (
    DriverGpuCheckpoint,
    GpuCheckpointError,
    GpuCheckpointUnavailable,
    GpuCheckpointUnsupported,
    GpuLockTimeout,
    GpuProcessNotFound,
    GpuWrongState,
    error_for,
)
from dankserve.snapshot.gpu_helper import IsolatedGpuCheckpoint, gpu_checkpoint_for
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint


@pytest.mark.parametrize(
    ("action", "code", "kind", "remedy"),
    [
        ("lock", 909, GpuLockTimeout, "retry"),
        ("lock", 600, GpuLockTimeout, "retry"),
        ("checkpoint", 500, GpuProcessNotFound, "undo"),
        ("restore", 1, GpuProcessNotFound, "undo"),
        ("checkpoint", 401, GpuWrongState, "undo"),
        ("checkpoint", 801, GpuCheckpointUnsupported, "deployment"),
        ("lock", 3, GpuProcessNotFound, "undo"),
        ("lock", 35, GpuCheckpointUnavailable, "host"),
        ("lock", 100, GpuCheckpointUnavailable, "host"),
        ("lock", 800, GpuCheckpointUnavailable, "host"),
        ("restore", 2, GpuCheckpointError, "undo"),
        ("unlock", 999, GpuCheckpointError, "undo"),
        ("checkpoint", 909, GpuCheckpointError, "undo"),
    ],
)
def test_each_code_maps_to_what_the_caller_can_do(action: str, code: int, kind: type, remedy: str) -> None:
    error = error_for(action, 42, code)
    assert type(error) is kind
    assert error.remedy == remedy
    assert error.code == code and error.pid == 42 and error.action == action
    assert "pid 42" in error.message and error.fix


def test_not_initialized_is_the_host_s_at_init_and_the_process_s_for_a_pid() -> None:
    """Our cuInit failing: the driver is unusable here. A pid's action answering it after our cuInit passed:
    that process never initialized CUDA (no holder; seen on the H100 with real vLLM)."""
    assert type(error_for("init", None, 3)) is GpuCheckpointUnavailable
    assert type(error_for("state", 1463, 3)) is GpuProcessNotFound
    edge = DriverGpuCheckpoint(FakeDriver(state=CUresult.CUDA_ERROR_NOT_INITIALIZED))
    assert edge.holders([os.getpid()]) == [], "not a holder: the capture goes on without it"


def test_unknown_codes_are_named_by_number_and_known_ones_by_name() -> None:
    assert "CUresult 12345" in error_for("lock", 1, 12345).message
    assert "CUDA_ERROR_NOT_SUPPORTED" in error_for("checkpoint", 1, 801).message
    assert "snapshot" in (error_for("checkpoint", 1, 801).fix or "")


class CUresult(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_NOT_INITIALIZED = 3
    CUDA_ERROR_ILLEGAL_STATE = 401
    CUDA_ERROR_NOT_SUPPORTED = 801
    CUDA_ERROR_TIMEOUT = 909


class FakeDriver:
    """cuda.bindings.driver's shape: (CUresult, value...) tuples; `codes` says what each call returns."""

    def __init__(self, version: int = 12090, **codes: CUresult) -> None:
        self.version = version
        self.codes = codes
        self.calls: list[tuple[str, int, Any]] = []

    class CUcheckpointLockArgs:
        timeoutMs = 0  # noqa: N815  (the driver's name)

    def _result(self, name: str, pid: int, args: Any = None) -> tuple[CUresult]:
        self.calls.append((name, pid, args))
        return (self.codes.get(name, CUresult.CUDA_SUCCESS),)

    def cuInit(self, flags: int) -> tuple[CUresult]:  # noqa: N802  (the driver's names)
        return (self.codes.get("init", CUresult.CUDA_SUCCESS),)

    def cuDriverGetVersion(self) -> tuple[CUresult, int]:  # noqa: N802  (the driver's names)
        return (CUresult.CUDA_SUCCESS, self.version)

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> tuple[CUresult]:  # noqa: N802  (the driver's names)
        return self._result("lock", pid, args)

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> tuple[CUresult]:  # noqa: N802  (the driver's names)
        return self._result("checkpoint", pid, args)

    def cuCheckpointProcessRestore(self, pid: int, args: Any) -> tuple[CUresult]:  # noqa: N802  (the driver's names)
        return self._result("restore", pid, args)

    def cuCheckpointProcessUnlock(self, pid: int, args: Any) -> tuple[CUresult]:  # noqa: N802  (the driver's names)
        return self._result("unlock", pid, args)

    def cuCheckpointProcessGetState(self, pid: int) -> tuple[CUresult, int]:  # noqa: N802  (the driver's names)
        return (self.codes.get("state", CUresult.CUDA_SUCCESS), 2)

    def cuCheckpointProcessGetRestoreThreadId(self, pid: int) -> tuple[CUresult, int]:  # noqa: N802  (the driver's names)
        return (CUresult.CUDA_SUCCESS, pid + 1)


def test_the_driver_implementation_runs_each_action_with_its_arguments() -> None:
    driver = FakeDriver()
    edge = DriverGpuCheckpoint(driver)
    me = os.getpid()
    edge.lock(me, timeout_s=2.5)
    edge.checkpoint(me)
    edge.restore(me)
    edge.unlock(me)
    assert [c[0] for c in driver.calls] == ["lock", "checkpoint", "restore", "unlock"]
    assert driver.calls[0][2].timeoutMs == 2500
    assert edge.state(me) == "checkpointed"
    assert edge.restore_thread_id(me) == me + 1
    assert edge.holders([me]) == [me]


def test_the_driver_implementation_maps_the_driver_codes() -> None:
    me = os.getpid()
    driver = FakeDriver(lock=CUresult.CUDA_ERROR_TIMEOUT, checkpoint=CUresult.CUDA_ERROR_NOT_SUPPORTED)
    edge = DriverGpuCheckpoint(driver)
    with pytest.raises(GpuLockTimeout):
        edge.lock(me, timeout_s=0.0)
    with pytest.raises(GpuCheckpointUnsupported) as err:
        edge.checkpoint(me)
    assert "CUDA_ERROR_NOT_SUPPORTED" in err.value.message
    driver = FakeDriver(unlock=CUresult.CUDA_ERROR_ILLEGAL_STATE, state=CUresult.CUDA_ERROR_INVALID_VALUE)
    edge = DriverGpuCheckpoint(driver)
    with pytest.raises(GpuWrongState):
        edge.unlock(me)
    assert edge.holders([me]) == [], "a process the driver does not know holds no CUDA context"


def test_a_failure_for_a_gone_process_says_so() -> None:
    edge = DriverGpuCheckpoint(FakeDriver(lock=CUresult.CUDA_ERROR_ILLEGAL_STATE))
    with pytest.raises(GpuProcessNotFound) as err:
        edge.lock(2**22 - 1)
    assert "gone" in err.value.reason


def test_an_old_driver_or_bindings_without_the_api_are_unavailable_on_this_host() -> None:
    with pytest.raises(GpuCheckpointUnavailable) as err:
        DriverGpuCheckpoint(FakeDriver(version=12040)).lock(os.getpid())
    assert "12.4" in err.value.message and "r570" in (err.value.fix or "")
    bare = SimpleNamespace(cuInit=lambda flags: (0,))
    with pytest.raises(GpuCheckpointUnavailable) as err:
        DriverGpuCheckpoint(bare).checkpoint(os.getpid())
    assert "cuCheckpointProcessLock" in err.value.message and err.value.remedy == "host"


def test_without_cuda_bindings_the_fix_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(GpuCheckpointUnavailable) as err:
        DriverGpuCheckpoint().state(os.getpid())
    assert "dankserve[snapshot]" in (err.value.fix or "")


def test_the_implementation_is_chosen_once_by_where_the_host_comes_from(tmp_path: Any) -> None:
    assert isinstance(gpu_checkpoint_for(None), IsolatedGpuCheckpoint)
    chosen = gpu_checkpoint_for(tmp_path)
    assert isinstance(chosen, StandInGpuCheckpoint) and chosen.directory == tmp_path
    assert gpu.STATE_AFTER["restore"] == "locked"


@pytest.mark.skipif(importlib.util.find_spec("cuda") is not None, reason="cuda-bindings is installed here")
def test_the_driver_s_helper_process_says_when_cuda_bindings_are_missing() -> None:
    """The driver's actions run in the helper process; its typed error comes back across it."""
    gpu = IsolatedGpuCheckpoint(deadline_s=60)
    try:
        with pytest.raises(GpuCheckpointUnavailable) as err:
            gpu.state(os.getpid())
        assert "dankserve[snapshot]" in (err.value.fix or "") and err.value.remedy == "host"
    finally:
        gpu.close()
