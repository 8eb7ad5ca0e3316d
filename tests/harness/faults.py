"""Fault-injection helpers for tests/reliability: counts, container watches, state checks, mounts.

Each reliability test keeps a `FaultTally` per fault it injects (injected, recovered, lost and
a breakdown, e.g. by phase) and writes it as JSON under the results directory
(`DANKSERVE_RELIABILITY_RESULTS`, default build/reliability); scripts/reliability_report.py
renders docs/RELIABILITY.md from those files. Counts come from `cycles()`: the full numbers
under `make reliability`, a smaller set with DANKSERVE_RELIABILITY_QUICK=1 (CI).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dankserve.runtime.base import LABEL_DEPLOYMENT, workload_name
from dankserve.state import STATE_FILE, State, state_from_json
from tests.harness.podman_service import PodmanEnv

REPO = Path(__file__).resolve().parents[2]
RESULTS_ENV = "DANKSERVE_RELIABILITY_RESULTS"
QUICK_ENV = "DANKSERVE_RELIABILITY_QUICK"

# Full counts (`make reliability`) and quick ones (CI, DANKSERVE_RELIABILITY_QUICK=1).
FULL_CYCLES = {
    "container_kill": 50,
    "daemon_kill": 20,
    "podman_outage": 3,
    "state_dir_readonly": 3,
    "state_dir_full": 3,
    "state_file_damage": 3,
    "policy_faults": 3,
    "config_examples": 400,
    "bad_reload": 3,
    "daemon_emfile": 5,
    "state_newer": 4,
}
QUICK_CYCLES = {
    "container_kill": 12,
    "daemon_kill": 5,
    "podman_outage": 1,
    "state_dir_readonly": 1,
    "state_dir_full": 1,
    "state_file_damage": 1,
    "policy_faults": 1,
    "config_examples": 60,
    "bad_reload": 1,
    "daemon_emfile": 1,
    "state_newer": 2,
}


def quick() -> bool:
    return os.environ.get(QUICK_ENV, "") not in ("", "0")


def cycles(kind: str) -> int:
    """How many times to inject a fault of this kind in this run."""
    return (QUICK_CYCLES if quick() else FULL_CYCLES)[kind]


def results_dir() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or REPO / "build" / "reliability")


@dataclass
class FaultTally:
    """The counts of one fault kind: every injection ends recovered or lost."""

    key: str
    """File name and table order key, e.g. `01-container-kill`."""
    fault: str
    """What was injected, in words."""
    expectation: str
    """What counts as recovered."""
    command: str
    """The command that reproduces it."""
    injected: int = 0
    recovered: int = 0
    lost: int = 0
    breakdown: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    started: float | None = None
    """When the first fault was injected."""

    def inject(self, kind: str | None = None) -> None:
        if self.started is None:
            self.started = time.time()
        self.injected += 1
        if kind is not None:
            self.breakdown[kind] += 1

    def recover(self) -> None:
        self.recovered += 1

    def lose(self, why: str) -> None:
        self.lost += 1
        self.notes.append(why)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "fault": self.fault,
            "expectation": self.expectation,
            "command": self.command,
            "injected": self.injected,
            "recovered": self.recovered,
            "lost": self.lost,
            "breakdown": dict(sorted(self.breakdown.items())),
            "notes": self.notes[-10:],
            "seconds": None if self.started is None else round(time.time() - self.started, 1),
            "quick": quick(),
        }

    def write(self) -> Path:
        out = results_dir()
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{self.key}.json"
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    def check(self) -> None:
        """Write the counts, then fail when anything was lost or left unaccounted for."""
        self.write()
        assert self.lost == 0, f"{self.fault}: {self.lost} lost of {self.injected}: {self.notes[-5:]}"
        assert self.recovered == self.injected, f"{self.fault}: {self.recovered} recovered of {self.injected}"


@contextlib.contextmanager
def tally(tally_: FaultTally) -> Iterator[FaultTally]:
    """Yield the tally; write it however the block ends (a crashed test still leaves its counts)."""
    try:
        yield tally_
    finally:
        tally_.write()


def reproduce(test_id: str) -> str:
    """The command line that runs one reliability test."""
    return f".venv/bin/pytest -m reliability {test_id}"


# --- deployment status predicates ---------------------------------------------------------------

BOOT_ORDER = ("pulling", "planning", "starting", "loading", "compiling", "profiling", "capturing", "ready")
BOOTING = ("starting", "loading", "compiling", "profiling", "capturing")

Status = dict[str, Any]


def reached(phase: str, target: str) -> bool:
    """`phase` is `target` or a later boot phase."""
    return phase in BOOT_ORDER and BOOT_ORDER.index(phase) >= BOOT_ORDER.index(target)


def is_ready(status: Status) -> bool:
    return bool(status["state"] == "ready")


def boot_reached(target: str, *, boot: int | None = None, after: int | None = None) -> Callable[[Status], bool]:
    """A status predicate: boot number `boot` (or any boot after `after`) has reached `target`."""

    def holds(status: Status) -> bool:
        if boot is not None and status["boots"] != boot:
            return False
        if after is not None and status["boots"] <= after:
            return False
        return reached(status["phase"], target)

    return holds


def ready_after(boots: int) -> Callable[[Status], bool]:
    """A status predicate: ready, with more than `boots` boots counted."""
    return lambda status: is_ready(status) and status["boots"] > boots


# --- containers ----------------------------------------------------------------------------------


def containers_of(env: PodmanEnv, deployment: str) -> list[dict[str, Any]]:
    """`podman ps -a` of the deployment's containers (by the io.dankserve.deployment label)."""
    done = env.podman("ps", "-a", "--format", "json", "--filter", f"label={LABEL_DEPLOYMENT}={deployment}")
    out: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return out


def gpu_devices_of(container: dict[str, Any]) -> set[str]:
    """The /dev/nvidiaN nodes a running container (a `podman ps` entry) sees, read through /proc/PID/root.

    Podman 4's inspect does not list CDI devices; the container's own /dev does.
    """
    pid = container.get("Pid")
    if not pid:
        return set()
    try:
        names = os.listdir(f"/proc/{pid}/root/dev")
    except OSError:  # it exited meanwhile
        return set()
    return {n for n in names if n.startswith("nvidia") and n[len("nvidia") :].isdigit()}


@dataclass
class ContainerWatch:
    """Samples `podman ps` for some deployments in a thread; records every breach of 'one per deployment'.

    Also records a GPU held by running containers of two deployments at once (never allowed
    when the deployments were given distinct GPUs).
    """

    env: PodmanEnv
    deployments: tuple[str, ...]
    period: float = 0.5
    check_gpus: bool = False
    samples: int = 0
    max_seen: int = 0
    breaches: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> dict[str, list[dict[str, Any]]]:
        """One look at every deployment's containers; breaches recorded."""
        seen = {name: containers_of(self.env, name) for name in self.deployments}
        self.samples += 1
        holders: dict[str, str] = {}
        for name, listed in seen.items():
            self.max_seen = max(self.max_seen, len(listed))
            if len(listed) > 1:
                ids = [str(c.get("Id", ""))[:12] for c in listed]
                self.breaches.append(f"{name}: {len(listed)} containers {ids}")
            if self.check_gpus:
                for container in listed:
                    if str(container.get("State", "")).lower() != "running":
                        continue
                    for gpu in gpu_devices_of(container):
                        other = holders.setdefault(gpu, name)
                        if other != name:
                            self.breaches.append(f"{gpu} held by {other} and {name} at once")
        return seen

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a podman CLI hiccup is no breach
                self.sample()
            self._stop.wait(self.period)

    def __enter__(self) -> ContainerWatch:
        self._thread = threading.Thread(target=self._loop, name="container-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


def remove_deployment_containers(env: PodmanEnv, names: list[str]) -> None:
    """Remove the containers (and secrets) of these deployments, whatever state they are in."""
    for name in names:
        env.podman("rm", "-f", "-t", "0", workload_name(name), check=False)
        for container in containers_of(env, name):
            env.podman("rm", "-f", "-t", "0", str(container["Id"]), check=False)


# --- the state file ------------------------------------------------------------------------------


def read_state(state_dir: Path) -> State:
    """The state file parsed (raises when it is not a valid state)."""
    return state_from_json((state_dir / STATE_FILE).read_text(encoding="utf-8"))


# --- mounts --------------------------------------------------------------------------------------


def run_root(*argv: str) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True)


@contextlib.contextmanager
def descriptors_exhausted(pid: int) -> Iterator[None]:
    """Process `pid` cannot open another file descriptor (EMFILE) for the duration; its limit restored after.

    The soft RLIMIT_NOFILE bounds descriptor numbers, and a new one takes the lowest free number: the
    limit set to that number (again every 10 ms, as descriptors close) leaves the open ones working and
    every new one failing."""
    import psutil

    proc = psutil.Process(pid)
    soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
    done = threading.Event()

    def starve() -> None:  # again and again: a descriptor it closes must not become a free one
        while not done.is_set():
            with contextlib.suppress(OSError, psutil.Error):
                open_fds = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
                lowest_free = next(n for n in range(len(open_fds) + 1) if n not in open_fds)
                proc.rlimit(psutil.RLIMIT_NOFILE, (lowest_free, hard))
            done.wait(0.01)

    starver = threading.Thread(target=starve, daemon=True)
    starver.start()
    try:
        yield
    finally:
        done.set()
        starver.join()
        proc.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))


MOUNT_BUSY = 32
"""mount(8)'s exit status for EBUSY: a bind mount cannot become read-only while a file is open for
writing through it (the kernel counts writers per mount), e.g. the daemon's state save in flight."""
REMOUNT_PATIENCE_SECONDS = 10.0


def remount_bind(path: Path, read_only: bool, patience: float = REMOUNT_PATIENCE_SECONDS) -> int:
    """Remount the bind mount at `path` ro or rw, retrying while a writer holds it busy; the retries needed."""
    argv = ["mount", "-o", f"remount,{'ro' if read_only else 'rw'},bind", str(path)]
    deadline = time.monotonic() + patience
    retries = 0
    while True:
        done = subprocess.run(argv, check=False, capture_output=True, text=True)
        if done.returncode == 0:
            return retries
        if done.returncode != MOUNT_BUSY or time.monotonic() > deadline:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        retries += 1
        time.sleep(0.02)  # a state save (write, fsync, rename) takes milliseconds


@contextlib.contextmanager
def bind_mount(path: Path) -> Iterator[Callable[[bool], None]]:
    """`path` bind-mounted onto itself; yields set_read_only(bool) (remount ro/rw, waiting out a write in
    flight); unmounted after."""
    run_root("mount", "--bind", str(path), str(path))

    def set_read_only(read_only: bool) -> None:
        remount_bind(path, read_only)

    try:
        yield set_read_only
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            set_read_only(False)
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created); unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    run_root("mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(directory: Path) -> Path:
    """Write a file until the file system holding `directory` is full; the filler's path."""
    filler = directory / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (65536, 4096, 1):  # big blocks, then the last page byte by byte
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


@contextlib.contextmanager
def small_snapshot_store(tmp_path: Path, size: str = "8m") -> Iterator[Path]:
    """The daemon's snapshot store (tmp_path/state/snapshots) on a tmpfs of `size`: a disk full while capturing.
    Skips the test where a tmpfs cannot be mounted."""
    import pytest

    store_dir = tmp_path / "state" / "snapshots"
    store_dir.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(store_dir)], check=False
    )
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield store_dir
    finally:
        subprocess.run(["umount", str(store_dir)], check=False)
