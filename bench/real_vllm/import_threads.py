"""Which threads does importing vLLM start? Run on the GPU machine with vLLM on PYTHONPATH.

Imports numpy, torch, triton, transformers, vllm and vLLM's CLI in turn, and after each prints
the process's OS threads (the kernel's names), Python's threads and the shared libraries loaded
that start thread pools (OpenBLAS, OpenMP, jemalloc, the CUDA driver, NVML); last, whether CUDA
was initialised. JSON on stdout (docs/hardware/h200x1-launcher/import-threads.json).

    python3 bench/real_vllm/import_threads.py > import-threads.json
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from typing import Any

STAGES = ("numpy", "torch", "triton", "transformers", "vllm", "vllm.entrypoints.cli.main")
POOL_LIBRARIES = ("openblas", "gomp", "iomp", "jemalloc", "libcuda.so", "libnvidia-ml", "mkl", "tbb")


def os_threads() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:
            continue
    return names


def pool_libraries() -> list[str]:
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if any(name in path for name in POOL_LIBRARIES):
                found.add(os.path.basename(path))
    return sorted(found)


def main() -> None:
    report: list[dict[str, Any]] = []
    for stage in STAGES:
        began = time.monotonic()
        importlib.import_module(stage)
        names = os_threads()
        report.append(
            {
                "stage": stage,
                "s": round(time.monotonic() - began, 2),
                "native": len(names),
                "names": names,
                "py": [t.name for t in threading.enumerate()],
                "libs": pool_libraries(),
            }
        )
    torch: Any = importlib.import_module("torch")
    report.append({"cuda_initialized": bool(torch.cuda.is_initialized())})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
