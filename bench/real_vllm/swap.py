"""Swap groups on real vLLM (issue 16): a request for a sleeping model → its first token.

For the GPU machine (not run here: the figures come from a later session). Two random-weight
Llama-shaped models of different shapes (bench/real_vllm/make_tiny_llama.py MODEL_DIR SHAPE),
each at gpu_memory_utilization 0.9 in one swap group behind dankserve's gateway, served by real
vLLM (the process runtime, as proof.py; install-on-gpu.sh installs it). For each mode

  level1   sleep_level = "1"   weights to pinned CPU RAM
  level2   sleep_level = "2"   weights dropped; the staged wake with reload_weights
  stop     sleep_level = "stop"  no sleep mode: stop the server, boot it on the request
  stoplauncher  the same with `launcher = true` (issue 28: each boot forked from the kept, pre-imported
           vLLM, as dankserve boots a stopped member at its best)

the daemon is started fresh; once one model is ready and the other asleep, SWAPS requests
alternate between them, each to the model that sleeps: the time from sending the streamed
request to its first token (the first SSE chunk carrying text or token ids) is one swap. The
daemon's own sleep and wake timings (`status --json`, the `swap` block) are recorded beside it.

  python bench/real_vllm/swap.py --out docs/hardware/h200x1-swap [--swaps 5] [--stop-swaps 2]
      [--modes level1,level2,stop]

prints a table (median per mode) and writes OUT/results.json (raw swaps, medians, machine noted).
Environment: SWAP_WORK (default /tmp/swapbench), SWAP_MODEL_A / SWAP_MODEL_B (model dirs; built
with make_tiny_llama.py when missing), SWAP_PYTHON (the Python with vLLM; default this one),
SWAP_MEMBER_ENV (JSON: more environment for each member, as a rehearsal's launcher knobs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

WORK = Path(os.environ.get("SWAP_WORK", "/tmp/swapbench"))
HERE = Path(__file__).resolve().parent
MODELS = {
    "a": (Path(os.environ.get("SWAP_MODEL_A", str(WORK / "model-a"))), "small"),
    "b": (Path(os.environ.get("SWAP_MODEL_B", str(WORK / "model-b"))), "wide"),
}
PYTHON = os.environ.get("SWAP_PYTHON", sys.executable)
GATEWAY_PORT = 9000
PORTS = {"a": 8001, "b": 8002}
LEVELS = {
    "level1": "1",
    "level2": "2",
    "stop": "stop",
    "level2mt": "2",
    "level2fst": "2",
    "level2eager": "2",
    "stoplauncher": "stop",
}
# Issue 28 item 2: vLLM 0.26's multi-thread safetensors loader (DefaultModelLoader), for level 2's reload_weights
# and every boot's weights; mode level2mt is level2 with it, to measure what it gains.
MULTITHREAD_LOAD = ["--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 16}']
# level2fst and level2eager: the other loaders DefaultModelLoader (the only one reload_weights can use) offers in
# vLLM 0.26, fastsafetensors (pinned bounce buffers) and the eager strategy (each file read whole); loadbench.py
# times them without a boot.
MODE_EXTRA_ARGS = {
    "level2mt": MULTITHREAD_LOAD,
    "level2fst": ["--load-format", "fastsafetensors"],
    "level2eager": ["--safetensors-load-strategy", "eager"],
}
MODE_EXTRA_LINES = {"stoplauncher": ["launcher = true"]}
# The device machine's rule: NVLink multicast stays off in every program started there.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def daemon_head(work: Path, gateway_port: int, queue_timeout: float = 900, *more: str) -> list[str]:
    """A bench daemon's global keys and its [gateway] table (the swap and upgrade benches share them)."""
    globals_ = [f'state_dir = "{work}/state"', f'cache_dir = "{work}/cache"', f'hf_cache_dir = "{work}/hf"']
    globals_ += ['vllm_version = "0.26.0"', "boot_timeout_seconds = 900", *more, "health_interval_seconds = 1"]
    gateway = ["[gateway]", f'listen = "127.0.0.1:{gateway_port}"', f"queue_timeout_seconds = {queue_timeout:g}"]
    return [*globals_, 'log_format = "json"', "", *gateway]


def config_text(level: str, extra_args: list[str] | None = None, extra_lines: list[str] | None = None) -> str:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", **SAFE_ENV}
    env |= json.loads(os.environ.get("SWAP_MEMBER_ENV") or "{}")  # a rehearsal's launcher knobs
    env_text = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    parts = daemon_head(WORK, GATEWAY_PORT)
    for name, (path, _) in MODELS.items():
        parts += [
            "",
            f"[deployments.{name}]",
            f'model = "{path}"',
            f'served_model_name = "model-{name}"',
            'runtime = "process"',
            f'executable = "{PYTHON}"',
            f"port = {PORTS[name]}",
            "gpu_memory_utilization = 0.9",
            'swap_group = "bench"',
            f'sleep_level = "{level}"',
            'attention_backend = "TRITON_ATTN"',
            "max_model_len = 4096",
            'kv_cache_dtype = "auto"',
            'kv_offload = "off"',
            f"env = {{ {env_text} }}",
        ]
        if extra_args:
            parts.append(f"extra_args = {json.dumps(extra_args)}")
        parts += extra_lines or []
    return "\n".join(parts) + "\n"


def dankserve(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def status() -> dict[str, dict[str, Any]]:
    reply = dankserve("status", "--json")
    try:
        return {d["name"]: d for d in json.loads(reply.stdout)["deployments"]}
    except (ValueError, KeyError):
        return {}


def wait_until(
    predicate: Any, timeout: float, what: str, daemon: subprocess.Popen[bytes] | None = None
) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon is not None and daemon.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.returncode}) while waiting for {what}: see its log in {WORK}")
        now = status()
        if now and predicate(now):
            return now
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}: {json.dumps(status())[:2000]}")


def first_token_seconds(model: str) -> tuple[float, list[int]]:
    """Send a streamed greedy completion for `model` through the gateway: seconds until its first token, and
    every token id of the stream (same serving: the ids before and after a wake must match)."""
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": True}
    body["return_token_ids"] = True  # random weights decode to empty text: count token ids too (FACTS.md)
    started = time.monotonic()
    first: float | None = None
    ids: list[int] = []
    url = f"http://127.0.0.1:{GATEWAY_PORT}/v1/completions"
    with httpx.stream("POST", url, json=body, timeout=900) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{model}: HTTP {reply.status_code}: {reply.read()[:500]!r}")
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            if first is None and (choice.get("text") or choice.get("token_ids")):
                first = time.monotonic() - started
            ids += choice.get("token_ids") or []
    if first is None:
        raise SystemExit(f"{model}: the stream ended without a token")
    return first, ids


def timed_completion(model: str) -> float:
    """One greedy 16-token completion through the gateway (not streamed): seconds to its answer."""
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}
    started = time.monotonic()
    reply = httpx.post(f"http://127.0.0.1:{GATEWAY_PORT}/v1/completions", json=body, timeout=900)
    if reply.status_code != 200:
        raise SystemExit(f"{model}: HTTP {reply.status_code}: {reply.text[:500]}")
    return time.monotonic() - started


def first_requests(mode: str, member: str) -> list[dict[str, Any]]:
    """Issue 28 item 4: the first two completions after the awake member's READY, before anything else asked
    it (with sleep_level stop that READY ends its cold boot: fresh caches, the warm-up before READY)."""
    first = timed_completion(f"model-{member}")
    second = timed_completion(f"model-{member}")
    after = "cold boot" if LEVELS[mode] == "stop" else "the group's first boots"
    rows = [
        {"mode": mode, "kind": "first-request", "member": member, "after": after, "seconds": round(first, 3)},
        {
            "mode": mode,
            "kind": "second-request",
            "member": member,
            "after": after,
            "seconds": round(second, 3),
            "first_over_second": round(first / second, 2) if second > 0 else None,
        },
    ]
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def run_mode(mode: str, swaps: int) -> list[dict[str, Any]]:
    shutil.rmtree(WORK / "state", ignore_errors=True)
    text = config_text(LEVELS[mode], MODE_EXTRA_ARGS.get(mode), MODE_EXTRA_LINES.get(mode))
    (WORK / "dankserve.toml").write_text(text)
    (WORK / "dankserve.toml").chmod(0o600)
    log = (WORK / f"daemon-{mode}.log").open("w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), "run"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rows = []
    try:
        wait_until(
            lambda s: {s.get("a", {}).get("state"), s.get("b", {}).get("state")} == {"ready", "asleep"},
            1800,
            "one model ready, the other asleep",
            daemon,
        )
        awake_first = next(n for n, d in status().items() if d["state"] == "ready")
        rows += first_requests(mode, awake_first)
        # The awake member's ids before any swap (a model's first answer after its boot, no sleep yet).
        _, before_ids = first_token_seconds(f"model-{awake_first}")
        seen_ids: dict[str, list[int]] = {awake_first: before_ids}
        print(json.dumps({"mode": mode, "before_swaps": awake_first, "token_ids": before_ids}), flush=True)
        for number in range(swaps):
            before = status()
            sleeping = next(n for n, d in before.items() if d["state"] == "asleep")
            awake = "a" if sleeping == "b" else "b"
            seconds, ids = first_token_seconds(f"model-{sleeping}")
            same = seen_ids.setdefault(sleeping, ids) == ids
            after = wait_until(lambda s, a=awake: s[a]["state"] == "asleep", 120, f"{awake} asleep", daemon)
            row = {
                "mode": mode,
                "swap": number + 1,
                "woken": sleeping,
                "put_to_sleep": awake,
                "first_token_seconds": round(seconds, 3),
                "wake_seconds": after[sleeping]["swap"]["last_wake_seconds"],
                "sleep_seconds": after[awake]["swap"]["last_sleep_seconds"],
                "level": after[awake]["swap"]["last_level"],
                "token_ids": ids,
                "same_ids_as_first": same,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(120)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()
    return rows


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return round(statistics.median(values), 3) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where results.json goes (docs/hardware/NAME)")
    parser.add_argument("--swaps", type=int, default=5)
    parser.add_argument("--modes", default="level1,level2,stop", help="of " + ",".join(LEVELS))
    parser.add_argument("--stop-swaps", type=int, help="swaps for the stop mode (each a full boot); default --swaps")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    for path, shape in MODELS.values():
        if not (path / "config.json").exists():
            subprocess.run([PYTHON, str(HERE / "make_tiny_llama.py"), str(path), shape], check=True)
    rows: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        rows += run_mode(mode, args.stop_swaps if mode == "stop" and args.stop_swaps else args.swaps)
    summary = {
        mode: {
            "first_token_seconds": median([r for r in rows if r["mode"] == mode], "first_token_seconds"),
            "wake_seconds": median([r for r in rows if r["mode"] == mode], "wake_seconds"),
            "sleep_seconds": median([r for r in rows if r["mode"] == mode], "sleep_seconds"),
        }
        for mode in args.modes.split(",")
    }
    print(f"{'mode':8} {'first token (s)':>16} {'wake (s)':>9} {'sleep (s)':>10}   median of {args.swaps} swaps")
    for mode, medians in summary.items():
        cells = [medians[k] for k in ("first_token_seconds", "wake_seconds", "sleep_seconds")]
        shown = [f"{'-' if c is None else c:>{w}}" for c, w in zip(cells, (16, 9, 10), strict=True)]
        print(f"{mode:8} " + " ".join(shown))
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "machine": os.environ.get("SWAP_MACHINE", platform.node()),
        "vllm": "0.26.0",
        "swaps_per_mode": args.swaps,
        "targets_seconds": {"level1": 1.5, "level2": 2.5},
        "multithread_load": MULTITHREAD_LOAD,
        "medians": summary,
        "swaps": rows,
    }
    (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
