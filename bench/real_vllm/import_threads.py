"""Which threads does importing vLLM's CLI start? Thread names and counts after each import stage (GPU machine)."""
import os, sys, threading, time, json

def native():
    out = []
    for t in sorted(os.listdir("/proc/self/task"), key=int):
        try:
            out.append(open(f"/proc/self/task/{t}/comm").read().strip())
        except OSError:
            pass
    return out

def libs():
    keep = ("openblas", "gomp", "iomp", "jemalloc", "libcuda.so", "libnvidia-ml", "mkl", "tbb")
    found = set()
    for line in open("/proc/self/maps"):
        path = line.split()[-1]
        if any(k in path for k in keep):
            found.add(os.path.basename(path))
    return sorted(found)

report = []
for stage in ["numpy", "torch", "triton", "transformers", "vllm", "vllm.entrypoints.cli.main"]:
    t0 = time.time()
    __import__(stage)
    report.append({"stage": stage, "s": round(time.time() - t0, 2), "native": len(native()), "names": native(),
                   "py": [t.name for t in threading.enumerate()], "libs": libs()})
import torch
report.append({"cuda_initialized": torch.cuda.is_initialized(), "env": {k: v for k, v in os.environ.items() if "THREAD" in k or "OMP" in k or "CUDA" in k}})
print(json.dumps(report, indent=1))
