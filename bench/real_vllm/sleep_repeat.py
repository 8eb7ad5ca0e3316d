"""Sleep mode's calls sent twice on real vLLM: is a repeat harmless, as dankserve's adoption assumes?

A daemon killed with -9 in the middle of a sleep or a wake is followed by one that sends the same
call again (dankserve/supervisor/machine/booting.py, `unfinished_swap`): a second `/sleep` of a sleeping
server, a `/wake_up` of awake memory, a second `wake_up?tags=weights` of a staged level-2 wake. This
boots `vllm serve MODEL --enable-sleep-mode` (VLLM_SERVER_DEV_MODE=1) and sends each call twice,
recording its HTTP status, its seconds, `/is_sleeping` and the GPU memory in use after it, and
compares greedy token ids (`ignore_eos`, `return_token_ids`) after each wake with those before the
first sleep.

  python3 bench/real_vllm/sleep_repeat.py [--out DIR]

Environment: SLEEP_MODEL (default /tmp/tinyllama, make_tiny_llama.py's model), SLEEP_VLLM (the
command before `serve`; default this Python's `-m vllm.entrypoints.cli.main`; the stand-in:
`python3 containers/fake-vllm/vllm.py`). Prints a table and writes OUT/sleep_repeat.json (the rows,
the comparisons, the verdict) and OUT/sleep_repeat-vllm.log (the server's output).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_vllm import proof

MODEL = os.environ.get("SLEEP_MODEL", "/tmp/tinyllama")
COMMAND = shlex.split(os.environ.get("SLEEP_VLLM", "")) or [sys.executable, "-m", "vllm.entrypoints.cli.main"]
PROMPTS = ("The capital of France is", "def fibonacci(n):")
BOOT_TIMEOUT = 600.0

# (step, method, path, body, is_sleeping expected after it); each step is sent twice in a row.
CALLS: tuple[tuple[str, str, str, dict[str, Any] | None, bool], ...] = (
    ("wake_up while awake", "POST", "/wake_up", None, False),
    ("sleep level 1", "POST", "/sleep?level=1", None, True),
    ("wake_up after level 1", "POST", "/wake_up", None, False),
    ("sleep level 2", "POST", "/sleep?level=2", None, True),
    ("wake_up weights (level 2)", "POST", "/wake_up?tags=weights", None, True),
    ("reload_weights", "POST", "/collective_rpc", {"method": "reload_weights"}, True),
    ("wake_up kv_cache (level 2)", "POST", "/wake_up?tags=kv_cache", None, False),
    ("reset_prefix_cache", "POST", "/reset_prefix_cache", None, False),
)
COMPARE_AFTER = {"wake_up while awake", "wake_up after level 1", "reset_prefix_cache"}
"""Steps after whose second call the greedy token ids are compared with the first boot's."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def gpu_used_mib() -> int | None:
    used = proof.gpu_used_bytes()
    return None if used is None else used >> 20


def token_ids(client: httpx.Client) -> list[list[int]]:
    """Greedy completions of PROMPTS, 16 tokens each: their token ids."""
    out = []
    for prompt in PROMPTS:
        reply = client.post("/v1/completions", json=proof.greedy_request(MODEL, prompt, 16), timeout=120)
        reply.raise_for_status()
        out.append(list(reply.json()["choices"][0].get("token_ids") or []))
    return out


def is_sleeping(client: httpx.Client) -> bool | None:
    reply = client.get("/is_sleeping", timeout=30)
    return bool(reply.json()["is_sleeping"]) if reply.status_code == 200 else None


def boot(port: int, log_path: Path) -> subprocess.Popen[bytes]:
    argv = [*COMMAND, "serve", MODEL, "--enable-sleep-mode", "--gpu-memory-utilization", "0.5"]
    argv += ["--max-model-len", "4096", "--attention-backend", "TRITON_ATTN", "--host", "127.0.0.1"]
    argv += ["--port", str(port)]
    return serve(argv, {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}, port, log_path)


def serve(argv: list[str], env: dict[str, str], port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start `argv` (a vLLM server) in its own session, logging to `log_path`; return once /health answers 200."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + BOOT_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM exited with {proc.returncode}; see {log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        time.sleep(0.5)
    raise SystemExit(f"vLLM not healthy within {BOOT_TIMEOUT:.0f} s; see {log_path}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def run(out: Path) -> dict[str, Any]:
    port = free_port()
    log_path = out / "sleep_repeat-vllm.log"
    started = time.monotonic()
    proc = boot(port, log_path)
    boot_seconds = round(time.monotonic() - started, 2)
    rows: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            baseline = token_ids(client)
            awake_mib = gpu_used_mib()
            for step, method, path, body, expect_sleeping in CALLS:
                for attempt in (1, 2):
                    t0 = time.monotonic()
                    reply = client.request(method, path, json=body, timeout=300)
                    seconds = round(time.monotonic() - t0, 3)
                    sleeping = is_sleeping(client)
                    rows.append(
                        {
                            "step": step,
                            "attempt": attempt,
                            "call": f"{method} {path}" + (f" {json.dumps(body)}" if body else ""),
                            "status": reply.status_code,
                            "body": reply.text[:200],
                            "seconds": seconds,
                            "is_sleeping": sleeping,
                            "expected_sleeping": expect_sleeping,
                            "gpu_used_mib": gpu_used_mib(),
                            "server_alive": proc.poll() is None,
                        }
                    )
                if step in COMPARE_AFTER:
                    ids = token_ids(client)
                    comparisons.append({"after": step, "same_tokens": ids == baseline, "token_ids": ids})
    finally:
        stop(proc)
    ok = (
        all(r["status"] == 200 and r["is_sleeping"] == r["expected_sleeping"] and r["server_alive"] for r in rows)
        and all(c["same_tokens"] for c in comparisons)
        and bool(baseline and all(baseline))
    )
    return {
        "model": MODEL,
        "command": COMMAND,
        "boot_seconds": boot_seconds,
        "gpu_used_mib_awake": awake_mib,
        "baseline_token_ids": baseline,
        "rows": rows,
        "comparisons": [{k: v for k, v in c.items() if k != "token_ids"} for c in comparisons],
        "repeats_harmless": ok,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args.out)
    (args.out / "sleep_repeat.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"boot {result['boot_seconds']} s; awake {result['gpu_used_mib_awake']} MiB")
    print(f"{'step':28} {'#':>1} {'status':>6} {'seconds':>8} {'asleep':>6} {'MiB':>7}")
    for r in result["rows"]:
        print(
            f"{r['step']:28} {r['attempt']:>1} {r['status']:>6} {r['seconds']:>8.3f} "
            f"{r['is_sleeping']!s:>6} {r['gpu_used_mib']!s:>7}"
        )
    for c in result["comparisons"]:
        print(f"tokens after {c['after']}: {'same' if c['same_tokens'] else 'DIFFERENT'}")
    print(f"repeats harmless: {result['repeats_harmless']}")


if __name__ == "__main__":
    main()
