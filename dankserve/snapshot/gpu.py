"""The GPU checkpoint edge: the CUDA driver's `cuCheckpointProcess*` API over another process.

A process holding a CUDA context is locked (its CUDA calls block), checkpointed (its GPU memory
copied to host memory and its device handles released: it holds 0 bytes on the GPU), and later
restored and unlocked (FACTS.md, "Snapshots"; driver r570+, exposed by cuda-bindings >= 13.0, the
optional extra `dankserve[snapshot]`). The order around CRIU is lock → checkpoint → `criu dump`;
`criu restore` → restore → unlock.

`GpuCheckpoint` is what the snapshot sequences drive. Two implementations, chosen once by the
caller (`gpu_helper.gpu_checkpoint_for`): `DriverGpuCheckpoint` here, run by the daemon in a helper
process under a deadline (`gpu_helper.IsolatedGpuCheckpoint`), and the stand-in vLLM's
(`gpu_stand_in.StandInGpuCheckpoint`) on hosts recorded in a file, where no driver exists.

Errors are grouped by what the caller can do (`remedy`): `host` (snapshots cannot work on this
host: boot normally from now on), `deployment` (this server's processes cannot be checkpointed:
do not capture this plan), `retry` (nothing changed; try again later), `undo` (the process is in
a state the sequence did not expect or the step failed: undo what was done, discard the snapshot).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any, Literal, Protocol

from dankserve.errors import EnvironmentUnusable

ProcessState = Literal["running", "locked", "checkpointed", "failed", "checkpointing", "restoring"]
Action = Literal["lock", "checkpoint", "restore", "unlock", "state", "restore_thread_id"]
Remedy = Literal["host", "deployment", "retry", "undo"]

# CUprocessState, in the driver's order (cuda.h).
STATES: tuple[ProcessState, ...] = ("running", "locked", "checkpointed", "failed", "checkpointing", "restoring")
# The state each action leaves a process in when it succeeds (what vLLM's controller checks too).
STATE_AFTER: dict[Action, ProcessState] = {
    "lock": "locked",
    "checkpoint": "checkpointed",
    "restore": "locked",
    "unlock": "running",
}
# The oldest driver with the API (CUDA 12.8, r570), as cuDriverGetVersion reports it.
MIN_DRIVER_VERSION = 12080
DEFAULT_LOCK_TIMEOUT_S = 10.0

# CUresult codes this edge tells apart (cuda.h); every other code is an `undo` failure.
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_DEINITIALIZED = 4
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_NOT_PERMITTED = 800
CUDA_ERROR_NOT_SUPPORTED = 801
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803
CUDA_ERROR_TIMEOUT = 909
CUDA_ERROR_UNKNOWN = 999
_NAMES = {
    CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
    CUDA_ERROR_NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    CUDA_ERROR_DEINITIALIZED: "CUDA_ERROR_DEINITIALIZED",
    CUDA_ERROR_INSUFFICIENT_DRIVER: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    CUDA_ERROR_NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    CUDA_ERROR_ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    CUDA_ERROR_NOT_READY: "CUDA_ERROR_NOT_READY",
    CUDA_ERROR_NOT_PERMITTED: "CUDA_ERROR_NOT_PERMITTED",
    CUDA_ERROR_NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    CUDA_ERROR_TIMEOUT: "CUDA_ERROR_TIMEOUT",
    CUDA_ERROR_UNKNOWN: "CUDA_ERROR_UNKNOWN",
}
_FIX_SNAPSHOT = "see docs/snapshots.md (limits); without snapshots every restart is a normal boot"
FIX_EXTRA = "install dankserve with its snapshot extra: pip install 'dankserve[snapshot]'"


class GpuCheckpointError(EnvironmentUnusable):
    """A GPU checkpoint action failed; `remedy` says what the caller can do about it."""

    remedy: Remedy = "undo"

    def __init__(self, action: str, pid: int | None, reason: str, *, code: int | None = None, fix: str = "") -> None:
        who = f" of pid {pid}" if pid is not None else ""
        super().__init__(f"GPU {action}{who} failed: {reason}", fix=fix or _FIX_SNAPSHOT)
        self.action = action
        self.pid = pid
        self.reason = reason
        self.code = code


class GpuCheckpointUnavailable(GpuCheckpointError):
    """No checkpoint API here: cuda-bindings missing or too old, a driver older than r570, no GPU,
    no permission. Nothing about this host will change by trying again."""

    remedy = "host"


class GpuCheckpointUnsupported(GpuCheckpointError):
    """The driver cannot checkpoint this process (CUDA IPC or UVM memory, NCCL: TP > 1)."""

    remedy = "deployment"


class GpuLockTimeout(GpuCheckpointError):
    """The lock did not get the process's CUDA locks in time (work in flight); it is left running."""

    remedy = "retry"


class GpuProcessNotFound(GpuCheckpointError):
    """No such process, or it holds no CUDA context (it died, or the pid is not a CUDA process)."""


class GpuWrongState(GpuCheckpointError):
    """The process is not in the state the action needs (e.g. checkpoint of an unlocked process)."""


def code_name(code: int) -> str:
    return _NAMES.get(code, f"CUresult {code}")


def error_for(action: str, pid: int | None, code: int, name: str | None = None) -> GpuCheckpointError:
    """The typed error of a CUresult other than CUDA_SUCCESS (pure: the driver's words → what to do)."""
    said = name or code_name(code)
    if code in (CUDA_ERROR_TIMEOUT, CUDA_ERROR_NOT_READY) and action == "lock":
        return GpuLockTimeout(action, pid, f"{said}: the process kept its CUDA locks past the timeout", code=code)
    if code in (CUDA_ERROR_NOT_FOUND, CUDA_ERROR_INVALID_VALUE):
        return GpuProcessNotFound(action, pid, f"{said}: no CUDA process with this pid", code=code)
    if code == CUDA_ERROR_NOT_INITIALIZED and pid is not None:
        # Our own cuInit passed (DriverGpuCheckpoint._api): the process has not initialized CUDA. Seen on an
        # H100 with real vLLM 0.26.0: a process of the server's tree (not its engine) answered this to
        # cuCheckpointProcessGetState, which failed the daemon's capture before it was read as "no holder".
        return GpuProcessNotFound(action, pid, f"{said}: the process has not initialized CUDA", code=code)
    if code == CUDA_ERROR_ILLEGAL_STATE:
        return GpuWrongState(action, pid, f"{said}: the process is not in a state that allows {action}", code=code)
    if code == CUDA_ERROR_NOT_SUPPORTED:
        return GpuCheckpointUnsupported(
            action,
            pid,
            f"{said}: the driver cannot checkpoint this process (CUDA IPC or UVM memory, NCCL with TP > 1)",
            code=code,
            fix='set `snapshot = "off"` for this deployment, or serve it on one GPU without custom all-reduce',
        )
    if code in (
        CUDA_ERROR_NOT_INITIALIZED,
        CUDA_ERROR_DEINITIALIZED,
        CUDA_ERROR_INSUFFICIENT_DRIVER,
        CUDA_ERROR_NO_DEVICE,
        CUDA_ERROR_SYSTEM_DRIVER_MISMATCH,
    ):
        return GpuCheckpointUnavailable(
            action, pid, f"{said}: the CUDA driver is unusable here", code=code, fix="check `nvidia-smi` as root"
        )
    if code == CUDA_ERROR_NOT_PERMITTED:
        return GpuCheckpointUnavailable(
            action, pid, f"{said}: not permitted", code=code, fix="run the daemon as root (as its systemd unit does)"
        )
    return GpuCheckpointError(action, pid, said, code=code)


class GpuCheckpoint(Protocol):
    """One function per action on one process; each raises a `GpuCheckpointError`."""

    def holders(self, pids: list[int]) -> list[int]:
        """Those of `pids` that hold a CUDA context (the processes a capture checkpoints)."""
        ...

    def lock(self, pid: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None: ...

    def checkpoint(self, pid: int) -> None: ...

    def restore(self, pid: int) -> None: ...

    def unlock(self, pid: int) -> None: ...

    def state(self, pid: int) -> ProcessState: ...

    def restore_thread_id(self, pid: int) -> int: ...


def state_of(value: int) -> ProcessState:
    if 0 <= value < len(STATES):
        return STATES[value]
    raise GpuCheckpointError("state", None, f"unknown CUprocessState {value}")


_FUNCTIONS = (
    "cuInit",
    "cuDriverGetVersion",
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
    "CUcheckpointLockArgs",
)


def bindings_missing(find_spec: Callable[[str], Any] | None = None) -> GpuCheckpointUnavailable | None:
    """cuda-bindings absent, found without importing it (planning and the doctor ask before any capture
    is tried; importing it would load the CUDA bindings into the daemon). `find_spec` is the seam
    (default: the import system's, looked up at the call)."""
    try:
        found = (find_spec or importlib.util.find_spec)("cuda.bindings") is not None
    except (ImportError, ValueError):  # no `cuda` package at all, or a broken one
        found = False
    if found:
        return None
    return GpuCheckpointUnavailable("load", None, "cuda-bindings is not installed", fix=FIX_EXTRA)


def _load_driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise GpuCheckpointUnavailable("load", None, f"cuda-bindings is not installed ({exc})", fix=FIX_EXTRA) from exc
    return driver


class DriverGpuCheckpoint:
    """`GpuCheckpoint` over `cuda.bindings.driver`, imported on first use (the base install has no
    CUDA package). `driver` may be handed in: a module with the same functions (tests feed it the
    CUresult codes a real driver returns)."""

    def __init__(self, driver: Any = None) -> None:
        self._driver = driver
        self._ready = False

    def _api(self) -> Any:
        if self._ready:
            return self._driver
        driver = self._driver if self._driver is not None else _load_driver()
        missing = [name for name in _FUNCTIONS if not hasattr(driver, name)]
        if missing:
            raise GpuCheckpointUnavailable(
                "load",
                None,
                f"cuda-bindings has no {', '.join(missing)}",
                fix="upgrade cuda-bindings to 13.0 or newer: pip install 'dankserve[snapshot]'",
            )
        self._driver = driver
        self._check(driver.cuInit(0), "init", None)
        version = int(self._check(driver.cuDriverGetVersion(), "init", None))
        if version < MIN_DRIVER_VERSION:
            raise GpuCheckpointUnavailable(
                "init",
                None,
                f"the NVIDIA driver supports CUDA {version // 1000}.{version % 1000 // 10}; the checkpoint API needs "
                "12.8 (driver r570) or newer",
                fix="upgrade the NVIDIA driver to r570 or newer",
            )
        self._ready = True
        return driver

    @staticmethod
    def _check(result: Any, action: str, pid: int | None) -> Any:
        """cuda-bindings returns (CUresult, value...) tuples; the value, or the typed error."""
        items = tuple(result) if isinstance(result, tuple | list) else (result,)
        code = int(items[0])
        if code != CUDA_SUCCESS:
            if pid is not None and not pid_exists(pid):
                raise GpuProcessNotFound(action, pid, f"{code_name(code)}: the process is gone", code=code)
            raise error_for(action, pid, code, getattr(items[0], "name", None))
        return items[1] if len(items) > 1 else None

    def holders(self, pids: list[int]) -> list[int]:
        found = []
        for pid in pids:
            try:
                self.state(pid)
            except GpuProcessNotFound:
                continue
            found.append(pid)
        return found

    def lock(self, pid: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        driver = self._api()
        args = driver.CUcheckpointLockArgs()
        args.timeoutMs = max(1, int(timeout_s * 1000))  # 0 would mean no timeout at all
        self._check(driver.cuCheckpointProcessLock(pid, args), "lock", pid)

    def checkpoint(self, pid: int) -> None:
        driver = self._api()
        self._check(driver.cuCheckpointProcessCheckpoint(pid, None), "checkpoint", pid)

    def restore(self, pid: int) -> None:
        driver = self._api()
        self._check(driver.cuCheckpointProcessRestore(pid, None), "restore", pid)

    def unlock(self, pid: int) -> None:
        driver = self._api()
        self._check(driver.cuCheckpointProcessUnlock(pid, None), "unlock", pid)

    def state(self, pid: int) -> ProcessState:
        driver = self._api()
        return state_of(int(self._check(driver.cuCheckpointProcessGetState(pid), "state", pid)))

    def restore_thread_id(self, pid: int) -> int:
        driver = self._api()
        return int(self._check(driver.cuCheckpointProcessGetRestoreThreadId(pid), "restore_thread_id", pid))


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
