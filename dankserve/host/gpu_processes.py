"""GPU memory held by given processes (issue 29: is a sleeping server's memory really freed?).

On a GPU host NVML lists each compute process with its used memory (`nvmlDeviceGetComputeRunningProcesses`,
host pids). On a machine without GPUs that drives the run from a recorded host file (tests, the
demo), the stand-in vLLM writes the same reading as one small JSON file per process into the
directory beside that file, `<hardware file>.processes/` (`FAKE_VLLM_NVML_DIR`, docs/stand-in-vllm.md):
`{"pid": N, "pid_namespace": "pid:[…]", "used_bytes": N}`, the pid as the process sees it (inside a
container its own namespace's). A host pid is matched to it through `/proc/PID/ns/pid` and the
last `NSpid` of `/proc/PID/status`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from dankserve.host.gpu_memory import _with_nvml

RECORD_BYTES = 4096
"""The largest stand-in record read (it is a few dozen bytes)."""


def stand_in_dir(hardware_file: Path | None) -> Path | None:
    """The stand-in's per-process readings for a run from a recorded host (None: a real host, NVML)."""
    return None if hardware_file is None else hardware_file.with_name(hardware_file.name + ".processes")


def process_tree(root: int | None) -> list[int]:
    """The pid and every descendant's (vLLM's engine core and workers are children of its API server).

    Read from each thread's `/proc/PID/task/TID/children` (Linux 3.5+): a few small files, where psutil
    reads every process of the host to find the children (status asks for each deployment's tree on
    every call: the web console's pages ask every 2 s). psutil where the kernel has no such files."""
    if root is None:
        return []
    found = _children_files(root)
    if found is not None:
        return found
    import psutil

    try:
        parent = psutil.Process(root)
        return [root, *(child.pid for child in parent.children(recursive=True))]
    except psutil.Error:
        return [root]


def _children_files(root: int) -> list[int] | None:
    """The tree by /proc's children files; None when this kernel does not write them."""
    if not Path(f"/proc/{root}/task/{root}/children").exists():
        return None if Path(f"/proc/{root}").exists() else [root]
    tree, pending = [root], [root]
    while pending and len(tree) < MAX_TREE:
        pid = pending.pop()
        with contextlib.suppress(OSError):  # a process that ended meanwhile has no children left to read
            for task in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError):
                    children = [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
                    tree.extend(children)
                    pending.extend(children)
    return tree


MAX_TREE = 4096
"""The most processes of one tree read (a server forks a few dozen; a fork bomb under it is not followed)."""


def held_bytes(pids: Collection[int], uuids: Sequence[str], stand_in: Path | None) -> dict[str, int] | None:
    """Bytes these processes hold on each of these GPUs; None when it cannot be read (no NVML, no record)."""
    if not pids or not uuids:
        return None
    if stand_in is not None:
        return _stand_in_held(pids, uuids, stand_in)
    return _nvml_held(pids, uuids)


def _nvml_held(pids: Collection[int], uuids: Sequence[str]) -> dict[str, int] | None:
    wanted = set(pids)

    def read(nvml: Any) -> dict[str, int] | None:
        out: dict[str, int] = {}
        for uuid in uuids:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
            total = 0
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if int(process.pid) in wanted:
                    used = process.usedGpuMemory
                    if used is None:  # NVML_VALUE_NOT_AVAILABLE (e.g. no permission): nothing to judge by
                        return None
                    total += int(used)
            out[uuid] = total
        return out

    return _with_nvml(read)


def _namespace_pid(pid: int) -> tuple[str, int] | None:
    """(pid namespace, the pid inside it) of a host pid."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("NSpid:"):
                return namespace, int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def inner_pid(pid: int) -> int | None:
    """The pid a host process has inside its own pid namespace (a container's: its init is 1)."""
    found = _namespace_pid(pid)
    return None if found is None else found[1]


def stand_in_record_path(directory: Path, pid: int) -> Path | None:
    """Where the stand-in process with this host pid keeps its record (`<namespace>-<pid>.json`, the pid as
    it sees itself); None when the pid is gone."""
    found = _namespace_pid(pid)
    if found is None:
        return None
    namespace, inner = found
    return directory / f"{namespace.removeprefix('pid:[').removesuffix(']')}-{inner}.json"


def read_stand_in_record(path: Path) -> dict[str, Any] | None:
    """One record, read bounded (the directory is writable by the stand-in: hostile); None when unusable."""
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(RECORD_BYTES))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and all(isinstance(data.get(k), int) for k in ("pid", "used_bytes")):
        return data
    return None


def _stand_in_held(pids: Collection[int], uuids: Sequence[str], directory: Path) -> dict[str, int] | None:
    records: dict[tuple[str, int], int] = {}
    with contextlib.suppress(OSError):
        for path in directory.glob("*.json"):
            data = read_stand_in_record(path)
            if data is not None:
                records[str(data.get("pid_namespace")), int(data["pid"])] = max(0, int(data["used_bytes"]))
    found = [records[key] for pid in pids if (key := _namespace_pid(pid)) is not None and key in records]
    if not found:
        return None
    # The stand-in's figure is its rank 0's: the same on each of its GPUs.
    return dict.fromkeys(uuids, sum(found))
