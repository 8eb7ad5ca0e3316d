"""Swaps you can trust (issue 29) on real vLLM: what the wake canary adds, what NVML shows after a
sleep, and swaps with `swap_group = "auto"`.

For the GPU machine (the process runtime with real vLLM, as swap.py: install-on-gpu.sh installs
it); rehearsed here with `--stand-in` (the stand-in vLLM of containers/ as the executable, a
recorded H200 host, its per-process NVML records: the figures mean nothing, the code paths are the
same). Rows:

  canary   two members (sleep_level 1, utilisation 0.9 each: one awake at a time),
           SWAPS alternating requests: each wake's `canary_seconds` (log: wake_verified, the
           canary's own time, target <= 0.05 s on the H200) and the wake's seconds with it
  nvml     the same run: every sleep's `held_bytes` (log: sleep_verified, NVML's per-process
           used memory of the sleeping server on its GPU) against the tolerance
  auto     three members with swap_group = "auto" (two small, one large: the models' own
           sizes plan their shares): requests s1, s2, big, s1, s2 ...; how many swaps each request
           caused (sleeps logged), and its first-token seconds

    python bench/real_vllm/swap_checks.py --out docs/hardware/h200x1-swap [--swaps 6]
    python bench/real_vllm/swap_checks.py --stand-in --out /tmp/swapchecks   (a rehearsal)

On the H200: `SWAP_MODEL_A`, `SWAP_MODEL_B` (model dirs, built with make_tiny_llama.py when missing:
the 1.1B/2.6B pair), `SWAP_MODEL_BIG` (the large `auto` member; default model-b), `SWAP_PYTHON`
(the Python with vLLM). Prints a table (medians) and writes OUT/swap-checks.json (raw rows, machine
noted). The rows belong in docs/hardware/h200x1-swap/ and docs/BENCHMARKS.md.
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
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

HERE = Path(__file__).resolve().parent
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
GATEWAY_PORT = 9000
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
FACTS = {  # the stand-in's model facts (the planner reads config.json of a real model dir instead)
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "max_position_embeddings": 8192,
}


class Bench:
    def __init__(self, work: Path, stand_in: bool) -> None:
        self.work = work
        self.stand_in = stand_in
        self.hardware: Path | None = None
        if stand_in:
            from dankserve.testing import write_recorded_host

            self.hardware = write_recorded_host(work / "host.json")

    def member(
        self, name: str, model: str, port: int, extra: list[str], parameter_bytes: int | None = None
    ) -> list[str]:
        python = os.environ.get("SWAP_PYTHON", sys.executable)
        env = {**SAFE_ENV}
        lines = [
            "",
            f"[deployments.{name}]",
            f'served_model_name = "{name}"',
            'runtime = "process"',
            f"port = {port}",
            "gpus = [0]",
            *extra,
        ]
        if self.stand_in:
            assert self.hardware is not None
            env |= {"FAKE_VLLM_TIME_SCALE": "0.02", "FAKE_VLLM_NVML_DIR": f"{self.hardware}.processes"}
            facts = {**FACTS, "parameter_bytes": parameter_bytes or 2_000_000_000}
            lines += [f'model = "test/{name}"', f'executable = "{STAND_IN}"']
            lines.append("model_facts = { " + ", ".join(f"{k} = {v}" for k, v in facts.items()) + " }")
        else:
            env |= {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"}
            lines += [f'model = "{model}"', f'executable = "{python}"', 'attention_backend = "TRITON_ATTN"']
            lines += ["max_model_len = 4096", 'kv_cache_dtype = "auto"', 'kv_offload = "off"']
        lines.append("env = { " + ", ".join(f'{k} = "{v}"' for k, v in env.items()) + " }")
        return lines

    def config(self, members: list[list[str]]) -> str:
        head = [
            f'state_dir = "{self.work}/state"',
            f'cache_dir = "{self.work}/cache"',
            f'hf_cache_dir = "{self.work}/hf"',
            f'vllm_version = "{"0.33.0" if self.stand_in else "0.26.0"}"',
            "boot_timeout_seconds = 900",
            "health_interval_seconds = 1",
            'log_format = "json"',
            "",
            "[gateway]",
            f'listen = "127.0.0.1:{GATEWAY_PORT}"',
            "queue_timeout_seconds = 900",
            "max_swaps_per_minute = 1000",
        ]
        return "\n".join(head + [line for member in members for line in member]) + "\n"

    def dankserve(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "dankserve", "--config", str(self.work / "dankserve.toml"), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    def status(self) -> dict[str, dict[str, Any]]:
        try:
            return {d["name"]: d for d in json.loads(self.dankserve("status", "--json").stdout)["deployments"]}
        except (ValueError, KeyError):
            return {}

    def wait(self, predicate: Any, timeout: float, what: str) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = self.status()
            if now and predicate(now):
                return now
            time.sleep(0.5)
        raise SystemExit(f"timed out waiting for {what}: {json.dumps(self.status())[:2000]}")

    def run(self, name: str, members: list[list[str]], body: Any) -> tuple[list[dict[str, Any]], Any]:
        shutil.rmtree(self.work / "state", ignore_errors=True)
        (self.work / "dankserve.toml").write_text(self.config(members))
        (self.work / "dankserve.toml").chmod(0o600)
        log_path = self.work / f"daemon-{name}.log"
        argv = [sys.executable, "-m", "dankserve", "--config", str(self.work / "dankserve.toml"), "run"]
        if self.hardware is not None:
            argv += ["--hardware", str(self.hardware)]
        with log_path.open("w") as log:
            daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            try:
                result = body()
            finally:
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(120)
                except subprocess.TimeoutExpired:
                    daemon.kill()
        events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
        return events, result


def first_token_seconds(model: str) -> float:
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": True}
    body["return_token_ids"] = True
    started = time.monotonic()
    with httpx.stream("POST", f"http://127.0.0.1:{GATEWAY_PORT}/v1/completions", json=body, timeout=900) as reply:
        if reply.status_code != 200:
            raise SystemExit(f"{model}: HTTP {reply.status_code}: {reply.read()[:500]!r}")
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                if choice.get("text") or choice.get("token_ids"):
                    return time.monotonic() - started
    raise SystemExit(f"{model}: the stream ended without a token")


def model_dirs(work: Path) -> dict[str, Path]:
    dirs = {
        "a": Path(os.environ.get("SWAP_MODEL_A", str(work / "model-a"))),
        "b": Path(os.environ.get("SWAP_MODEL_B", str(work / "model-b"))),
    }
    dirs["big"] = Path(os.environ.get("SWAP_MODEL_BIG", str(dirs["b"])))
    return dirs


def canary_and_nvml(bench: Bench, swaps: int, models: dict[str, Path]) -> dict[str, Any]:
    pair = ["gpu_memory_utilization = 0.9", 'swap_group = "bench"', 'sleep_level = "1"']
    members = [bench.member("a", str(models["a"]), 8001, pair), bench.member("b", str(models["b"]), 8002, pair)]

    def body() -> list[float]:
        bench.wait(
            lambda s: {s.get("a", {}).get("state"), s.get("b", {}).get("state")} == {"ready", "asleep"}, 1800, "a pair"
        )
        seconds = []
        for _ in range(swaps):
            asleep = next(n for n, d in bench.status().items() if d["state"] == "asleep")
            seconds.append(first_token_seconds(asleep))
        return seconds

    events, first_tokens = bench.run("canary", members, body)
    canary = [e["canary_seconds"] for e in events if e.get("event") == "wake_verified"]
    woke = [e["seconds"] for e in events if e.get("event") == "woke_up" and e.get("sleep_level") == "1"]
    held = [e["held_bytes"] for e in events if e.get("event") == "sleep_verified"]
    failed = [e for e in events if e.get("event") in ("sleep_kept_memory", "woke_wrong")]
    return {
        "canary_seconds": canary,
        "wake_seconds_with_canary": woke,
        "first_token_seconds": first_tokens,
        "held_bytes_asleep": held,
        "check_failures": failed,
    }


def auto_groups(bench: Bench, rounds: int, models: dict[str, Path]) -> dict[str, Any]:
    auto = ['swap_group = "auto"', 'sleep_level = "1"']
    members = [
        bench.member("big", str(models["big"]), 8003, auto, parameter_bytes=120_000_000_000),
        bench.member("s1", str(models["a"]), 8001, auto, parameter_bytes=20_000_000_000),
        bench.member("s2", str(models["a"]), 8002, auto, parameter_bytes=20_000_000_000),
    ]
    order = ["s1", "s2", "big"]

    def body() -> list[dict[str, Any]]:
        bench.wait(lambda s: len(s) == 3 and s.get("big", {}).get("state") == "ready", 1800, "the auto group")
        rows = []
        for number in range(rounds):
            model = order[number % len(order)]
            rows.append({"request": model, "first_token_seconds": round(first_token_seconds(model), 3)})
        return rows

    events, rows = bench.run("auto", members, body)
    sleeps = [e["deployment"] for e in events if e.get("event") == "swap_sleep"]
    return {"requests": rows, "sleeps_logged": sleeps, "utilisations": _utilisations(bench)}


def _utilisations(bench: Bench) -> dict[str, str]:
    plan = bench.dankserve("plan", *(["--hardware", str(bench.hardware)] if bench.hardware else []))
    out: dict[str, str] = {}
    for line in plan.stdout.splitlines():
        if "--served-model-name" in line and "--gpu-memory-utilization" in line:
            words = line.split()
            out[words[words.index("--served-model-name") + 1]] = words[words.index("--gpu-memory-utilization") + 1]
    return out


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--stand-in", action="store_true", help="rehearse with the stand-in vLLM (no GPU)")
    args = parser.parse_args()
    work = Path(os.environ.get("SWAP_WORK") or tempfile.mkdtemp(prefix="swapchecks-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work, args.stand_in)
    models = model_dirs(work)
    if not args.stand_in:
        for key, shape in (("a", "small"), ("b", "wide")):
            if not (models[key] / "config.json").exists():
                python = os.environ.get("SWAP_PYTHON", sys.executable)
                subprocess.run([python, str(HERE / "make_tiny_llama.py"), str(models[key]), shape], check=True)
    checks = canary_and_nvml(bench, args.swaps, models)
    auto = auto_groups(bench, args.swaps, models)
    gib = 1 << 30
    held = median([float(h) for h in checks["held_bytes_asleep"]])
    print(f"{'row':34} {'median':>10}   ({args.swaps} swaps, {'stand-in' if args.stand_in else 'real vLLM'})")
    print(f"{'canary seconds (target <= 0.05)':34} {median(checks['canary_seconds'])!s:>10}")
    print(f"{'level-1 wake seconds, with canary':34} {median(checks['wake_seconds_with_canary'])!s:>10}")
    print(f"{'NVML held asleep (GiB)':34} {'-' if held is None else round(held / gib, 3)!s:>10}")
    print(f"{'check failures':34} {len(checks['check_failures'])!s:>10}")
    print(f"{f'auto: sleeps in {args.swaps} requests':34} {len(auto['sleeps_logged'])!s:>10}")
    print(f"{'auto: utilisations':34} {json.dumps(auto['utilisations'])}")
    args.out.mkdir(parents=True, exist_ok=True)
    document = {
        "machine": os.environ.get("SWAP_MACHINE", platform.node()),
        "stand_in": args.stand_in,
        "swaps": args.swaps,
        "medians": {
            "canary_seconds": median(checks["canary_seconds"]),
            "wake_seconds_with_canary": median(checks["wake_seconds_with_canary"]),
            "held_bytes_asleep": held,
        },
        "checks": checks,
        "auto": auto,
    }
    (args.out / "swap-checks.json").write_text(json.dumps(document, indent=2) + "\n")
    print(f"written: {args.out / 'swap-checks.json'}; work dir (logs): {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
