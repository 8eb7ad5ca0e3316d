"""The GPU checkpoint actions in a helper process, each under a deadline (as vLLM's own controller runs
them: `vllm/utils/cuda_process_checkpoint.py`).

A driver call can block (a lock waits for the process's CUDA work; a checkpoint copies GiBs), and
loading libcuda costs the caller its memory: the daemon keeps both out of its own process. The helper
(`python -m dankserve.snapshot.gpu_helper`) builds the implementation once and answers one JSON line
per action; an action past its deadline kills the helper (the next action starts a new one) and fails
with `GpuCheckpointError` (remedy `undo`). Errors come back typed, by class name.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from dankserve.snapshot.gpu import (
    DEFAULT_LOCK_TIMEOUT_S,
    STATES,
    DriverGpuCheckpoint,
    GpuCheckpoint,
    GpuCheckpointError,
    GpuCheckpointUnavailable,
    ProcessState,
    bindings_missing,
)
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint

DEFAULT_DEADLINE_S = 120.0
_ACTIONS = ("holders", "lock", "checkpoint", "restore", "unlock", "state", "restore_thread_id")
_ANSWER_BYTES = 64 * 1024
# The typed errors an answer may name (gpu.py's, one level below the base).
_KINDS: list[type[GpuCheckpointError]] = [GpuCheckpointError, *GpuCheckpointError.__subclasses__()]
_ERRORS: dict[str, type[GpuCheckpointError]] = {cls.__name__: cls for cls in _KINDS}


class IsolatedGpuCheckpoint:
    """`GpuCheckpoint` whose actions run in the helper process; `helper_args` choose its implementation
    (none: the driver; `--stand-in DIR`: the stand-in's, for tests)."""

    def __init__(self, helper_args: Sequence[str] = (), *, deadline_s: float = DEFAULT_DEADLINE_S) -> None:
        self.helper_args = tuple(helper_args)
        self.deadline_s = deadline_s
        self._proc: subprocess.Popen[bytes] | None = None

    def _helper(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "dankserve.snapshot.gpu_helper", *self.helper_args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
            )
        return self._proc

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def _call(self, action: str, pid: int | None, deadline_s: float | None = None, **extra: Any) -> Any:
        proc = self._helper()
        assert proc.stdin is not None and proc.stdout is not None
        deadline = deadline_s if deadline_s is not None else self.deadline_s
        try:
            proc.stdin.write(json.dumps({"action": action, "pid": pid, **extra}).encode() + b"\n")
            proc.stdin.flush()
            line = _read_line(proc.stdout, deadline)
        except (OSError, TimeoutError) as exc:
            self.close()
            why = f"no answer in {deadline:g} s" if isinstance(exc, TimeoutError) else f"the helper failed: {exc}"
            raise GpuCheckpointError(action, pid, f"{why}; the helper was killed") from None
        if not line:
            self.close()
            raise GpuCheckpointError(action, pid, "the helper exited without an answer")
        answer = json.loads(line)
        if "error" in answer:
            raise _error_from(answer["error"])
        return answer.get("value")

    def holders(self, pids: list[int]) -> list[int]:
        return [int(p) for p in self._call("holders", None, pids=list(pids))]

    def lock(self, pid: int, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S) -> None:
        self._call("lock", pid, timeout_s + self.deadline_s, timeout_s=timeout_s)

    def checkpoint(self, pid: int) -> None:
        self._call("checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._call("restore", pid)

    def unlock(self, pid: int) -> None:
        self._call("unlock", pid)

    def state(self, pid: int) -> ProcessState:
        value = self._call("state", pid)
        if value not in STATES:
            raise GpuCheckpointError("state", pid, f"the helper answered the state {value!r}")
        return value  # type: ignore[no-any-return]

    def restore_thread_id(self, pid: int) -> int:
        return int(self._call("restore_thread_id", pid))


def _read_line(stream: IO[bytes], deadline_s: float) -> bytes:
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(deadline_s):
            raise TimeoutError
    return stream.readline(_ANSWER_BYTES)


def _error_from(data: Any) -> GpuCheckpointError:
    if not isinstance(data, dict):
        return GpuCheckpointError("helper", None, f"an unreadable answer: {data!r}"[:200])
    cls = _ERRORS.get(str(data.get("class")), GpuCheckpointError)
    pid, code = data.get("pid"), data.get("code")
    error = cls(
        str(data.get("action")),
        pid if isinstance(pid, int) else None,
        str(data.get("reason")),
        code=code if isinstance(code, int) else None,
        fix=str(data.get("fix") or ""),
    )
    return error


def _serve(gpu: GpuCheckpoint) -> None:
    """The helper's loop: one request per line on stdin, one answer per line on stdout."""
    for line in sys.stdin.buffer:
        request = json.loads(line)
        action, pid = request["action"], request.get("pid")
        try:
            if action not in _ACTIONS:
                raise GpuCheckpointError(str(action), None, "not an action of the helper")
            if action == "holders":
                value: Any = gpu.holders([int(p) for p in request["pids"]])
            elif action == "lock":
                gpu.lock(pid, float(request["timeout_s"]))
                value = None
            else:
                value = getattr(gpu, action)(pid)
            answer: dict[str, Any] = {"value": value}
        except GpuCheckpointError as exc:
            answer = {"error": {"class": type(exc).__name__, "action": exc.action, "pid": exc.pid}}
            answer["error"].update(reason=exc.reason, code=exc.code, fix=exc.fix)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def gpu_checkpoint_for(stand_in: Path | None, *, deadline_s: float = DEFAULT_DEADLINE_S) -> GpuCheckpoint:
    """The one choice of implementation, made by the caller once: the stand-in's records directory on a
    recorded host (`host.gpu_processes.stand_in_dir`), else the driver, in its helper process."""
    if stand_in is None:
        return IsolatedGpuCheckpoint(deadline_s=deadline_s)
    return StandInGpuCheckpoint(stand_in)


def unavailable(gpu: GpuCheckpoint) -> GpuCheckpointUnavailable | None:
    """Why `gpu` cannot work on this host, known before any action (planning's verdict and the doctor):
    the driver's edge without cuda-bindings. The stand-in's edge (a recorded host) needs nothing."""
    # The helper runs in this interpreter (sys.executable), so what this one finds is what it imports.
    driver = isinstance(gpu, IsolatedGpuCheckpoint) and not gpu.helper_args
    return bindings_missing() if driver else None


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    stand_in = args[:1] == ["--stand-in"] and len(args) == 2
    _serve(StandInGpuCheckpoint(Path(args[1])) if stand_in else DriverGpuCheckpoint())


if __name__ == "__main__":
    main()
