"""Issue 44 item 4 by hand on the GPU machine: two real vLLM servers (the 8B and the 14B) taking turns on one GPU
with suspended sleeps: sleep level 1, then a CUDA lock + checkpoint of the sleeper's processes (its context and
graphs leave the GPU); a wake is CUDA restore + unlock + wake_up. Records the sleeping member's GPU memory under a
plain level-1 sleep and suspended (nvidia-smi's memory.used, the whole GPU), and each swap's seconds to the first
streamed token of the member woken, with its breakdown and the greedy text compared. Rows as JSON lines.

    swap_suspend.py MODEL_A LABEL_A MODEL_B LABEL_B [--no-gpu]   (SWAPS=5, UTIL=0.4, SERVE_ARGS)"""

from __future__ import annotations

import os
import signal
import sys
import time

from roundtrip import Driver, NoGpu  # type: ignore[import-not-found]
from vllm_snap import OUT, Server, gpu_pids, gpu_resume, gpu_suspend, gpu_used_mib, row, subreaper, tree  # type: ignore[import-not-found]


def settle_mib() -> str:
    """memory.used after the driver has settled (a freed context shows up a moment later)."""
    time.sleep(1.0)
    return str(gpu_used_mib())


def suspend(srv: Server, drv: Driver | NoGpu, b: dict[str, object], prefix: str = "") -> list[int]:
    b[prefix + "sleep_s"] = round(srv.post("/sleep?level=1"), 3)
    gp = gpu_pids(drv, tree(srv.root))
    gpu_suspend(drv, gp, b, prefix + "gpu_checkpoint_s")
    return list(gp)


def resume(srv: Server, drv: Driver | NoGpu, gp: list[int], b: dict[str, object]) -> str:
    gpu_resume(drv, gp, b)
    b["wake_s"] = round(srv.post("/wake_up"), 3)
    t = time.monotonic()
    first, text = srv.first_token(120)
    b["first_token_s"] = round(first - t, 3)
    return str(text)


def main() -> None:
    no_gpu = "--no-gpu" in sys.argv
    subreaper()
    args = [a for a in sys.argv[1:] if a != "--no-gpu"]
    OUT.mkdir(parents=True, exist_ok=True)
    drv: Driver | NoGpu = NoGpu() if no_gpu else Driver()
    extra = os.environ.get("SERVE_ARGS", "").split()
    util = ["--gpu-memory-utilization", os.environ.get("UTIL", "0.4")]
    members = []
    for i, (model, label) in enumerate(((args[0], args[1]), (args[2], args[3]))):
        members.append((label, Server(model, 8021 + i, OUT / f"swap-{label}.log", [*extra, *util])))
    greedy: dict[str, str] = {}
    held: dict[str, list[int]] = {}
    before = gpu_used_mib()
    for label, srv in members:
        t0 = time.monotonic()
        srv.start()
        _, greedy[label] = srv.first_token()
        b: dict[str, object] = {"boot_s": round(time.monotonic() - t0, 3), "gpu_used_mib_awake": gpu_used_mib()}
        b["sleep_s"] = round(srv.post("/sleep?level=1"), 3)
        b["gpu_used_mib_plain_sleep"] = settle_mib()
        srv.post("/wake_up")
        held[label] = suspend(srv, drv, b)
        b["gpu_used_mib_suspended"] = settle_mib()
        b["gpu_used_mib_before_boot"] = before
        row(kind="swap-suspend-residual", model=label, runtime="process", seconds=b["boot_s"], breakdown=b)
        before = b["gpu_used_mib_suspended"]
    awake: tuple[str, Server] | None = None
    for n in range(int(os.environ.get("SWAPS", "5"))):
        for label, srv in members:
            b = {}
            t0 = time.monotonic()
            if awake is not None:
                held[awake[0]] = suspend(awake[1], drv, b, "out_")
            text = resume(srv, drv, held[label], b)
            row(
                kind="swap-suspend",
                model=label,
                runtime="process",
                seconds=round(time.monotonic() - t0, 3),
                n=n + 1,
                came_from=awake[0] if awake else None,
                same_text=text == greedy[label],
                breakdown=b,
            )
            awake = (label, srv)
    for _, srv in members:
        srv.kill(signal.SIGTERM)
    row(kind="down", model="+".join(m[0] for m in members), gpu_used_mib_after=settle_mib())


if __name__ == "__main__":
    main()
