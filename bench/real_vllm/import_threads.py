"""Which threads does importing vLLM's CLI start? Thread names and counts after each import stage (GPU machine)."""

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path


def native() -> list[str]:
    out = []
    for task in sorted(os.listdir("/proc/self/task"), key=int):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    return out


def libs() -> list[str]:
    keep = ("openblas", "gomp", "iomp", "jemalloc", "libcuda.so", "libnvidia-ml", "mkl", "tbb")
    found = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if any(k in path for k in keep):
            found.add(os.path.basename(path))
    return sorted(found)


def main() -> None:
    report: list[dict[str, object]] = []
    for stage in ["numpy", "torch", "triton", "transformers", "vllm", "vllm.entrypoints.cli.main"]:
        t0 = time.time()
        __import__(stage)
        report.append(
            {
                "stage": stage,
                "s": round(time.time() - t0, 2),
                "native": len(native()),
                "names": native(),
                "py": [t.name for t in threading.enumerate()],
                "libs": libs(),
            }
        )
    torch = sys.modules["torch"]  # imported above
    env = {k: v for k, v in os.environ.items() if "THREAD" in k or "OMP" in k or "CUDA" in k}
    report.append({"cuda_initialized": torch.cuda.is_initialized(), "env": env})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
