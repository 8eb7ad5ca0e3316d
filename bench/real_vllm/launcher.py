"""Issue 15's figures on real vLLM: launcher restarts against the manual best, on the GPU machine.

Prepared without a GPU; run it on the H200 (bench/real_vllm/install-on-gpu.sh first, dankserve's
dependencies on PYTHONPATH, the 1.1B test model from make_tiny_llama.py):

    PROOF_WORK=/tmp/launcher OUT=$OUT python bench/real_vllm/launcher.py all [--repeat 3] [--forks 10]

Steps (comma-separated, or `all` in this order; state lives in PROOF_WORK):

  cold                   the daemon with `launcher = true`, fresh caches: first boot, KV bytes learned
  launcher-kill          the launcher's server killed with -9: the same launcher forks the next one
  launcher-down-up       `down` then `up`: the launcher stays, a new server
  launcher-config-change a reload changing max_num_seqs: the launcher stays, a new server (it profiles)
  multithread-load       reloads to vLLM's multi-thread weight loader, kills the server under it, reloads back
  fork-repeat            --forks more `down`/`up`s in a row: every forked boot must be ready (fork safety)
  greedy                 the same greedy token ids from a launcher boot and from a plain boot by hand
                         (`vllm serve`, or `podman run`); stops the daemon
  manual-best            stops the daemon, then by hand: `vllm serve` with the compile cache and the learned
                         bytes (the baseline)
  stop                   SIGTERM to the daemon: nothing may be left running

A dry run without a GPU: PROOF_VLLM_EXECUTABLE=containers/fake-vllm/vllm.py, FAKE_VLLM_TIME_SCALE=0.05,
the stand-in's launcher env (docs/stand-in-vllm.md) exported, LAUNCHER_RESULTS=/tmp/x.json.

Every boot becomes one row of docs/hardware/h200x1-launcher/results.json (and OUT/results.json):
{"kind", "runtime", "seconds" (the event to /health 200 and ready), "mode" (fork | plain), ...}.
The targets (issue 15): launcher-kill and launcher-down-up medians <= 0.4x manual-best's median,
launcher-config-change <= 0.5x; `summary` prints the ratios.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PROOF_WORK", "/tmp/launcher")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_vllm import proof
from dankserve.runtime.base import workload_name
from dankserve.runtime.launcher_client import LauncherClient

RESULTS = Path(
    os.environ.get("LAUNCHER_RESULTS")  # a dry run elsewhere
    or Path(__file__).resolve().parents[2] / "docs" / "hardware" / "h200x1-launcher" / "results.json"
)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
RUNTIME = proof.RUNTIME
"""process (default) or podman: PROOF_RUNTIME, as for proof.py (PROOF_IMAGE names the vLLM image)."""
MODEL = os.environ.get("LAUNCHER_MODEL_NAME") or Path(proof.MODEL).name
"""The model's name in each row (issue 28: several sizes in one results file)."""
SERVER_STAMPS: list[proof.LineWatch] = []
"""The stamped copy of the launcher's log (started by `cold`, after the state is wiped)."""


MULTITHREAD_LOAD = ["--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 16}']
"""vLLM 0.26's multi-thread safetensors loader (DefaultModelLoader's extra config), step `multithread-load`."""


def config_text(max_num_seqs: int | None = None, extra_args: list[str] | None = None) -> str:
    text = proof.config_text(proof.EXECUTABLE) + "launcher = true\n"
    if max_num_seqs is not None:
        text += f"max_num_seqs = {max_num_seqs}\n"
    if extra_args:
        text += f"extra_args = {json.dumps(extra_args)}\n"
    return text


def rows() -> list[dict[str, Any]]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else []


def add_row(row: dict[str, Any]) -> None:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    data = [*rows(), {"runtime": RUNTIME, "model": MODEL, "at": at, **row}]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    out = os.environ.get("OUT")
    if out:
        (Path(out) / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"== {json.dumps(row)}", flush=True)


def launcher() -> LauncherClient:
    return LauncherClient(proof.WORK / "state" / "launchers" / "tiny")


def timed_boot(kind: str, action: Any, args: argparse.Namespace, **fields: Any) -> None:
    """`action`, then the next ready boot: seconds from the action to ready, and what the launcher did;
    with --requests, then the first and second request to it."""
    boots = (proof.deployment_status() or {}).get("boots", 0)
    begun = time.time()
    action()
    status = proof.wait_status(lambda d: d["state"] == "ready" and d["boots"] > boots, 900)
    ready = time.time()
    seconds = ready - begun
    info = launcher().status()
    server = info.server
    add_row(
        {
            "kind": kind,
            "seconds": round(seconds, 2),
            "began_at": round(begun, 3),
            "ready_at": round(ready, 3),
            "server": server.id if server else None,
            "mode": server.mode if server else None,
            "mode_reason": server.mode_reason if server else None,
            "import_seconds": info.import_seconds,
            "import_threads": list(info.import_threads),
            "kv_cache_learned_used": status["kv_cache_learned_used"],
            "kv_cache_memory_bytes": status["kv_cache_memory_bytes"],
            "compile_cache_hit": status["compile_cache_hit"],
            "message": status.get("message"),
            **fields,
        }
    )
    if args.requests:
        request_pair(kind)


def timed_request(port: int = proof.PORT) -> dict[str, Any]:
    """One short greedy completion, timed from sending to its answer (the served model's name first)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    try:
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
        body = json.dumps(proof.greedy_request(model, PROMPTS[0], 16))
        sent = time.time()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        took = time.time() - sent
    finally:
        conn.close()
    if response.status != 200:
        raise SystemExit(f"timed request: HTTP {response.status}: {answer}")
    return {"seconds": round(took, 4), "sent_at": round(sent, 3), "tokens": answer["usage"]["completion_tokens"]}


def two_requests() -> list[dict[str, Any]]:
    """The first request to a server that has just become ready, then the same again."""
    return [timed_request(), timed_request()]


def add_request_rows(after: str, pair: list[dict[str, Any]]) -> None:
    first, second = pair
    add_row({"kind": "first-request", "after": after, **first})
    ratio = round(first["seconds"] / second["seconds"], 2) if second["seconds"] > 0 else None
    add_row({"kind": "second-request", "after": after, **second, "first_over_second": ratio})


def request_pair(after: str) -> None:
    """Rows first-request and second-request for the boot that has just become ready."""
    add_request_rows(after, two_requests())


def step_cold(args: argparse.Namespace) -> None:
    import shutil

    for name in ("state", "cache"):
        shutil.rmtree(proof.WORK / name, ignore_errors=True)
    if RUNTIME == "process":  # the launcher's log, every server's lines in it, stamped as written
        SERVER_STAMPS.append(proof.LineWatch(proof.server_log(), [], proof.WORK / "stamped-launcher.log"))
    (proof.WORK / "dankserve.toml").write_text(config_text())
    # What the planner promises (KV tokens, concurrency), read later against what vLLM reports.
    plan = proof.dankserve("plan", "tiny", "--json")
    (proof.WORK / "plan-cold.json").write_text(plan.stdout + plan.stderr)
    argv = [sys.executable, "-m", "dankserve", "--config", str(proof.WORK / "dankserve.toml"), "run"]
    log = (proof.WORK / "daemon.log").open("ab")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def start() -> None:
        daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        (proof.WORK / "launcher-daemon.pid").write_text(str(daemon.pid))
        deadline = time.monotonic() + 60
        while proof.deployment_status() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    timed_boot("cold", start, args)


def kill_server() -> None:
    server = launcher().status().server
    assert server is not None and not server.exited, "no server to kill"
    if RUNTIME == "podman":  # the pid is the container's: its PID namespace is not ours
        done = proof.podman("exec", workload_name("tiny"), "sh", "-c", f"kill -9 -{server.pid}")
        assert done.returncode == 0, f"kill in the container: {done.stderr}"
    else:
        os.killpg(server.pid, signal.SIGKILL)


def step_kill(args: argparse.Namespace) -> None:
    for _ in range(args.repeat):
        time.sleep(2)
        timed_boot("launcher-kill", kill_server, args)


def down_up() -> None:
    proof.control({"command": "down", "deployment": "tiny"})
    proof.control({"command": "up", "deployment": "tiny"})


def step_down_up(args: argparse.Namespace) -> None:
    for _ in range(args.repeat):
        timed_boot("launcher-down-up", down_up, args)


def step_config_change(args: argparse.Namespace) -> None:
    for i in range(args.repeat):

        def reload(seqs: int = 64 + 32 * (i % 2)) -> None:
            (proof.WORK / "dankserve.toml").write_text(config_text(seqs))
            proof.control({"command": "reload"})

        timed_boot("launcher-config-change", reload, args)


def step_multithread_load(args: argparse.Namespace) -> None:
    """Issue 28 item 2: a reload to vLLM's multi-thread weight loader (a new server, it profiles), a kill under
    it (the warm boot to compare with launcher-kill's weights phase), and a reload back to the plan's flags."""

    def reload(extra: list[str] | None) -> None:
        (proof.WORK / "dankserve.toml").write_text(config_text(extra_args=extra))
        proof.control({"command": "reload"})

    timed_boot("launcher-config-change", lambda: reload(MULTITHREAD_LOAD), args, load="multithread")
    time.sleep(2)
    timed_boot("launcher-kill-multithread-load", kill_server, args, load="multithread")
    timed_boot("launcher-config-change", lambda: reload(None), args)


def step_fork_repeat(args: argparse.Namespace) -> None:
    # By down and up, not by kills: more than 5 kills within 900 s make the failure policy give up
    # (as it should; run C's sixth kill did), and a kill's restart waits out a growing backoff.
    for _ in range(args.forks):
        timed_boot("fork-repeat", down_up, args)


def completions(port: int = proof.PORT) -> list[dict[str, Any]]:
    """Greedy completions of PROMPTS: the token ids (the random-weight model's ids mostly decode to
    nothing, so text alone proves little), each token's logprob and the text."""
    out = []
    served = proof.completion(port)  # the served name: a container sees the model elsewhere
    if "model" not in served:
        raise SystemExit(f"greedy: the server did not answer: {served}")
    model = served["model"]
    for prompt in PROMPTS:
        body = proof.greedy_request(model, prompt, 32, logprobs=True)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        if response.status != 200:
            raise SystemExit(f"greedy completion of {prompt!r}: HTTP {response.status}: {answer}")
        choice = answer["choices"][0]
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        out.append({"text": choice["text"], "token_ids": choice.get("token_ids"), "logprobs": logprobs})
    return out


def compare(forked: list[dict[str, Any]], plain: list[dict[str, Any]]) -> dict[str, Any]:
    """The greedy row's verdict: the same token ids and text, and how far apart the logprobs are."""
    deltas = [
        abs(a - b)
        for f, p in zip(forked, plain, strict=True)
        for a, b in zip(f["logprobs"], p["logprobs"], strict=False)
        if a is not None and b is not None
    ]
    return {
        "same_tokens": all(f["token_ids"] is not None for f in forked)
        and [f["token_ids"] for f in forked] == [p["token_ids"] for p in plain],
        "same_text": [f["text"] for f in forked] == [p["text"] for p in plain],
        "tokens_compared": sum(len(f["token_ids"] or []) for f in forked),
        "max_logprob_delta": max(deltas, default=None),
    }


def step_greedy(args: argparse.Namespace) -> None:
    """Greedy completions from the launcher's forked server, then from a plain boot of the same argv
    by hand (proof.manual_boot: `vllm serve`, or `podman run` of the image). Stops the daemon: run
    it after the steps that need one (as `all` does), before manual-best."""
    forked = completions()
    mode = launcher().status().server
    step_stop(args)
    (proof.WORK / "plan.json").write_text(proof.dankserve("plan", "tiny", "--json").stdout)
    cache = proof.WORK / "cache" / "deployments" / "tiny" / "vllm"
    if RUNTIME == "podman":
        proof.podman("rm", "-f", proof.CONTAINER)
    stamps = proof.LineWatch(proof.WORK / "manual-greedy_plain.log", [], proof.WORK / "stamped-greedy_plain.log")
    try:
        boot = proof.manual_boot("greedy_plain", cache, learned_bytes(), None, while_up=completions)
    finally:
        stamps.stop()
    plain = boot["while_up"]
    # The plain boot is a manual best too (the plan's argv by hand, the kept cache, the learned bytes).
    add_row(
        {
            "kind": "manual-best",
            "seconds": boot["start_to_health_seconds"],
            "began_at": boot["started_at"],
            "log": "stamped-greedy_plain.log",
            "note": "the greedy step's plain boot",
        }
    )
    add_row(
        {
            "kind": "greedy",
            "seconds": None,
            "forked_mode": mode.mode if mode else None,
            **compare(forked, plain),
            "forked": forked,
            "plain": plain,
        }
    )


def learned_bytes() -> list[str]:
    """The cold boot's KV bytes as the manual boots pass them (the learned boot by hand)."""
    cold = [r for r in rows() if r["kind"] == "cold" and r.get("runtime") == RUNTIME]
    return ["--kv-cache-memory-bytes", str(cold[-1]["kv_cache_memory_bytes"])]


def step_stop(args: argparse.Namespace) -> None:
    """SIGTERM to the daemon started by `cold`: servers and launcher go (nothing may be left running)."""
    pid_file = proof.WORK / "launcher-daemon.pid"
    if pid_file.exists():
        proof.stop_daemon(int(pid_file.read_text()))
        pid_file.unlink()
    proof.wait_gpu_idle()


def step_manual_best(args: argparse.Namespace) -> None:
    step_stop(args)
    # The manual boots run the plan's argv by hand (proof.manual_boot reads it from plan.json).
    (proof.WORK / "plan.json").write_text(proof.dankserve("plan", "tiny", "--json").stdout)
    cache = proof.WORK / "cache" / "deployments" / "tiny" / "vllm"
    for number in range(1, (args.manual_repeat or args.repeat) + 1):
        if RUNTIME == "podman":
            proof.podman("rm", "-f", proof.CONTAINER)
        label = f"manual_best_{number}"
        # Each boot's own log, stamped as it is written (the boot breakdown reads it).
        stamps = proof.LineWatch(proof.WORK / f"manual-{label}.log", [], proof.WORK / f"stamped-{label}.log")
        try:
            probe = two_requests if args.requests else None
            best = proof.manual_boot(label, cache, learned_bytes(), None, while_up=probe)
        finally:
            stamps.stop()
        add_row(
            {
                "kind": "manual-best",
                "seconds": best["start_to_health_seconds"],
                "began_at": best["started_at"],
                "log": f"stamped-{label}.log",
            }
        )
        if best["while_up"]:
            add_request_rows("manual-best", best["while_up"])


def step_summary(args: argparse.Namespace) -> None:
    by_kind: dict[str, list[float]] = {}
    for row in rows():
        if row.get("seconds") is not None and row.get("runtime") == RUNTIME:
            by_kind.setdefault(row["kind"], []).append(row["seconds"])
    best = statistics.median(by_kind.get("manual-best", [float("nan")]))
    targets = {"launcher-kill": 0.4, "launcher-down-up": 0.4, "launcher-config-change": 0.5}
    for kind, values in sorted(by_kind.items()):
        median = statistics.median(values)
        target = targets.get(kind)
        verdict = "" if target is None else (" ok" if median <= target * best else f" MISSES {target}x")
        print(f"{kind:24} n={len(values):2} median {median:7.2f} s  {median / best:5.2f}x manual best{verdict}")


STEPS = {
    "cold": step_cold,
    "launcher-kill": step_kill,
    "launcher-down-up": step_down_up,
    "launcher-config-change": step_config_change,
    "fork-repeat": step_fork_repeat,
    "multithread-load": step_multithread_load,
    "greedy": step_greedy,
    "manual-best": step_manual_best,
    "stop": step_stop,
    "summary": step_summary,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", help="comma-separated, or all: " + ",".join(STEPS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--manual-repeat", type=int, help="manual-best boots (default --repeat)")
    parser.add_argument("--requests", action="store_true", help="time the first and second request after each boot")
    args = parser.parse_args()
    proof.WORK.mkdir(parents=True, exist_ok=True)
    (proof.WORK / "dankserve.toml").write_text(config_text())
    names = list(STEPS) if args.steps == "all" else args.steps.split(",")
    for name in names:
        began = time.time()
        STEPS[name](args)
        print(f"-- step {name} took {time.time() - began:.1f}s", flush=True)


if __name__ == "__main__":
    main()
