"""Weights from the page cache to the GPU through vLLM 0.26's own safetensors iterators (issue 28).

A level-2 wake is `reload_weights`: DefaultModelLoader reads every safetensors file again and copies each
tensor into the model's parameters. On the H200 that ran at about 4.5-5 GB/s (run K), which is why level 2
misses its targets (8B 3.71 s against 3, 14B 5.99 s against 5). This times what the loader can choose,
without booting vLLM: each variant iterates the model's files and copies every tensor into a fresh GPU
tensor (as `param.copy_` does), synchronised, the files in the page cache as they are at a wake.

  lazy             the default: `safe_open` (mmap), a tensor at a time
  eager            `--safetensors-load-strategy eager`: each file read whole, then split
  multithread      `--model-loader-extra-config {"enable_multithread_load": true, "num_threads": 16}`
  fastsafetensors  `--load-format fastsafetensors` (a vLLM 0.26 dependency, so in the vllm-openai image;
                   the trimmed build here lacks it: carried as a wheel): pinned bounce buffers, no GDS

Only DefaultModelLoader implements `get_all_weights`, which reload_weights needs, so runai_streamer (no
reload) is not a candidate for level 2.

    python3 bench/real_vllm/loadbench.py MODEL_DIR [--repeat 3] [--variants lazy,eager,...] [--out FILE]

Prints a table (median seconds and GB/s per variant) and writes the rows and medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("lazy", "eager", "multithread", "fastsafetensors")


def iterator(variant: str, files: list[str]) -> Any:
    from vllm.model_executor.model_loader import weight_utils

    if variant == "lazy":
        return weight_utils.safetensors_weights_iterator(files, False)
    if variant == "eager":
        return weight_utils.safetensors_weights_iterator(files, False, "eager")
    if variant == "multithread":
        return weight_utils.multi_thread_safetensors_weights_iterator(files, False, max_workers=16)
    if variant == "fastsafetensors":
        return weight_utils.fastsafetensors_weights_iterator(files, False)
    raise SystemExit(f"unknown variant {variant!r}: choose from {', '.join(VARIANTS)}")


def one_pass(variant: str, files: list[str]) -> dict[str, Any]:
    import torch

    kept: list[Any] = []
    total = 0
    tensors = 0
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _name, tensor in iterator(variant, files):
        target = torch.empty(tensor.shape, dtype=tensor.dtype, device="cuda")
        target.copy_(tensor)
        kept.append(target)
        total += tensor.numel() * tensor.element_size()
        tensors += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    del kept
    torch.cuda.empty_cache()
    return {
        "seconds": round(seconds, 4),
        "bytes": total,
        "tensors": tensors,
        "gb_per_s": round(total / seconds / 1e9, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=Path("/tmp/results/loadbench.json"))
    args = parser.parse_args()
    files = sorted(str(p) for p in args.model.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"no *.safetensors in {args.model}")
    variants = [v for v in args.variants.split(",") if v]
    import torch

    facts: dict[str, Any] = {
        "model": args.model.name,
        "files": len(files),
        "file_bytes": sum(os.path.getsize(f) for f in files),
        "machine": os.environ.get("SWAP_MACHINE", platform.node()),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    try:
        from importlib.metadata import version

        facts["fastsafetensors"] = version("fastsafetensors")
    except Exception as error:  # not installed: that variant records its error
        facts["fastsafetensors"] = f"absent: {error}"
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeat):
        for variant in variants:  # interleaved, so drift on the shared machine hits every variant alike
            try:
                row: dict[str, Any] = {"variant": variant, "repeat": repeat, **one_pass(variant, files)}
            except Exception as error:  # one loader failing must not hide the others
                row = {"variant": variant, "repeat": repeat, "error": f"{type(error).__name__}: {error}"[:400]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    medians: dict[str, Any] = {}
    for variant in variants:
        timed = [r["seconds"] for r in rows if r["variant"] == variant and "seconds" in r]
        if timed:
            seconds = statistics.median(timed)
            medians[variant] = {
                "seconds": seconds,
                "gb_per_s": round(facts["file_bytes"] / seconds / 1e9, 2),
                "n": len(timed),
            }
    base = medians.get("lazy", {}).get("seconds")
    print(f"{'variant':<16} {'n':>2} {'median s':>9} {'GB/s':>6} {'x lazy':>7}")
    for variant, m in medians.items():
        ratio = f"{m['seconds'] / base:.2f}" if base else "-"
        print(f"{variant:<16} {m['n']:>2} {m['seconds']:>9.3f} {m['gb_per_s']:>6.2f} {ratio:>7}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"facts": facts, "rows": rows, "medians": medians}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
