"""The snapshot proof (issue 44, items 1-3): CRIU and the CUDA checkpoint API on the GPU machine, then a
real vLLM server captured, killed and restored, each step timed, greedy ids compared.

Steps (comma-separated, in order; `all` = check,roundtrip,serve):

  check      `criu check` with the CRIU this call carries (gVisor cannot run it: recorded, then stop),
             and whether cuda-bindings has the cuCheckpointProcess* API
  roundtrip  one cuCheckpointProcess* round trip through dankserve's edge (snapshot/gpu.py): a child
             allocates a tensor with torch; this process locks, checkpoints (its GPU bytes go to 0 by
             NVML), restores and unlocks it; the child checks its tensor
  serve      `vllm serve` as a process (the process runtime's way: its own session, log to a file),
             --enable-sleep-mode with the dev routes: capture (sleep level 2, lock + checkpoint,
             `criu dump --leave-running`, restore + unlock, wake, canary), then ROUNDS times: kill -9
             of the tree → `criu restore` → GPU restore + unlock → wake → the first streamed token,
             the canary's greedy ids against the captured ones

`--stand-in` rehearses it all on a machine without a GPU: the stand-in vLLM (containers/fake-vllm,
its engine core holds a fake GPU context) and its GpuCheckpoint stand in for real vLLM and the driver,
and the round trip runs on a stand-in's engine core instead of a torch child. Rows go to
OUT/snapshot.json (`kind`: check, roundtrip, capture, restore-kill; `seconds` and the breakdown), logs
beside it. Needs root (CRIU).

    python3 bench/real_vllm/snapshot_proof.py --stand-in --out /tmp/snap all           (here)
    python3 bench/real_vllm/snapshot_proof.py --model /tmp/qwen3-8b --out $OUT all     (the GPU machine)
"""

from __future__ import annotations

import argparse
import ctypes
import http.client
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dankserve.backend_address import TcpAddress
from dankserve.host.gpu_processes import process_tree
from dankserve.processes import spawn_detached
from dankserve.snapshot import shm
from dankserve.snapshot.capture import capture, outage_seconds
from dankserve.snapshot.criu import CriuFailed, criu_path
from dankserve.snapshot.gpu import GpuCheckpoint, GpuCheckpointError
from dankserve.snapshot.gpu_helper import gpu_checkpoint_for
from dankserve.snapshot.restore import restore
from dankserve.snapshot.steps import Hooks, Outcome, StepFailed, kill_tree
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import canary_ids
from dankserve.supervisor.probes.sleep_mode import sleep_server, wake_server

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
PORT = 8731
SERVED = "proof"
# What CRIU cannot dump in a CUDA/vLLM process (FACTS.md, "Snapshots"): io_uring, compile workers.
SNAPSHOT_ENV = {"UV_USE_IO_URING": "0", "TORCHINDUCTOR_QUIESCE_ASYNC_COMPILE_POOL": "1", "VLLM_SERVER_DEV_MODE": "1"}
TORCH_CHILD = """
import sys, torch
x = torch.arange(1 << 24, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
ok = torch.equal(x.cpu(), torch.arange(1 << 24, dtype=torch.float32))
y = (x * 2).sum().item()
print("verified" if ok else "corrupt", y, flush=True)
"""


class Proof:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out: Path = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict[str, Any]] = []
        self.records = self.out / "stand-in-gpu"  # the stand-in's GPU records (its "NVML")
        # The daemon's own choice: the stand-in's, or the driver in its helper process.
        self.gpu: GpuCheckpoint = gpu_checkpoint_for(self.records if args.stand_in else None)

    def row(self, kind: str, seconds: float | None, **extra: Any) -> None:
        row = {"kind": kind, "model": self.args.model_name, "runtime": "process", "seconds": seconds, **extra}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        (self.out / "snapshot.json").write_text(json.dumps(self.rows, indent=1))

    # -- check ------------------------------------------------------------------------------------
    def check(self) -> bool:
        binary = criu_path()
        if binary is None:
            self.row("check", None, ok=False, reason="no criu binary (carry .snap, see snapshot_proof.sh)")
            return False
        done = subprocess.run([binary, "check"], capture_output=True, text=True, timeout=60, check=False)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
        api = "stand-in" if self.args.stand_in else _bindings_api()
        kernel = os.uname().release
        self.row(
            "check",
            None,
            ok=done.returncode == 0,
            criu=version.stdout.strip(),
            criu_check=(done.stdout + done.stderr).strip()[-500:],
            kernel=kernel,
            checkpoint_api=api,
        )
        return done.returncode == 0

    # -- roundtrip --------------------------------------------------------------------------------
    def roundtrip(self) -> None:
        if self.args.stand_in:
            self._roundtrip_stand_in()
            return
        child = subprocess.Popen(
            [sys.executable, "-c", TORCH_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "ready":
            self.row("roundtrip", None, ok=False, reason="the torch child did not start")
            return
        pid = child.pid
        timings, held = self._gpu_round(pid)
        child.stdin.write("\n")
        child.stdin.flush()
        said = child.stdout.readline().strip()
        child.wait(30)
        self.row("roundtrip", sum(timings.values()), ok=said.startswith("verified"), child=said, **timings, **held)

    def _gpu_round(self, pid: int) -> tuple[dict[str, float], dict[str, Any]]:
        timings: dict[str, float] = {}
        held: dict[str, Any] = {"state_before": self.gpu.state(pid)}
        for action in ("lock", "checkpoint", "restore", "unlock"):
            started = time.monotonic()
            getattr(self.gpu, action)(pid)
            timings[f"gpu_{action}"] = time.monotonic() - started
            if action == "checkpoint":
                held["state_checkpointed"] = self.gpu.state(pid)
                held["gpu_bytes_checkpointed"] = _nvml_bytes(pid)
        held["state_after"] = self.gpu.state(pid)
        held["restore_thread_id"] = self.gpu.restore_thread_id(pid)
        return timings, held

    def _roundtrip_stand_in(self) -> None:
        server = self._start(self.out / "roundtrip.log")
        try:
            before = _greedy(PORT)
            engine = self.gpu.holders(process_tree(self._root(server)))[0]
            timings, held = self._gpu_round(engine)
            self.row("roundtrip", sum(timings.values()), ok=_greedy(PORT) == before, **timings, **held)
        finally:
            kill_tree(self._root(server))
            server.wait()

    # -- serve ------------------------------------------------------------------------------------
    def _start(self, log: Path) -> subprocess.Popen[bytes]:
        env = {**os.environ, **SNAPSHOT_ENV}
        if self.args.stand_in:
            self.records.mkdir(parents=True, exist_ok=True)
            env.update(FAKE_VLLM_NVML_DIR=str(self.records), FAKE_VLLM_BOOT_SECONDS=str(self.args.boot_seconds))
            command = [sys.executable, str(STAND_IN)]
        else:
            command = [self.args.vllm]
        argv = [*command, "serve", self.args.model, "--served-model-name", SERVED, "--port", str(PORT)]
        argv += ["--enable-sleep-mode", *self.args.extra]
        # As the process runtime starts it: its own session and process group, its host pids.
        proc = spawn_detached(argv, log, env=env)
        _wait_health(PORT, proc, self.args.boot_timeout)
        return proc

    @staticmethod
    def _root(server: subprocess.Popen[bytes]) -> int:
        """The tree's root: the server itself (docs/snapshots.md, "Host pids")."""
        return server.pid

    def hooks(self) -> Hooks:
        address = TcpAddress("127.0.0.1", PORT)

        def sleep() -> None:
            answer = sleep_server(address, None, self.args.level)
            if not isinstance(answer, m.FellAsleep):
                raise StepFailed(str(answer))

        def wake() -> None:
            answer = wake_server(address, None, self.args.level)
            if not isinstance(answer, m.WokeUp):
                raise StepFailed(str(answer))

        def canary() -> tuple[int, ...]:
            ids = canary_ids(address, None, SERVED)
            if isinstance(ids, str):
                raise StepFailed(ids)
            return ids

        return Hooks(sleep=sleep, wake=wake, canary=canary)

    def serve(self) -> None:
        log = self.out / "server.log"
        started = time.monotonic()
        server = self._start(log)
        self.row("cold", time.monotonic() - started)
        images = self.out / "images"
        shutil.rmtree(images, ignore_errors=True)
        images.mkdir()
        root = self._root(server)
        tree = process_tree(root)
        deleted, kept = shm.deleted_inodes(tree), self.out / "shm"
        names: list[str] = []
        plain = self.hooks()

        def sleep() -> None:  # asleep and idle: the segments as the dump finds the memory (as the lifecycle)
            plain.sleep()
            names[:] = shm.save(shm.segments(tree), kept)

        def after_dump(_ids: tuple[int, ...], _holders: tuple[int, ...]) -> None:  # the link-remaps kept
            names.extend(shm.save(shm.link_remaps(deleted), kept))
            put.update(shm.put_back(names, kept))

        put: dict[str, int] = {}
        hooks = Hooks(sleep=sleep, wake=plain.wake, canary=plain.canary)
        captured = capture(
            root, images, self.gpu, hooks, after_dump=after_dump, appended=(log,), criu_options=self.args.criu_option
        )
        shm.clear_remaps(put)
        image_bytes = sum(f.stat().st_size for f in images.rglob("*") if f.is_file())
        self._outcome_row("capture", captured, outage_seconds=outage_seconds(captured), image_bytes=image_bytes)
        if not captured.ok or captured.pid is None:
            kill_tree(root)
            return
        root = captured.pid  # the dump ended the tree; the one restored from the image serves
        server.wait()
        for _ in range(self.args.rounds):
            event = time.monotonic()
            kill_tree(root)
            killed = time.monotonic() - event
            put = shm.put_back(names, kept)
            restored = restore(
                images,
                self.gpu,
                self.hooks(),
                holders=captured.holders,
                expected_ids=captured.canary_ids,
                appended=(log,),
                criu_options=self.args.criu_option,
            )
            shm.clear_remaps(put)
            first_token = _first_token_seconds(PORT) if restored.ok else None
            seconds = time.monotonic() - event if restored.ok and first_token is not None else None
            self._outcome_row(
                "restore-kill",
                restored,
                seconds=seconds,
                first_token_request_seconds=first_token,
                kill_seconds=killed,
                same_ids=restored.canary_ids == captured.canary_ids,
            )
            if not restored.ok or restored.pid is None:
                break
            root = restored.pid
        kill_tree(root)

    def _outcome_row(self, kind: str, outcome: Outcome, seconds: float | None = None, **extra: Any) -> None:
        total = seconds if seconds is not None else (sum(outcome.timings.values()) if outcome.ok else None)
        breakdown = {f"{k}_seconds": round(v, 4) for k, v in outcome.timings.items()}
        ids = list(outcome.canary_ids)
        self.row(kind, total, ok=outcome.ok, reason=outcome.reason, greedy_ids=ids, **breakdown, **extra)


def _bindings_api() -> str:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        return f"cuda-bindings missing: {exc}"
    version = getattr(sys.modules.get("cuda.bindings"), "__version__", "?")
    return f"cuda-bindings {version}, cuCheckpointProcessLock: {hasattr(driver, 'cuCheckpointProcessLock')}"


def _nvml_bytes(pid: int) -> int | None:
    """The process's GPU bytes as NVML lists them (None: no NVML, as on the stand-in)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        total = 0
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid:
                    total += int(process.usedGpuMemory or 0)
        return total
    except pynvml.NVMLError:
        return None


def _wait_health(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}) before /health answered")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"no /health 200 within {timeout:g} s")


def _post(port: int, body: dict[str, Any]) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
    return connection.getresponse()


def _greedy(port: int) -> list[int]:
    body = {"model": SERVED, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    answer = json.loads(_post(port, {**body, "return_token_ids": True}).read())
    return list(answer["choices"][0].get("token_ids") or [])


def _first_token_seconds(port: int) -> float | None:
    """A streamed completion's first token, timed from the request (the client's view)."""
    started = time.monotonic()
    body = {"model": SERVED, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
    try:
        answer = _post(port, body)
        while line := answer.readline():
            if line.startswith(b"data: ") and b'"text"' in line:
                return time.monotonic() - started
    except OSError:
        return None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="?", default="all")
    parser.add_argument("--stand-in", action="store_true", help="rehearse on the stand-in vLLM (no GPU)")
    parser.add_argument("--model", default="stand-in/model")
    parser.add_argument("--model-name", default=None, help="the row's `model` (default: the model's last part)")
    parser.add_argument("--vllm", default="vllm", help="the vllm executable")
    parser.add_argument("--level", choices=("1", "2"), default="2", help="the sleep level before the checkpoint")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--boot-seconds", type=float, default=20.0, help="the stand-in's boot (FAKE_VLLM_BOOT_SECONDS)")
    parser.add_argument("--boot-timeout", type=float, default=600.0)
    parser.add_argument(
        "--criu-option",
        action="append",
        default=[],
        help="one more CRIU option for dump and restore (repeat; e.g. --criu-option=--ghost-limit=64M)",
    )
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/snapshot-proof")))
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `vllm serve` flags")
    args = parser.parse_args()
    args.extra = [a for a in args.extra if a != "--"]
    args.model_name = args.model_name or Path(args.model).name
    steps = ["check", "roundtrip", "serve"] if args.steps == "all" else args.steps.split(",")
    # Orphans of the killed and restored trees come here and are reaped (their pids free for the next
    # restore), as the daemon reaps its servers'.
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    proof = Proof(args)
    actions: dict[str, Callable[[], object]] = {
        "check": proof.check,
        "roundtrip": proof.roundtrip,
        "serve": proof.serve,
    }
    for step in steps:
        try:
            if actions[step]() is False:
                print(f"{step}: cannot go on here", flush=True)
                return 1
        except (GpuCheckpointError, CriuFailed) as exc:
            proof.row(step, None, ok=False, reason=exc.message)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
