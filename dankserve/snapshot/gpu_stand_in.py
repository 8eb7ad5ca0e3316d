"""`GpuCheckpoint` of the stand-in vLLM (docs/stand-in-vllm.md, "Process shape"), for hosts recorded
in a file, where there is no driver.

The stand-in's engine core keeps its GPU context as a record in the stand-in directory
(`host.gpu_processes`: `<pid namespace>-<pid>.json`, its `used_bytes` and `gpu_state`). An action is
asked per process, as the driver's are: dankserve writes `<same name>.request` (`{"id", "action"}`)
and sends the process SIGUSR2; the process does it and answers in its record (`answered`: the id,
`code`: a CUresult, 0 on success). A checkpoint drops the record's bytes to 0, a restore brings them
back; `FAKE_VLLM_GPU_CHECKPOINT_FAIL` makes its checkpoint answer a CUresult error.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from dankserve.host.gpu_processes import read_stand_in_record, stand_in_record_path
from dankserve.snapshot.gpu import (
    DEFAULT_LOCK_TIMEOUT_S,
    STATES,
    GpuCheckpointError,
    GpuLockTimeout,
    GpuProcessNotFound,
    ProcessState,
    error_for,
)

REQUEST_SUFFIX = ".request"
ENGINE_CORE_NAME = "VLLM::EngineCor"
"""The stand-in engine core's process name (vLLM's "VLLM::EngineCore" as the kernel keeps it): only a
process so named is signalled (SIGUSR2 would end any other; a stale record may name a reused pid)."""
ACTION_SIGNAL = signal.SIGUSR2
_ANSWER_TIMEOUT_S = 30.0
_POLL_S = 0.005


class StandInGpuCheckpoint:
    """The stand-in's actions through its request files; the same errors as the driver's."""

    def __init__(self, directory: Path, *, answer_timeout_s: float = _ANSWER_TIMEOUT_S) -> None:
        self.directory = directory
        self.answer_timeout_s = answer_timeout_s

    def holders(self, pids: list[int]) -> list[int]:
        return [pid for pid in pids if self._record(pid) is not None]

    def _record(self, pid: int, *, published: bool = True) -> Path | None:
        """The record of the stand-in engine core with this pid; None for any other process. A tree CRIU
        restored after a graceful stop (which deleted the record, as NVML forgets an ended process) is
        asked without one (`published` off): its answer writes the record again."""
        try:
            name = Path(f"/proc/{pid}/comm").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            return None
        path = stand_in_record_path(self.directory, pid)
        if name != ENGINE_CORE_NAME or path is None or (published and read_stand_in_record(path) is None):
            return None
        return path

    def lock(self, pid: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self._ask(pid, "lock", timeout_s)

    def checkpoint(self, pid: int) -> None:
        self._ask(pid, "checkpoint")

    def restore(self, pid: int) -> None:
        self._ask(pid, "restore")

    def unlock(self, pid: int) -> None:
        self._ask(pid, "unlock")

    def state(self, pid: int) -> ProcessState:
        record = self._ask(pid, "state")
        state = record.get("gpu_state")
        if state not in STATES:
            raise GpuCheckpointError("state", pid, f"the stand-in answered the state {state!r}")
        return state  # type: ignore[no-any-return]

    def restore_thread_id(self, pid: int) -> int:
        self._ask(pid, "restore_thread_id")
        return pid  # the stand-in restores on its main thread

    def _ask(self, pid: int, action: str, timeout_s: float | None = None) -> dict[str, Any]:
        record = self._record(pid, published=action in ("lock", "checkpoint"))
        if record is None:
            raise GpuProcessNotFound(action, pid, "no stand-in engine core with a GPU context has this pid")
        ident = secrets.token_hex(8)
        request = record.with_suffix(REQUEST_SUFFIX)
        temp = request.with_name(f".{request.name}.{ident}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"id": ident, "action": action}, handle)
        os.replace(temp, request)
        try:
            os.kill(pid, ACTION_SIGNAL)
        except ProcessLookupError:
            raise GpuProcessNotFound(action, pid, "the process is gone") from None
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.answer_timeout_s)
        while True:
            data = read_stand_in_record(record)
            if data is not None and data.get("answered") == ident:
                break
            if time.monotonic() > deadline:
                if action == "lock":
                    raise GpuLockTimeout(action, pid, f"no lock within {timeout_s:g} s")
                raise GpuCheckpointError(action, pid, f"the stand-in did not answer in {self.answer_timeout_s:g} s")
            time.sleep(_POLL_S)
        request.unlink(missing_ok=True)
        code = data.get("code")
        if not isinstance(code, int) or isinstance(code, bool):
            raise GpuCheckpointError(action, pid, f"the stand-in answered the code {code!r}")
        if code != 0:
            raise error_for(action, pid, code)
        return data
