"""Issue 30 on the H200: `dankserve upgrade` between two builds of the vLLM image, each step and the outage timed.

Prepared without a GPU; run it on the GPU machine with the Podman runtime, after on_gpu.sh's `podman` and
`vllm1` steps and `vllm2early` with its `image` JOB (build_image.sh vllm: localhost/vllm-openai:v0.26.0):

    python3 bench/real_vllm/upgrade.py --out /tmp/results [--rooms sleep,stop] [--clients 1] [--queue-timeout 120]

as a JOB of on_gpu.sh (device calls `on_gpu.sh podman`, `on_gpu.sh vllm1`, then this one; `on_gpu.sh jobs`
follows it in later calls, and its $OUT gets what lands in /tmp/results):

    on_gpu.sh vllm2early "bash bench/real_vllm/on_gpu.sh image" \
        "python3 bench/real_vllm/upgrade.py --out /tmp/results --rooms sleep,stop"

The second build is the first with one label more (`FROM IMAGE` + `LABEL dankserve.bench=upgrade-b`,
`podman build`, tagged IMAGE-upgrade-b): the same vLLM, so the same version, flags and compile cache, but
another digest (its learned KV bytes are its own). For each room mode (how the old server makes room:
`sleep`, a swap group of one at sleep_level 1; `stop`, no swap group), with a fresh state directory:

  1. the daemon (`python -m dankserve --config WORK/dankserve.toml run`, JSON log WORK/daemon-ROOM.log),
     deployment `tiny` on IMAGE behind the gateway (127.0.0.1:9000); until it is ready (the cold boot)
  2. CLIENTS threads send short greedy completions through the gateway back to back, every outcome kept
  3. `dankserve upgrade tiny --image B`; each step from the daemon's `upgrade_step` events (status --json,
     polled every 0.1 s, as the fallback), then the switch's own boot (the worker boots B), the verdict
  4. when it switched: `dankserve rollback tiny`, until ready on IMAGE again
  5. SIGTERM to the daemon: none of its containers may be left

Rows, one JSON object each with `kind`, `room` and `seconds`, in OUT/upgrade.json (and a table printed):
  image-build          `podman build` of B
  cold-boot            the daemon's start to ready on IMAGE
  upgrade-step         one step (`step`: pulling ... switching or rolling_back), from its event to the next
  upgrade-switch-boot  switched -> ready on B (the deployment's own worker boots it, warm)
  upgrade-gate         making_room -> ready again: how long the daemon held the deployment's requests
  upgrade-command      the `dankserve upgrade` command's wall time, exit code and output
  upgrade-verdict      switched, rolled_back or refused; why; the checks (KV and decode change, greedy ids)
  upgrade-outage       the longest gap with no 200 at the clients around the upgrade; every outcome counted
  rollback-boot        `dankserve rollback` sent -> ready on IMAGE
  rollback-outage      as upgrade-outage, around the rollback
  leftovers            the daemon's containers left after it stopped (seconds: none)
Every request must end in 200, or 503 with Retry-After: anything else (another status, a dropped connection,
a 503 without Retry-After) is listed in its outage row (`odd`) and makes the exit status 1, as does a leftover
container. OUT also gets upgrade-requests.json (every request), upgrade-timeline.json (the daemon's upgrade,
phase and swap events, the polled status changes) and the daemon's logs.

Environment: UPGRADE_WORK (default /tmp/upgrade), UPGRADE_IMAGE (else PROOF_IMAGE, else
localhost/vllm-openai:v0.26.0), UPGRADE_MODEL (else PROOF_MODEL, else /tmp/tinyllama, else the copy on_gpu.sh
moved to /tmp/proof/hf/tinyllama; hard-linked into WORK/hf, which the container mounts), UPGRADE_EXTRA_ENV
(JSON: more deployment environment).

--stand-in: the rehearsal without a GPU, through the same code paths on real rootful Podman:
`bench/real_vllm/rehearse.py upgrade` sets up the stand-in GPUs, the recorded host and the Podman service,
then runs this with --stand-in: the stand-in image (localhost/fake-vllm:latest, `make fake-vllm-image`) as
IMAGE, its time knobs in the deployment's env, a model directory holding config.json only.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_vllm.swap import daemon_head
from dankserve import control
from dankserve.runtime.base import workload_name
from dankserve.supervisor.upgrade.edge import trial_name

WORK = Path(os.environ.get("UPGRADE_WORK", "/tmp/upgrade"))
NAME = "tiny"
SERVED = "tiny"
PORT = 8000
GATEWAY_PORT = 9000
LABEL = "dankserve.bench=upgrade-b"
DEFAULT_IMAGE = "localhost/vllm-openai:v0.26.0"
# The device machine's rule: NVLink multicast stays off in every program started there.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
ROOMS = ("sleep", "stop")
BOOT_SECONDS = 900.0
TERMINAL = ("switched", "rolled_back", "refused")


@dataclass(frozen=True)
class Bench:
    """What one run is set up with."""

    image: str
    image_b: str
    model: Path
    """The model's directory under WORK/hf (the container sees it under /root/.cache/huggingface)."""
    extra_env: dict[str, str]
    clients: int
    queue_timeout: float
    out: Path


# -- the daemon ----------------------------------------------------------------------------------------------


def config_text(bench: Bench, room: str) -> str:
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", **SAFE_ENV, **bench.extra_env}
    env_text = ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items())
    lines = [
        *daemon_head(WORK, GATEWAY_PORT, bench.queue_timeout, "stop_timeout_seconds = 60"),
        "",
        f"[deployments.{NAME}]",
        f'model = "/root/.cache/huggingface/{bench.model.name}"',
        f'served_model_name = "{SERVED}"',
        f'image = "{bench.image}"',
        'pull = "never"',
        'runtime = "podman"',
        f"port = {PORT}",
        'attention_backend = "TRITON_ATTN"',
        "max_model_len = 4096",
        'kv_cache_dtype = "auto"',
        'kv_offload = "off"',
        f"env = {{ {env_text} }}",
    ]
    if room == "sleep":  # a swap group of one: the upgrade puts the old server to sleep at level 1
        lines += ['swap_group = "upgrade"', 'sleep_level = "1"']
    return "\n".join(lines) + "\n"


def dankserve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def status() -> dict[str, Any] | None:
    """The deployment's `status --json` document, over the control socket (None: no daemon answers)."""
    with contextlib.suppress(OSError, ValueError):
        reply = control.request(control.socket_path(WORK / "state"), {"command": "status"}, timeout=10)
        if reply and reply.get("ok"):
            deployments = reply["status"]["deployments"]
            return next((d for d in deployments if d.get("name") == NAME), None)
    return None


def wait_status(predicate: Callable[[dict[str, Any]], bool], timeout: float, what: str, daemon: Daemon) -> float:
    """Poll until `predicate` holds for the deployment's status; the time it was seen."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise SystemExit(f"the daemon exited ({daemon.process.returncode}) waiting for {what}: see {daemon.log}")
        last = status()
        if last is not None and predicate(last):
            return time.time()
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}; last status: {json.dumps(last)[:2000]}")


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(cls, room: str) -> Daemon:
        log = WORK / f"daemon-{room}.log"
        argv = [sys.executable, "-m", "dankserve", "--config", str(WORK / "dankserve.toml"), "run"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with log.open("ab") as sink:
            process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return cls(process, log)

    def stop(self) -> None:
        """SIGTERM, as systemd stops it: the daemon stops its servers and exits."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(240)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)

    def events(self, since: float) -> list[dict[str, Any]]:
        """The JSON log's upgrade, phase and swap events of the deployment from `since` (epoch), each with `at`."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                item = json.loads(line)
                event = str(item.get("event", ""))
                if item.get("deployment") != NAME or not (event.startswith(("upgrade", "swap_")) or event == "phase"):
                    continue
                at = datetime.fromisoformat(str(item["timestamp"]).replace("Z", "+00:00")).timestamp()
                if at >= since:
                    out.append({"at": round(at, 3), **item})
        return out


class StatusWatch:
    """Polls the deployment's status every 0.1 s; keeps each change of state, image, boots and upgrade step."""

    def __init__(self) -> None:
        self.changes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last: tuple[Any, ...] | None = None
        while not self._stop.is_set():
            now = status()
            if now is not None:
                upgrade = now.get("upgrade") or {}
                key = (now.get("state"), now.get("image"), now.get("boots"), upgrade.get("step"))
                if key != last:
                    last = key
                    fields = ("state", "image", "boots", "upgrade_step")
                    self.changes.append({"at": round(time.time(), 3), **dict(zip(fields, key, strict=True))})
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


# -- the clients ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One request through the gateway."""

    client: int
    sent: float
    done: float
    status: int | None
    """None: no HTTP answer (a dropped connection, a timeout)."""
    retry_after: str | None = None
    error: str | None = None

    @property
    def accounted(self) -> bool:
        return self.status == 200 or (self.status == 503 and bool(self.retry_after))

    @property
    def label(self) -> str:
        if self.status == 503:
            return "503+retry-after" if self.retry_after else "503-without-retry-after"
        return str(self.status) if self.status is not None else f"no-answer: {self.error}"


@dataclass
class Traffic:
    """CLIENTS threads sending short greedy completions through the gateway back to back."""

    clients: int
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        for number in range(self.clients):
            thread = threading.Thread(target=self._loop, args=(number,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _loop(self, number: int) -> None:
        url = f"http://127.0.0.1:{GATEWAY_PORT}/v1/completions"
        body = {"model": SERVED, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        with httpx.Client(timeout=BOOT_SECONDS) as client:
            while not self._stop.is_set():
                sent = time.time()
                try:
                    reply = client.post(url, json=body)
                    outcome = Outcome(number, sent, time.time(), reply.status_code, reply.headers.get("retry-after"))
                except httpx.HTTPError as exc:  # a dropped connection is a request not accounted for
                    outcome = Outcome(number, sent, time.time(), None, error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self.outcomes.append(outcome)
                if outcome.status != 200:
                    self._stop.wait(0.2)  # not a busy loop against a 503 (or a refused connection)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(BOOT_SECONDS + 30)

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)

    def wait_success_after(self, moment: float, timeout: float = 120) -> float | None:
        """The first 200 sent after `moment` (the server it reached is the one ready then); None past `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = [o.done for o in self.snapshot() if o.status == 200 and o.sent >= moment]
            if done:
                return min(done)
            time.sleep(0.05)
        return None


def outage(outcomes: list[Outcome], start: float, end: float) -> dict[str, Any]:
    """The longest gap with no 200 answered, between the last 200 before `start` and the first after `end`;
    the outcomes of every request sent in between, and those that are neither 200 nor 503 + Retry-After."""
    ok = sorted(o.done for o in outcomes if o.status == 200)
    before = [t for t in ok if t <= start]
    after = [t for t in ok if t > end]
    points = [before[-1] if before else start, *[t for t in ok if start < t <= end]]
    if after:
        points.append(after[0])
    gaps = [(b - a, a, b) for a, b in itertools.pairwise(points)]
    longest = max(gaps, default=(0.0, start, start))
    window = [o for o in outcomes if start <= o.sent <= end or start <= o.done <= end]
    odd = [asdict(o) for o in window if not o.accounted]
    return {
        "seconds": round(longest[0], 3),
        "gap_from": round(longest[1], 3),
        "gap_to": round(longest[2], 3),
        "requests": len(window),
        "outcomes": dict(Counter(o.label for o in window)),
        "accounted": not odd,
        "odd": odd,
    }


# -- the steps -----------------------------------------------------------------------------------------------


def podman(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)


def build_image_b(image: str, image_b: str) -> float:
    """`FROM image` + one label, tagged `image_b`: seconds of the build."""
    if podman("image", "exists", image).returncode != 0:
        raise SystemExit(f"no image {image}: build it first (on_gpu.sh image, or `make fake-vllm-image`)")
    with tempfile.TemporaryDirectory(prefix="upgrade-b-") as context:
        (Path(context) / "Containerfile").write_text(f"FROM {image}\nLABEL {LABEL}\n")
        began = time.time()
        built = podman("build", "--quiet", "--pull=never", "--network=none", "--tag", image_b, context)
        seconds = time.time() - began
    if built.returncode != 0:
        raise SystemExit(f"podman build of {image_b} failed: {built.stderr.strip()[-2000:]}")
    return seconds


def digest(image: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()[:19]


def step_rows(room: str, steps: list[tuple[float, str]], source: str) -> list[dict[str, Any]]:
    """One row per upgrade step, from when it began to when the next one did (the terminal step gets none)."""
    rows = []
    for (at, step), (until, _) in itertools.pairwise(steps):
        rows.append(
            {
                "kind": "upgrade-step",
                "room": room,
                "step": step,
                "seconds": round(until - at, 3),
                "began_at": round(at, 3),
                "ended_at": round(until, 3),
                "source": source,
            }
        )
    return rows


def first_ready(events: list[dict[str, Any]], after: float) -> float | None:
    """When the worker's phase next became ready after `after` (its JSON log)."""
    ready = (e["at"] for e in events if e["event"] == "phase" and e.get("phase") == "ready" and e["at"] > after)
    return next(ready, None)


def run_upgrade(bench: Bench, room: str, daemon: Daemon, traffic: Traffic, watch: StatusWatch) -> list[dict[str, Any]]:
    """`dankserve upgrade` to B under traffic: its steps, the switch's boot, the verdict and the outage."""
    before = status() or {}
    sent = time.time()
    done = dankserve("upgrade", NAME, "--image", bench.image_b, "--timeout", "1800", timeout=1900)
    returned = time.time()
    record = (status() or {}).get("upgrade") or {}
    step = record.get("step")
    rows: list[dict[str, Any]] = [
        {
            "kind": "upgrade-command",
            "room": room,
            "seconds": round(returned - sent, 3),
            "exit": done.returncode,
            "stdout": done.stdout.strip().splitlines(),
            "stderr": done.stderr.strip()[-2000:],
        }
    ]
    if step == "switched":
        ready = wait_status(
            lambda d: d["state"] == "ready" and d["image"] == bench.image_b and d["boots"] > before.get("boots", 0),
            BOOT_SECONDS,
            f"ready on {bench.image_b}",
            daemon,
        )
    elif step == "rolled_back":
        ready = wait_status(lambda d: d["state"] == "ready", BOOT_SECONDS, "ready again on the old image", daemon)
    else:
        ready = time.time()
    traffic.wait_success_after(ready)
    events = daemon.events(sent - 1)
    steps = [(e["at"], str(e["step"])) for e in events if e["event"] == "upgrade_step"]
    source = "log"
    if not steps:  # no JSON log events: the polled status changes
        source = "status"
        seen = [(c["at"], c["upgrade_step"]) for c in watch.changes if c["at"] >= sent and c["upgrade_step"]]
        steps = [s for i, s in enumerate(seen) if i == 0 or s[1] != seen[i - 1][1]]
    rows += step_rows(room, steps, source)
    ended = steps[-1][0] if steps and steps[-1][1] in TERMINAL else returned
    gate = next((at for at, s in steps if s == "making_room"), None)
    # The first ready after the gate closed: the switch's boot of B, or the old server back on a rollback.
    ready_at = (first_ready(events, gate) if gate is not None else None) or ready
    if step == "switched":
        rows.append({"kind": "upgrade-switch-boot", "room": room, "seconds": round(ready_at - ended, 3)})
    if gate is not None:
        rows.append({"kind": "upgrade-gate", "room": room, "seconds": round(ready_at - gate, 3), "from": "making_room"})
    report = record.get("report") or {}
    rows.append(
        {
            "kind": "upgrade-verdict",
            "room": room,
            "seconds": round(ended - sent, 3),
            "verdict": step,
            "reason": record.get("reason"),
            "room_made": record.get("room"),
            "old_version": record.get("old_version"),
            "new_version": record.get("new_version"),
            **{k: report[k] for k in ("kv_change_percent", "decode_change_percent", "greedy_ids_equal") if k in report},
            "report": report,
        }
    )
    rows.append({"kind": "upgrade-outage", "room": room, **outage(traffic.snapshot(), sent, ready_at)})
    return rows


def run_rollback(bench: Bench, room: str, daemon: Daemon, traffic: Traffic) -> list[dict[str, Any]]:
    """`dankserve rollback` to IMAGE under traffic: until ready on it, and the outage."""
    before = status() or {}
    sent = time.time()
    done = dankserve("rollback", NAME, "--timeout", str(BOOT_SECONDS), timeout=BOOT_SECONDS + 60)
    ready = wait_status(
        lambda d: d["state"] == "ready" and d["image"] == bench.image and d["boots"] > before.get("boots", 0),
        BOOT_SECONDS,
        f"ready on {bench.image} again",
        daemon,
    )
    ready = first_ready(daemon.events(sent - 1), sent) or ready
    traffic.wait_success_after(ready)
    after = status() or {}
    return [
        {
            "kind": "rollback-boot",
            "room": room,
            "seconds": round(ready - sent, 3),
            "exit": done.returncode,
            "stdout": done.stdout.strip().splitlines()[-5:],
            "stderr": done.stderr.strip()[-2000:],
            "compile_cache_hit": after.get("compile_cache_hit"),
            "kv_cache_learned_used": after.get("kv_cache_learned_used"),
        },
        {"kind": "rollback-outage", "room": room, **outage(traffic.snapshot(), sent, ready)},
    ]


def containers() -> list[str]:
    """The daemon's containers of the deployment and of its trial, running or not."""
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    return [n for n in names if n in (workload_name(NAME), workload_name(trial_name(NAME)))]


def run_room(bench: Bench, room: str, rows: list[dict[str, Any]]) -> None:
    """One room mode from a fresh state directory: cold boot, upgrade, rollback, stop; its rows onto `rows`
    (those measured before a failure too)."""
    shutil.rmtree(WORK / "state", ignore_errors=True)
    for name in containers():  # a run before this one left it
        podman("rm", "-f", "-t", "0", name)
    (WORK / "dankserve.toml").write_text(config_text(bench, room))
    (WORK / "dankserve.toml").chmod(0o600)
    started = time.time()
    daemon = Daemon.start(room)
    traffic = Traffic(bench.clients)
    watch: StatusWatch | None = None
    try:
        ready = wait_status(lambda d: d["state"] == "ready", BOOT_SECONDS, "the cold boot", daemon)
        rows.append({"kind": "cold-boot", "room": room, "seconds": round(ready - started, 3), "image": bench.image})
        watch = StatusWatch()
        traffic.start()
        if traffic.wait_success_after(ready) is None:
            raise SystemExit("no request through the gateway was answered 200 after the cold boot")
        time.sleep(2)  # the steady state before the upgrade: its requests' rate and latency
        rows += run_upgrade(bench, room, daemon, traffic, watch)
        if next(r for r in rows if r["kind"] == "upgrade-verdict" and r["room"] == room)["verdict"] == "switched":
            rows += run_rollback(bench, room, daemon, traffic)
        else:
            print(f"-- {room}: the upgrade did not switch: no rollback to time", flush=True)
    finally:
        traffic.stop()
        if watch is not None:
            watch.stop()
        daemon.stop()
        left = containers()
        rows.append({"kind": "leftovers", "room": room, "seconds": None, "containers": left})
        timeline = {"events": daemon.events(started - 1), "status": watch.changes if watch else []}
        (bench.out / f"upgrade-timeline-{room}.json").write_text(json.dumps(timeline, indent=1) + "\n")
        requests = [asdict(o) for o in traffic.snapshot()]
        (bench.out / f"upgrade-requests-{room}.json").write_text(json.dumps(requests) + "\n")
        shutil.copy(daemon.log, bench.out / f"upgrade-daemon-{room}.log")


# -- the results ---------------------------------------------------------------------------------------------


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'room':6} {'kind':20} {'what':28} {'seconds':>9}  notes"]
    for row in rows:
        what = row.get("step") or row.get("verdict") or ""
        notes = ""
        if row["kind"].endswith("-outage"):
            notes = f"{row['requests']} requests {row['outcomes']}" + ("" if row["accounted"] else " NOT ACCOUNTED")
        elif row["kind"] == "upgrade-verdict":
            checks = {k: row[k] for k in ("kv_change_percent", "decode_change_percent", "greedy_ids_equal") if k in row}
            notes = f"room {row['room_made']}; {row['reason'] or 'checks passed'}; {checks}"
        elif row["kind"] == "leftovers":
            notes = ", ".join(row["containers"]) or "none"
        elif "exit" in row:
            notes = f"exit {row['exit']}"
        seconds = "-" if row.get("seconds") is None else f"{row['seconds']:.2f}"
        lines.append(f"{row['room']:6} {row['kind']:20} {what:28} {seconds:>9}  {notes}")
    return "\n".join(lines)


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """What makes the run fail: requests not accounted for, containers left behind."""
    out = []
    for row in rows:
        if row["kind"].endswith("-outage") and not row["accounted"]:
            out.append(f"{row['room']} {row['kind']}: {len(row['odd'])} request(s) neither 200 nor 503 + Retry-After")
        if row["kind"] == "leftovers" and row["containers"]:
            out.append(f"{row['room']}: containers left after the daemon stopped: {row['containers']}")
    return out


def model_dir(stand_in: bool) -> Path:
    """The model under WORK/hf (the directory the container mounts): hard links to it, made when it is elsewhere."""
    if stand_in:
        from bench.real_vllm.rehearse import MODEL_CONFIG

        path = WORK / "hf" / "tinyllama"
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
        return path
    named = os.environ.get("UPGRADE_MODEL") or os.environ.get("PROOF_MODEL")
    candidates = [Path(named)] if named else [Path("/tmp/tinyllama"), Path("/tmp/proof/hf/tinyllama")]
    source = next((c for c in candidates if (c / "config.json").exists()), None)
    if source is None:
        raise SystemExit(
            f"no model at {', '.join(map(str, candidates))}: build it (make_tiny_llama.py) or set UPGRADE_MODEL"
        )
    target = WORK / "hf" / source.name
    if source.resolve() != target.resolve():
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)

        def link(src: str, dst: str) -> None:
            try:
                os.link(src, dst)
            except OSError:  # another file system
                shutil.copy2(src, dst)

        shutil.copytree(source, target, copy_function=link)
    return target


def setup(args: argparse.Namespace) -> Bench:
    extra = json.loads(os.environ.get("UPGRADE_EXTRA_ENV") or "{}")
    image = os.environ.get("UPGRADE_IMAGE") or os.environ.get("PROOF_IMAGE") or DEFAULT_IMAGE
    if args.stand_in:
        from bench.real_vllm import rehearse

        if not os.environ.get("DANKSERVE_HARDWARE"):
            raise SystemExit("--stand-in needs the stand-in GPUs and host: run it as `rehearse.py upgrade`")
        image = os.environ.get("UPGRADE_IMAGE") or rehearse.IMAGE
        extra = {**rehearse.upgrade_knobs(), **extra}
    image_b = f"{image}-upgrade-b" if ":" in image.rsplit("/", 1)[-1] else f"{image}:upgrade-b"
    return Bench(image, image_b, model_dir(args.stand_in), extra, args.clients, args.queue_timeout, args.out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "/tmp/results"))
    parser.add_argument("--rooms", default="sleep", help="comma-separated, of " + ",".join(ROOMS))
    parser.add_argument("--clients", type=int, default=1, help="client threads sending through the gateway")
    parser.add_argument("--queue-timeout", type=float, default=120, help="the gateway's queue_timeout_seconds")
    parser.add_argument("--stand-in", action="store_true", help="the rehearsal (run by rehearse.py upgrade)")
    args = parser.parse_args()
    rooms = args.rooms.split(",")
    if unknown := [r for r in rooms if r not in ROOMS]:
        parser.error(f"unknown room mode(s) {unknown}: use {', '.join(ROOMS)}")
    WORK.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    bench = setup(args)
    rows: list[dict[str, Any]] = []

    def save() -> None:
        (bench.out / "upgrade.json").write_text(json.dumps(rows, indent=1) + "\n")

    build = build_image_b(bench.image, bench.image_b)
    ids = {"image_a": digest(bench.image), "image_b": digest(bench.image_b)}
    rows.append({"kind": "image-build", "room": "-", "seconds": round(build, 3), "image": bench.image_b, **ids})
    save()
    for room in rooms:
        began = time.time()
        try:
            run_room(bench, room, rows)
        finally:
            save()
        print(f"-- room {room} took {time.time() - began:.1f}s", flush=True)
    print(table(rows), flush=True)
    problems = failures(rows)
    for problem in problems:
        print(f"FAILED: {problem}", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
