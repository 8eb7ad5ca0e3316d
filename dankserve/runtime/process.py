"""The process runtime: `vllm serve` from a pip-installed vLLM, as a child process group.

It fills the same interface as Podman. Each workload is recorded in a JSON file beside its log
(pid, the process's start time, labels), so a restarted daemon, even after kill -9, finds the
server it started: the pid alone could have been reused, the pid plus start time cannot. GPUs
are assigned through CUDA_VISIBLE_DEVICES; stop sends SIGINT to the group, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from dankserve.errors import EnvironmentUnusable, InvalidInput
from dankserve.launcher import protocol
from dankserve.processes import (
    become_subreaper,
    is_same_process,
    reap_group_orphans,
    spawn_detached,
    start_ticks_of,
    start_time_of,
    write_private_file,
)
from dankserve.runtime.base import (
    CONTAINER_HF_HOME,
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_DEPLOYMENT,
    LABEL_LAUNCHER,
    LABEL_MANAGED,
    EndedServer,
    ExitEvent,
    ImageInfo,
    LaunchRequest,
    PullPolicy,
    PullProgress,
    Runtime,
    Workload,
    WorkloadSpec,
    container_fingerprint,
    prepare_socket,
    with_bind_address,
    with_socket,
    workload_name,
)
from dankserve.runtime.line_times_watchers import LineTimeWatchers
from dankserve.runtime.log_archive import LogArchive
from dankserve.runtime.logfile import ChangeWatch, follow_file, poll_briefly, read_line_times, timed_file_lines
from dankserve.secret_files import read_secret

GPU_RELEASE_TIMEOUT = 30.0


@dataclass(frozen=True)
class ProcessRecord:
    """What the runtime remembers of a process it started."""

    deployment: str
    pid: int
    create_time: float
    argv: tuple[str, ...]
    labels: dict[str, str]
    started_at: float
    gpu_uuids: tuple[str, ...] = ()
    start_ticks: int | None = None
    """The exact start (`processes.start_ticks_of`); None in records written before it was kept."""

    @property
    def id(self) -> str:
        return f"process-{self.deployment}-{self.pid}"

    def to_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "pid": self.pid,
            "create_time": self.create_time,
            "argv": list(self.argv),
            "labels": self.labels,
            "started_at": self.started_at,
            "gpu_uuids": list(self.gpu_uuids),
            "start_ticks": self.start_ticks,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(
            deployment=str(data["deployment"]),
            pid=int(data["pid"]),
            create_time=float(data["create_time"]),
            argv=tuple(str(a) for a in data["argv"]),
            labels={str(k): str(v) for k, v in data.get("labels", {}).items()},
            started_at=float(data["started_at"]),
            gpu_uuids=tuple(str(u) for u in data.get("gpu_uuids", [])),
            start_ticks=None if data.get("start_ticks") is None else int(data["start_ticks"]),
        )


START_GATE = (
    "/bin/sh",
    "-c",
    'read -r go || exit 125; [ "$go" = go ] || exit 125; exec "$@" </dev/null',
    "dankserve-start-gate",
)
"""Runs the server only once the daemon has written its record ("go" on the gate pipe, the
gate's stdin). A daemon killed before that closes the pipe: the gate exits instead of starting
a server no record names, which nothing would ever stop. `exec` keeps the pid and its start
time, the record's identity of the server."""


def serve_command(executable: str, argv: tuple[str, ...]) -> list[str]:
    """The command line for `vllm serve ARGV` from a `vllm` executable or a Python with vLLM."""
    parts = shlex.split(executable)
    if not parts:
        raise InvalidInput("the process runtime needs `executable`", fix='set executable = "/path/to/venv/bin/vllm"')
    if Path(parts[0]).name.startswith("python"):
        return [*parts, "-m", "vllm.entrypoints.cli.main", "serve", *argv]
    return [*parts, "serve", *argv]


def python_of(executable: str) -> str:
    """The Python that runs vLLM for `executable`: itself when it is a Python, else the `vllm` script's
    interpreter (its `#!` line), else `python3`."""
    parts = shlex.split(executable)
    if not parts:
        raise InvalidInput("the process runtime needs `executable`", fix='set executable = "/path/to/venv/bin/vllm"')
    if Path(parts[0]).name.startswith("python"):
        return parts[0]
    try:
        with open(parts[0], "rb") as script:
            first = script.readline(512).decode("utf-8", "replace")
    except OSError:
        return "python3"
    if first.startswith("#!"):
        words = first[2:].split()
        if words and Path(words[0]).name == "env" and len(words) > 1:
            return words[1]
        if words:
            return words[0]
    return "python3"


def launcher_command(executable: str, spec: WorkloadSpec) -> list[str]:
    """The launcher run by vLLM's own Python (issue 15) instead of `vllm serve`."""
    assert spec.launcher is not None
    return [python_of(executable), str(spec.launcher.source / "__main__.py"), "--run-dir", str(spec.launcher.run_dir)]


def server_argv(spec: WorkloadSpec) -> tuple[str, ...]:
    """The argv after `vllm serve`: on its socket (its directory made private first), or on host:port."""
    if spec.socket is not None:
        prepare_socket(spec.socket)
        return with_socket(spec.argv, str(spec.socket))
    return with_bind_address(spec.argv, spec.bind_host, spec.port)


def process_env(spec: WorkloadSpec, base: dict[str, str]) -> dict[str, str]:
    """The server's environment: ours, the plan's, the GPUs, the caches and the secrets' files."""
    env = dict(base)
    env.update(spec.env)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in spec.gpus)
    if spec.cache_dir is not None and "VLLM_CACHE_ROOT" not in spec.env:
        # The plan says where (planning.vllm_cache_root); a spec that does not: the dir itself.
        env["VLLM_CACHE_ROOT"] = str(spec.cache_dir)
    for mount in spec.mounts:
        if mount.target == CONTAINER_HF_HOME:
            env["HF_HOME"] = str(mount.source)
    for secret in spec.secrets:
        if secret.env_var == "HF_TOKEN_PATH":
            env["HF_TOKEN_PATH"] = str(secret.source)
        elif secret.env_var == "VLLM_API_KEY":
            env["VLLM_API_KEY"] = read_secret(secret.source, secret.name).decode("utf-8", "replace")
    return env


class ProcessRuntime(Runtime):
    """Runs vLLM servers as process groups, remembered under `directory`."""

    def __init__(
        self,
        directory: Path,
        gpu_release: Callable[[tuple[str, ...], float], None] | None = None,
        archive: LogArchive | None = None,
    ) -> None:
        """`gpu_release(uuids, timeout)` waits after a stop until the GPUs are free (the supervisor hands
        in its NVML reading; None: no wait). `archive`: where a removed server's lines are kept (None:
        only the one before the last start, as `NAME.log.1`)."""
        self.directory = directory
        self._archive = archive
        become_subreaper()  # a server's orphaned workers come here and are reaped (processes.py, "Orphans")
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._oom_kills_at_start: dict[int, int | None] = {}
        self._killed_by_us: set[int] = set()
        self._watchers = LineTimeWatchers()
        self._gpu_release = gpu_release if gpu_release is not None else lambda uuids, timeout: None

    # -- records -------------------------------------------------------------------------------
    def _record_path(self, deployment: str) -> Path:
        return self.directory / f"{deployment}.json"

    def _log_path(self, deployment: str) -> Path:
        return self.directory / f"{deployment}.log"

    def _times_path(self, deployment: str) -> Path:
        """Beside the log: the time of each of its lines (`runtime.line_times`)."""
        return self.directory / f"{deployment}.log.times"

    def _read_record(self, deployment: str) -> ProcessRecord | None:
        try:
            return ProcessRecord.from_json(json.loads(self._record_path(deployment).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _records(self) -> list[ProcessRecord]:
        if not self.directory.is_dir():
            return []
        out = []
        for path in sorted(self.directory.glob("*.json")):
            record = self._read_record(path.stem)
            if record is not None:
                out.append(record)
        return out

    def _alive(self, record: ProcessRecord) -> bool:
        """The recorded process still runs: same pid AND same start time (pids are reused, a restored tree's even
        within a second of its start: the exact start ticks tell those apart)."""
        child = self._children.get(record.pid)
        if child is not None and child.poll() is not None:
            return False
        if record.start_ticks is not None and start_ticks_of(record.pid) != record.start_ticks:
            return False
        return is_same_process(record.pid, record.create_time)

    def _workload(self, record: ProcessRecord) -> Workload:
        alive = self._alive(record)
        child = self._children.get(record.pid)
        code = None if child is None else child.returncode
        return Workload(
            id=record.id,
            name=workload_name(record.deployment),
            deployment=record.deployment,
            state="running" if alive else "exited",
            labels=record.labels,
            image=record.argv[0] if record.argv else "",
            exit_code=None if alive else code,
            pid=record.pid,
            started_at=record.started_at,
        )

    def _by_id(self, workload_id: str) -> ProcessRecord | None:
        for record in self._records():
            if record.id == workload_id:
                return record
        return None

    # -- the Runtime interface -----------------------------------------------------------------
    def ensure_image(
        self, image: str, pull: PullPolicy, progress: Callable[[PullProgress], None] | None = None
    ) -> ImageInfo:
        """No image to pull: `image` is the executable; its identity stands in for a digest.

        The version is left to the caller (the vllm_version setting, or `version_of`), since
        importing real vLLM to ask takes tens of seconds."""
        return ImageInfo(reference=image, digest=executable_digest(image), vllm_version=None)

    def version_of(self, executable: str) -> str | None:
        return vllm_version_of(executable)

    def launch_request(self, spec: WorkloadSpec) -> LaunchRequest:
        """What this runtime's launcher needs to start a server of `spec` (issue 15)."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_SOCKET")}
        return LaunchRequest(server_argv(spec), process_env(spec, base))

    def start(self, spec: WorkloadSpec) -> Workload:
        if not spec.executable:
            raise InvalidInput(
                f'deployment {spec.deployment!r} uses runtime = "process" but sets no executable',
                fix="set executable to the vllm script of a venv with vLLM, or to that venv's python",
            )
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        existing = self.find(spec.deployment)
        if existing is not None and existing.running:
            # Replacing is the supervisor's decision (it stops and removes the old one first).
            raise EnvironmentUnusable(
                f"deployment {spec.deployment!r} already has a running server (pid {existing.pid})",
                fix=f"stop it first (`dankserve down {spec.deployment}`)",
            )
        if existing is not None:
            self.remove(existing.id)  # the record of a server that has exited
        argv = serve_command(spec.executable, server_argv(spec))
        env = process_env(spec, {k: v for k, v in os.environ.items() if not k.startswith("NOTIFY_SOCKET")})
        extra_labels: dict[str, str] = {}
        if spec.launcher is not None:
            argv = launcher_command(spec.executable, spec)
            env[protocol.SPEC_ENV_VAR] = "*"  # a start request carries the server's whole environment
            spec.launcher.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            extra_labels = {LABEL_LAUNCHER: "true", LABEL_CONTAINER_FINGERPRINT: container_fingerprint(spec)}
        log_path, times_path = self._log_path(spec.deployment), self._times_path(spec.deployment)
        if log_path.exists():
            log_path.replace(log_path.with_suffix(".log.1"))
        with contextlib.suppress(FileNotFoundError):
            times_path.replace(log_path.with_suffix(".log.1.times"))
        if shutil.which(argv[0], path=env.get("PATH")) is None:  # the gate would only exit 127
            raise EnvironmentUnusable(
                f"cannot run {argv[0]}: not found or not executable", fix="check the deployment's executable setting"
            )
        gate_read, gate_write = os.pipe()
        try:
            proc = spawn_detached([*START_GATE, *argv], log_path, env=env, stdin=gate_read)
        except OSError as exc:
            os.close(gate_write)
            raise EnvironmentUnusable(
                f"cannot run {argv[0]}: {exc.strerror}", fix="check the deployment's executable setting"
            ) from None
        finally:
            os.close(gate_read)
        create_time, start_ticks = start_time_of(proc.pid), start_ticks_of(proc.pid)
        labels = {
            LABEL_MANAGED: "true",
            LABEL_DEPLOYMENT: spec.deployment,
            **{str(k): str(v) for k, v in spec.labels.items()},
            **extra_labels,
        }
        record = ProcessRecord(
            deployment=spec.deployment,
            pid=proc.pid,
            create_time=create_time,
            start_ticks=start_ticks,
            argv=tuple(argv),
            labels=labels,
            started_at=time.time(),
            gpu_uuids=tuple(g.uuid for g in spec.gpus),
        )
        self._children[proc.pid] = proc
        self._oom_kills_at_start[proc.pid] = oom_kills()
        try:
            write_private_file(self._record_path(spec.deployment), json.dumps(record.to_json()))
            os.write(gate_write, b"go\n")  # recorded: the server may start (and outlive us)
        finally:
            os.close(gate_write)
        self._watchers.start(record.pid, record.create_time, log_path, times_path)
        return self._workload(record)

    def stop(self, workload_id: str, timeout: float) -> None:
        record = self._by_id(workload_id)
        if record is None or not self._alive(record):
            return
        self._signal_group(record, signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._alive(record):
            time.sleep(0.05)
        if self._alive(record):
            self._killed_by_us.add(record.pid)
            self._signal_group(record, signal.SIGKILL)
            while self._alive(record):
                time.sleep(0.05)
        self._reap_group(record)
        if record.gpu_uuids:
            self._gpu_release(record.gpu_uuids, GPU_RELEASE_TIMEOUT)

    def _signal_group(self, record: ProcessRecord, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)

    def _reap_group(self, record: ProcessRecord) -> None:
        """Kill what is left of the group (vLLM's workers) and reap our child."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, signal.SIGKILL)
        child = self._children.get(record.pid)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        reap_group_orphans(record.pid)
        self._watchers.reap(record.pid, 5)

    def remove(self, workload_id: str) -> None:
        record = self._by_id(workload_id)
        if record is None:
            return
        if self._alive(record):
            self.stop(workload_id, 10)
        if self._archive is not None:
            self._archive.keep(record.deployment, record.id, self.timed_logs(workload_id))
        with contextlib.suppress(FileNotFoundError):
            self._record_path(record.deployment).unlink()
        self._children.pop(record.pid, None)

    def logs(self, workload_id: str, follow: bool = False) -> Iterator[str]:
        record = self._by_id(workload_id)
        if record is None:
            return
        path = self._log_path(record.deployment)
        # Sleep until the file grows or the server ends; `_alive` (checked at each end of the
        # file) tells whether the watched pid was still ours.
        watch = ChangeWatch.open(path, record.pid) if follow and path.exists() else None
        try:
            wait = watch.wait if watch is not None else poll_briefly
            for raw in follow_file(path, follow, lambda: self._alive(record), wait):
                yield raw.decode("utf-8", "replace")
        finally:
            if watch is not None:
                watch.close()

    def timed_logs(self, workload_id: str, follow: bool = False) -> Iterator[tuple[datetime | None, str]]:
        """The server's lines, each with the time its watcher wrote for it (to the microsecond, as conmon's);
        None for a line it has no time for (a server started without one: its vLLM prefix then says)."""
        record = self._by_id(workload_id)
        if record is None:
            return
        yield from timed_file_lines(self.logs(workload_id, follow), _line_time_of(self._times_path(record.deployment)))

    def ended_servers(self, deployment: str) -> list[EndedServer]:
        """The deployment's removed servers' lines, oldest first (the archive's)."""
        return self._archive.ended(deployment) if self._archive is not None else []

    def wait(self, workload_id: str, timeout: float | None = None) -> ExitEvent | None:
        record = self._by_id(workload_id)
        if record is None:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._alive(record):
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        child = self._children.get(record.pid)
        code = None
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = child.wait(timeout=1)
        self._watchers.reap(record.pid, 0.5)
        ours = record.pid in self._killed_by_us
        killed = oom_killed(code, ours, self._oom_kills_at_start.get(record.pid))
        return ExitEvent(workload_id, record.deployment, code, oom_killed=killed)

    def find(self, deployment: str) -> Workload | None:
        record = self._read_record(deployment)
        return None if record is None else self._workload(record)

    def list_workloads(self) -> list[Workload]:
        return [self._workload(r) for r in self._records()]

    def inspect(self, workload_id: str) -> Workload | None:
        record = self._by_id(workload_id)
        return None if record is None else self._workload(record)

    def log_path(self, deployment: str) -> Path:
        """The server's log; snapshots (issue 41): a restored server appends to it (`criu restore --inherit-fd`)."""
        return self._log_path(deployment)

    def adopt_restored(self, restored: ProcessRecord) -> Workload:
        """A tree CRIU restored (its root at `restored.pid`, not our child): the deployment's server."""
        record = replace(
            restored,
            create_time=start_time_of(restored.pid),
            start_ticks=start_ticks_of(restored.pid),
            started_at=time.time(),
        )
        before = self._read_record(record.deployment)
        ended = self._children.pop(before.pid, None) if before is not None else None
        if ended is not None:  # the captured server's outer (its tree ended at the dump): reaped
            with contextlib.suppress(subprocess.TimeoutExpired):
                ended.wait(timeout=5)
        write_private_file(self._record_path(record.deployment), json.dumps(record.to_json()))
        name = record.deployment
        self._watchers.start(record.pid, record.create_time, self._log_path(name), self._times_path(name))
        return self._workload(record)


def record_of(runtime: ProcessRuntime, workload_id: str) -> ProcessRecord | None:
    """What the runtime remembers of a workload (a capture keeps it for the restore)."""
    return runtime._by_id(workload_id)


def oom_killed(code: int | None, killed_by_us: bool, before: int | None) -> bool:
    """Killed by the kernel's OOM killer: a SIGKILL we did not send while the kernel counted an OOM kill.

    Only the kernel's word counts (its oom_kill counter rose since the start); an unknown count is no."""
    if code != -signal.SIGKILL or killed_by_us:
        return False
    now = oom_kills()
    return before is not None and now is not None and now > before


def _line_time_of(times_path: Path) -> Callable[[int], float | None]:
    """The time of the log's line `index`, read from the line-times file beside it (more read while following:
    the watcher writes a line's time within a millisecond of the line)."""
    times, offset = read_line_times(times_path)

    def time_of(index: int) -> float | None:
        nonlocal offset
        if index >= len(times):
            more, offset = read_line_times(times_path, offset)
            times.extend(more)
        return times[index] if index < len(times) else None

    return time_of


def vllm_version_of(executable: str) -> str | None:
    """`vllm --version` of an executable (None when it does not answer)."""
    parts = shlex.split(executable)
    argv = [*parts, "-m", "vllm.entrypoints.cli.main"] if Path(parts[0]).name.startswith("python") else parts
    try:
        done = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip().splitlines()
    return text[-1].strip() if done.returncode == 0 and text else None


def oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (None: unknown)."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def executable_digest(executable: str) -> str:
    """A stable identity of an executable (path and modification time) for learned facts."""
    parts = shlex.split(executable)
    try:
        stat = Path(parts[0]).stat()
        key = f"{parts}:{stat.st_mtime_ns}:{stat.st_size}"
    except (OSError, IndexError):
        key = executable
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()
