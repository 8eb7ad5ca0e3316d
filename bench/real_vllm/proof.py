"""The proof on real vLLM: dankserve's warm restarts against a cold boot and the manual best.

Runs on the GPU machine with real vLLM (bench/real_vllm/install-on-gpu.sh) and dankserve's
dependencies on PYTHONPATH, in steps that can be split over calls (state lives in WORK).
PROOF_RUNTIME=process (default) runs `vllm serve` as a process; PROOF_RUNTIME=podman runs the
image PROOF_IMAGE (bench/real_vllm/build_image.sh) through the Podman API socket with the GPU
passed by CDI, and the manual boots with `podman run` of the same image and flags.

  dankserve_cold  the daemon (process runtime), fresh caches: first boot, KV bytes learned
  warm_kill       the vLLM process group killed with -9: restart with cache + learned bytes
  down_up         `down` then `up` over the control socket: the same warm path
  manual_best     by hand, with the compile cache and the learned bytes
  manual_cold     by hand, fresh caches, the flags `dankserve plan` gives

Each boot is timed from the server process's start to /health 200 (vLLM's own process), and for
the daemon also from its boot start to its `ready` event. READY latency: the moment the
`Application startup complete.` line appears in the server's log (polled every 2 ms) against
the READY=1 datagram on NOTIFY_SOCKET. Results: WORK/results.json and OUT/*.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORK = Path(os.environ.get("PROOF_WORK", "/tmp/proof"))
RUNTIME = os.environ.get("PROOF_RUNTIME", "process")
IMAGE = os.environ.get("PROOF_IMAGE", "localhost/vllm-openai:v0.26.0")
# With Podman the model lives in the HF cache dir (mounted at /root/.cache/huggingface).
MODEL = os.environ.get("PROOF_MODEL", "/tmp/tinyllama" if RUNTIME == "process" else str(WORK / "hf" / "tinyllama"))
CONTAINER = "dankserve-tiny"
KINDS = {
    "dankserve_cold": "cold",
    "warm_kill": "warm-kill",
    "down_up": "warm-down-up",
    "manual_cold": "manual-cold",
    "manual_best": "manual-best",
}
# The device machine's rule: NVLink multicast stays off in every program started there.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# A dry run on a machine without a GPU: the stand-in as the `vllm` executable.
EXECUTABLE = os.environ.get("PROOF_VLLM_EXECUTABLE", sys.executable)
PORT = 8000
STARTUP_LINE = "Application startup complete."


def globals_text(work: Path) -> str:
    """The top of a GPU run's dankserve.toml: its own state and caches under `work`, vLLM 0.26.0's figures."""
    return f"""
state_dir = "{work}/state"
cache_dir = "{work}/cache"
hf_cache_dir = "{work}/hf"
vllm_version = "0.26.0"
boot_timeout_seconds = 900
stop_timeout_seconds = 60
health_interval_seconds = 1
log_format = "json"
"""


def deployment_text(name: str, lines: list[str], port: int, extra_env_var: str) -> str:
    """A GPU run's `[deployments.NAME]`: where it runs (`lines`), on `port`, with the settings vLLM 0.26.0 on the
    H100/H200 needs, and the env (plus the JSON object in `$extra_env_var`: a rehearsal's stand-in knobs)."""
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", **SAFE_ENV}
    env.update(json.loads(os.environ.get(extra_env_var, "{}")))
    env_text = ", ".join(f"{k} = {json.dumps(str(v))}" for k, v in env.items())
    settings = [f"port = {port}", 'attention_backend = "TRITON_ATTN"', "max_model_len = 4096", 'kv_offload = "off"']
    body = "\n".join([*lines, *settings, f"env = {{ {env_text} }}"])
    return f"\n[deployments.{name}]\n{body}\n"


def stop_daemon(pid: int, timeout: float = 120, poll: float = 0.2) -> None:
    """SIGTERM to a daemon, as systemd stops it (its servers go too), and its end waited for (bounded)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(poll)


def config_text(python: str) -> str:
    if RUNTIME == "podman":
        lines = [f'model = "/root/.cache/huggingface/{Path(MODEL).name}"', f'image = "{IMAGE}"', 'pull = "never"']
        lines.append('runtime = "podman"')
    else:
        lines = [f'model = "{MODEL}"', 'runtime = "process"', f'executable = "{python}"']
    lines.append('kv_cache_dtype = "auto"')
    return globals_text(WORK) + deployment_text("tiny", lines, PORT, "PROOF_EXTRA_ENV")


def results() -> dict[str, Any]:
    path = WORK / "results.json"
    loaded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return loaded


def record(key: str, value: Any, out: Path | None, seconds: float | None = None) -> None:
    data = results()
    data.setdefault(key, []).append(value)  # steps may repeat: keep every run
    (WORK / "results.json").write_text(json.dumps(data, indent=2))
    if seconds is not None:
        # One object per boot (docs/hardware/*/results.json): kind, runtime, seconds, details.
        boots_path = WORK / "boots.json"
        boots = json.loads(boots_path.read_text()) if boots_path.exists() else []
        boots.append({"kind": KINDS.get(key, key), "runtime": RUNTIME, "seconds": seconds, **value})
        boots_path.write_text(json.dumps(boots, indent=2))
        if out is not None:
            shutil.copy(boots_path, out / "boots.json")
    if out is not None:
        shutil.copy(WORK / "results.json", out / "results.json")
    print(f"== {key}: {json.dumps(value)}", flush=True)


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def greedy_request(model: str, prompt: str, max_tokens: int, *, logprobs: bool = False) -> dict[str, Any]:
    """A greedy /v1/completions body that returns the token ids: `ignore_eos`, since the random-weight
    model's ids mostly decode to nothing and it may stop at once; with `logprobs`, each token's."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    return {**body, "logprobs": 1} if logprobs else body


def completion(port: int = PORT) -> dict[str, Any]:
    """A real completion through the published port: the model's id and the tokens it returned."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        reply = json.loads(conn.getresponse().read())
        tokens = reply["usage"]["completion_tokens"]
        return {"model": model, "completion_tokens": tokens, "text": reply["choices"][0]["text"]}
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
        return {"error": repr(exc)}
    finally:
        conn.close()


def healthy(port: int = PORT) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class LineWatch:
    """Polls a log file and records when each watched text first appears (time.time()); with `stamped`,
    also copies every line there as `EPOCH<TAB>line` (vLLM's own stamps are whole seconds)."""

    def __init__(self, path: Path, texts: list[str], stamped: Path | None = None) -> None:
        self.path, self.texts, self.seen = path, texts, {}  # type: ignore[var-annotated]
        self._stamped = stamped.open("a", encoding="utf-8") if stamped is not None else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        offset, pending = 0, b""
        while not self._stop.is_set():
            try:
                with self.path.open("rb") as handle:
                    handle.seek(offset)
                    chunk = handle.read()
            except OSError:
                chunk = b""
            if chunk:
                now = time.time()
                offset += len(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    text = raw.decode("utf-8", "replace")
                    if self._stamped is not None:
                        self._stamped.write(f"{now:.3f}\t{text}\n")
                        self._stamped.flush()
                    for wanted in self.texts:
                        if wanted in text and wanted not in self.seen:
                            self.seen[wanted] = now
            time.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)


class Notify:
    """A real NOTIFY_SOCKET: records each datagram with its arrival time."""

    def __init__(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.time(), data.decode()))

    def first(self, assignment: str) -> float | None:
        return next((at for at, text in self.messages if assignment in text.split("\n")), None)


def dankserve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def control(message: dict[str, Any], timeout: float = 900) -> dict[str, Any] | None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from dankserve import control as ctl

    return ctl.request(ctl.socket_path(WORK / "state"), message, timeout=timeout)


def deployment_status() -> dict[str, Any] | None:
    reply = control({"command": "status"}, timeout=10)
    if not reply or not reply.get("ok"):
        return None
    return next((d for d in reply["status"]["deployments"] if d["name"] == "tiny"), None)


def wait_status(predicate: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            last = deployment_status()
        if last is not None and predicate(last):
            return last
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting; last status {last}")


def daemon_events() -> list[dict[str, Any]]:
    out = []
    path = WORK / "daemon.log"
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            item = json.loads(line)
            if isinstance(item, dict):
                out.append(item)
    return out


def iso_to_epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gpu_used_bytes() -> int | None:
    with contextlib.suppress(Exception):
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
        finally:
            pynvml.nvmlShutdown()
    return None


def wait_gpu_idle(timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        used = gpu_used_bytes()
        if used is None or used < 2 * 2**30:
            return
        time.sleep(0.5)


def server_log() -> Path:
    if RUNTIME == "podman":
        path = podman("inspect", "--format", "{{.HostConfig.LogConfig.Path}}", CONTAINER).stdout.strip()
        return Path(path) if path else WORK / "missing.log"
    return WORK / "state" / "processes" / "tiny.log"


def daemon_boot(label: str, action: Any, out: Path | None, notify: Notify | None = None) -> None:
    """Run `action`, then wait for the daemon's next ready boot; record its timings."""
    before = {e.get("timestamp") for e in daemon_events() if e.get("event") == "ready"}
    boots_before = (deployment_status() or {}).get("boots", 0)
    watch: LineWatch | None = None
    acted_at = time.time()
    action()
    # the new server's log replaces the old one once started
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = deployment_status() or {}
        if status.get("boots", 0) > boots_before:
            break
        time.sleep(0.05)
    log = server_log()
    watch = LineWatch(log, [STARTUP_LINE])
    status = wait_status(lambda d: d["state"] == "ready" and d["boots"] > boots_before, 900)
    time.sleep(0.5)
    watch.stop()
    ready = [e for e in daemon_events() if e.get("event") == "ready" and e.get("timestamp") not in before][-1]
    started = [e for e in daemon_events() if e.get("event") == "started"][-1]
    ready_at = iso_to_epoch(ready["timestamp"])
    line_at = watch.seen.get(STARTUP_LINE)
    started_at = iso_to_epoch(started["timestamp"])
    result = {
        "action_to_started_seconds": round(started_at - acted_at, 3),
        "daemon_boot_seconds": ready["boot_seconds"],
        "server_start_to_ready_seconds": round(ready_at - iso_to_epoch(started["timestamp"]), 2),
        "ready_after_startup_line_ms": None if line_at is None else round((ready_at - line_at) * 1000, 1),
        "kv_cache_learned_used": status["kv_cache_learned_used"],
        "kv_cache_memory_bytes": status["kv_cache_memory_bytes"],
        "compile_cache_hit": status["compile_cache_hit"],
        "boots": status["boots"],
        "completion": completion(),
    }
    if notify is not None and line_at is not None:
        ready_notify = notify.first("READY=1")
        result["notify_ready_after_startup_line_ms"] = (
            None if ready_notify is None else round((ready_notify - line_at) * 1000, 1)
        )
    if out is not None:
        shutil.copy(log, out / f"boot-{label}.log")
    record(label, result, out, seconds=result["server_start_to_ready_seconds"])


def step_dankserve_cold(out: Path | None) -> None:
    shutil.rmtree(WORK / "state", ignore_errors=True)
    shutil.rmtree(WORK / "cache", ignore_errors=True)
    plan = dankserve("plan", "tiny", "--json")
    (WORK / "plan.json").write_text(plan.stdout)
    if out is not None:
        (out / "plan.json").write_text(plan.stdout + plan.stderr)
    if plan.returncode != 0:
        raise SystemExit(f"plan failed: {plan.stderr}")
    if out is not None:
        doctor = dankserve("doctor")
        (out / "doctor.txt").write_text(doctor.stdout + doctor.stderr + f"\nexit {doctor.returncode}\n")
    notify = Notify(WORK / "notify.sock")
    env = {**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), "run"]
    log = (WORK / "daemon.log").open("ab")
    subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def started() -> None:
        deadline = time.monotonic() + 60
        while deployment_status() is None and time.monotonic() < deadline:
            time.sleep(0.05)

    daemon_boot("dankserve_cold", started, out, notify)


def step_warm_kill(out: Path | None) -> None:
    if RUNTIME == "podman":
        daemon_boot("warm_kill", lambda: podman("kill", CONTAINER), out)
        return
    pid = json.loads((WORK / "state" / "processes" / "tiny.json").read_text())["pid"]
    daemon_boot("warm_kill", lambda: os.killpg(pid, signal.SIGKILL), out)


def step_down_up(out: Path | None) -> None:
    reply = control({"command": "down", "deployment": "tiny"})
    down_at = time.monotonic()
    used_after_down = gpu_used_bytes()
    wait_gpu_idle()
    after: dict[str, Any] = {"reply": reply, "gpu_used_bytes": used_after_down, "gpu_used_bytes_idle": gpu_used_bytes()}
    after["seconds_until_idle"] = round(time.monotonic() - down_at, 2)
    record("after_down", after, out)
    daemon_boot("down_up", lambda: control({"command": "up", "deployment": "tiny"}), out)


def cdi_names(indices: list[int]) -> list[str]:
    """The CDI device names of the plan's GPUs: the index, as nvidia-ctk names them and a human
    types it; under a recorded host (DANKSERVE_HARDWARE, a rehearsal's stand-in GPUs) its UUIDs."""
    recorded = os.environ.get("DANKSERVE_HARDWARE")
    if not recorded:
        return [str(i) for i in indices]
    gpus = json.loads(Path(recorded).read_text())["gpus"]
    return [gpus[i]["uuid"] for i in indices]


def manual_argv(
    plan: dict[str, Any], cache_root: Path, extra: list[str], name: str
) -> tuple[list[str], dict[str, str]]:
    """The hand-typed command of a manual boot: `vllm serve`, or `podman run` of the same image and flags."""
    env = {**plan["env"], "VLLM_CACHE_ROOT": str(cache_root)}
    if RUNTIME == "podman":
        env["VLLM_CACHE_ROOT"] = "/root/.cache/vllm"
        argv = ["podman", "run", "-d", "--name", name, "--ipc=host", "-p", f"127.0.0.1:{PORT}:{PORT}"]
        argv += [f"--device=nvidia.com/gpu={name}" for name in cdi_names(plan.get("gpus") or [0])]
        argv += ["-v", f"{WORK / 'hf'}:/root/.cache/huggingface", "-v", f"{cache_root}:/root/.cache/vllm"]
        for key, value in {**env, **SAFE_ENV, "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"}.items():
            argv += ["-e", f"{key}={value}"]
        return [*argv, IMAGE, *plan["argv"], *extra], dict(os.environ)
    env = {**os.environ, **env}
    if sys.executable == EXECUTABLE:
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *plan["argv"], *extra], env
    return [EXECUTABLE, "serve", *plan["argv"], *extra], env


def manual_boot(
    label: str, cache_root: Path, extra: list[str], out: Path | None, while_up: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """Boots the plan's argv by hand, times it to /health, and stops it: `while_up` runs against the
    server before the stop (its answer is the result's "while_up")."""
    plan = json.loads((WORK / "plan.json").read_text())
    plan = plan[0] if isinstance(plan, list) else plan
    cache_root.mkdir(parents=True, exist_ok=True)
    name = f"manual-{label}"
    log_path = WORK / f"manual-{label}.log"
    argv, env = manual_argv(plan, cache_root, extra, name)
    if RUNTIME == "podman":
        podman("rm", "-f", name)
    with log_path.open("wb") as log:
        start = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if RUNTIME == "podman":
        proc.wait(120)
        found = podman("inspect", "--format", "{{.HostConfig.LogConfig.Path}}", name).stdout.strip()
        log_path = Path(found) if found else log_path
    watch = LineWatch(log_path, [STARTUP_LINE])
    while not healthy():
        if RUNTIME == "process":
            exited = proc.poll() is not None
        else:
            exited = podman("inspect", "--format", "{{.State.Running}}", name).stdout.strip() != "true"
        if exited:
            if out is not None and log_path.exists():
                shutil.copy(log_path, out / f"boot-{label}-failed.log")
            raise SystemExit(f"{label}: vLLM exited; see {log_path}")
        time.sleep(0.05)
    took = time.time() - start
    watch.stop()
    probed = while_up() if while_up is not None else None  # first: it may time the first request
    done = completion()
    if out is not None:
        shutil.copy(log_path, out / f"boot-{label}.log")
    if RUNTIME == "podman":
        podman("rm", "-f", "-t", "30", name, timeout=90)
    else:
        os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    wait_gpu_idle()
    serve_at = argv.index(IMAGE) + 1 if RUNTIME == "podman" else argv.index("serve") + 1
    result = {
        "start_to_health_seconds": round(took, 2),
        "started_at": round(start, 3),
        "argv": argv[serve_at:],
        "completion": done,
    }
    record(label, result, out, seconds=round(took, 2))
    return {**result, "while_up": probed}


def step_manual_best(out: Path | None) -> None:
    if deployment_status() is not None:  # the daemon still runs: stop it first
        control({"command": "down", "deployment": "tiny"})
        subprocess.run(["pkill", "-TERM", "-f", "dankserve --config"], check=False)
        time.sleep(3)
    if RUNTIME == "podman":
        podman("rm", "-f", CONTAINER)
    wait_gpu_idle()
    learned = results()["dankserve_cold"][-1]["kv_cache_memory_bytes"]
    manual_boot(
        "manual_best", WORK / "cache" / "deployments" / "tiny" / "vllm", ["--kv-cache-memory-bytes", str(learned)], out
    )


def step_manual_cold(out: Path | None) -> None:
    shutil.rmtree(WORK / "manual-cache", ignore_errors=True)
    manual_boot("manual_cold", WORK / "manual-cache", [], out)


STEPS = {
    "dankserve_cold": step_dankserve_cold,
    "warm_kill": step_warm_kill,
    "down_up": step_down_up,
    "manual_best": step_manual_best,
    "manual_cold": step_manual_cold,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", help="comma-separated: " + ",".join(STEPS))
    args = parser.parse_args()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / "dankserve.toml").write_text(config_text(EXECUTABLE))
    for name in args.steps.split(","):
        t0 = time.time()
        STEPS[name](out)
        print(f"-- step {name} took {time.time() - t0:.1f}s", flush=True)
    if out is not None and (WORK / "daemon.log").exists():
        shutil.copy(WORK / "daemon.log", out / "daemon.log")


if __name__ == "__main__":
    main()
