"""The stand-in's side of per-process GPU memory (issue 29): what NVML's process list would say of it.

With FAKE_VLLM_NVML_DIR set, the stand-in keeps one file there, `<pid namespace>-<pid>.json`:
`{"pid": N, "pid_namespace": "pid:[…]", "used_bytes": N}` (rank 0's bytes), rewritten as it boots,
sleeps and wakes. The process is the engine core, which holds the GPU (engine_core.py); its record also
carries `gpu_state` and the answer to the last GPU checkpoint action. dankserve reads it in place of
NVML when it runs from a recorded host file (dankserve/host/gpu_processes.py), matching a host pid
through /proc/PID/ns/pid and NSpid.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def _namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "pid:[unknown]"


def record_path(directory: str) -> Path:
    token = _namespace().removeprefix("pid:[").removesuffix("]")
    return Path(directory) / f"{token}-{os.getpid()}.json"


def write_record(directory: str | None, used_bytes: int, **extra: object) -> None:
    """Say that this process holds `used_bytes` now (atomically: a reader never sees half a file); `extra`:
    the engine core's GPU checkpoint state and its last answer (engine_core.py)."""
    if not directory:
        return
    path = record_path(directory)
    data = {"pid": os.getpid(), "pid_namespace": _namespace(), "used_bytes": max(0, int(used_bytes)), **extra}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(data))
        temp.replace(path)


def remove_record(directory: str | None) -> None:
    if directory:
        with contextlib.suppress(OSError):
            record_path(directory).unlink()
