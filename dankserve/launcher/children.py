"""The launcher's child processes: the zygote (vLLM pre-imported, forking a server per request) and plain boots.

The zygote side runs in the forked child (`zygote_main`); `ZygoteLink` is the launcher's side of
it: the two pipes, what the import reported, and the zygote's messages read without blocking.
`spawn_plain` starts a server in a fresh interpreter instead (what `vllm serve` does).
Standard library only (the launcher runs in the image's Python).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import platform
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from . import forking, protocol

PR_SET_PDEATHSIG = 1


def log(message: str) -> None:
    print(f"{protocol.PREFIX} {message}", flush=True)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (a server never outlives its launcher); `parent` is the pid
    before the fork: one that died before the signal was set leaves us reparented, so we go at once."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def thread_names() -> list[str]:
    """Every thread of this process (OS threads, not only Python's), the main thread first: Python's name where
    Python started it, else the kernel's (`comm`), with the thread id."""
    import threading  # only to name threads; the launcher itself starts none

    python_names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    pid = os.getpid()
    out: list[tuple[int, str]] = []
    try:
        tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    except OSError:
        return ["main"]
    for tid in tids:
        try:
            name = python_names.get(tid) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue
        out.append((0, name) if tid == pid else (1, f"{name}[{tid}]"))
    return [name for _, name in sorted(out, key=lambda item: item[0])] or ["main"]


def python_threads() -> list[str]:
    """The threads Python's `threading` runs besides the main thread, as `name[tid]`."""
    import threading

    main = threading.main_thread()
    return [f"{t.name}[{t.native_id}]" for t in threading.enumerate() if t is not main]


def in_wsl() -> bool:
    """vLLM's own test (vllm/platforms/interface.py::in_wsl)."""
    return "microsoft" in " ".join(platform.uname()).lower()


def oom_kills() -> int | None:
    """OOM kills so far: the cgroup's count (a container's own), else the kernel's."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/proc/vmstat", "oom_kill")):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def resolve_entry(entry: str) -> Callable[[], Any]:
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(module), name or "main")  # type: ignore[no-any-return]


def run_entry(entry: Callable[[], Any], argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    """In a freshly forked server: become `vllm serve ARGV` under `env`, and exit with its status."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        sys.argv = ["vllm", "serve", *argv]
        result = entry()
        code = result if isinstance(result, int) else 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


# --- the zygote -----------------------------------------------------------------------------------


def zygote_import(entry: str, preload: Sequence[str]) -> tuple[Callable[[], Any] | None, dict[str, Any]]:
    """Import vLLM (nothing here touches CUDA); the CLI's entry point (None: failed) and the report."""
    started = time.monotonic()
    function: Callable[[], Any] | None = None
    error = None
    try:
        for name in preload:
            importlib.import_module(name)
        function = resolve_entry(entry)
    except BaseException as exc:  # the plain boot will show vLLM's own error
        error = f"{type(exc).__name__}: {exc}"
    torch = sys.modules.get("torch")
    cuda = False
    with contextlib.suppress(Exception):
        cuda = bool(torch is not None and torch.cuda.is_initialized())
    report = {
        "type": "imported",
        "imported": function is not None,
        "error": error,
        "seconds": round(time.monotonic() - started, 3),
        "threads": thread_names(),
        "python_threads": python_threads(),
        "cuda_initialized": cuda,
    }
    return function, report


def zygote_main(entry: str, preload: Sequence[str], requests: int, answers: int, launcher: int) -> NoReturn:
    """Import vLLM, report, then fork servers on request until the launcher goes away."""
    die_with_parent(launcher)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the launcher, which stops us
    out = os.fdopen(answers, "w", buffering=1)
    function, report = zygote_import(entry, preload)
    out.write(json.dumps(report) + "\n")
    reader = os.fdopen(requests, "r")
    children: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([reader], [], [], 0.1)
        if ready:
            line = reader.readline()
            if not line:  # the launcher is gone or stopping: so are its servers
                for pid in children:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
                os._exit(0)
            request = json.loads(line)
            if function is not None:
                zygote = os.getpid()
                pid = os.fork()
                if pid == 0:
                    os.setpgid(0, 0)
                    die_with_parent(zygote)
                    reader.close()
                    out.close()
                    run_entry(function, request["argv"], request["env"])
                with contextlib.suppress(OSError):
                    os.setpgid(pid, pid)
                children[pid] = int(request["server_id"])
                out.write(json.dumps({"type": "forked", "server_id": children[pid], "pid": pid}) + "\n")
        for server_id, code in reap(children):
            out.write(json.dumps({"type": "exited", "server_id": server_id, "exit_code": code}) + "\n")


def reap(children: dict[int, int]) -> list[tuple[int, int]]:
    """Servers of `children` (pid -> server id) that have exited: (server id, exit code), removed from it."""
    out = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        server_id = children.pop(pid, None)
        if server_id is not None:
            out.append((server_id, os.waitstatus_to_exitcode(status)))
    return out


# --- the launcher's side of the zygote -------------------------------------------------------------


@dataclass
class ZygoteLink:
    """The pipes to the zygote and what its import reported (`zygote` is None while the import runs)."""

    pid: int = 0
    requests: Any = None
    """Where fork requests are written (line-buffered text); None before start."""
    answers: int | None = None
    """The zygote's messages (a non-blocking fd); None before start and once the zygote is gone."""
    buffer: bytes = b""
    zygote: forking.Zygote | None = None
    import_seconds: float | None = None
    import_env: dict[str, str] = field(default_factory=dict)

    def start(self, entry: str, preload: tuple[str, ...]) -> None:
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        self.import_env = dict(os.environ)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(requests_w)
            os.close(answers_r)
            try:
                zygote_main(entry, preload, requests_r, answers_w, launcher)
            finally:
                os._exit(1)
        os.close(requests_r)
        os.close(answers_w)
        self.pid = pid
        self.requests = os.fdopen(requests_w, "w", buffering=1)
        self.answers = answers_r
        os.set_blocking(answers_r, False)
        log(f"pre-importing vLLM in pid {pid} ({', '.join((*preload, entry))})")

    def imported(self, message: dict[str, Any]) -> None:
        """The zygote's import report."""
        self.zygote = forking.Zygote(
            imported=bool(message["imported"]),
            error=message.get("error"),
            threads=tuple(message.get("threads") or ()),
            python_threads=tuple(message.get("python_threads") or ()),
            cuda_initialized=bool(message.get("cuda_initialized")),
            wsl=in_wsl(),
            env=self.import_env,
        )
        self.import_seconds = float(message.get("seconds") or 0.0)
        if self.zygote.imported:
            log(f"vLLM imported in {self.import_seconds:.1f} s; threads: {', '.join(self.zygote.threads)}")
        else:
            log(f"pre-import failed: {self.zygote.error}")

    def read(
        self,
        on_message: Callable[[dict[str, Any]], None],
        on_gone: Callable[[], None],
        wait_for: str | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any] | None:
        """Hand each message the zygote sent to `on_message`; with `wait_for`, block until a message of that
        type and return it. The pipe's end calls `on_gone`."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = protocol.decode(line)
                if wait_for is not None and message.get("type") == wait_for:
                    return message
                on_message(message)
            if self.answers is None:
                return None
            if wait_for is None:
                try:
                    chunk = os.read(self.answers, 65536)
                except BlockingIOError:
                    return None
                if not chunk:
                    on_gone()
                    return None
                self.buffer += chunk
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([self.answers], [], [], remaining)
            try:
                chunk = os.read(self.answers, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                on_gone()
                return None
            self.buffer += chunk

    def gone(self) -> bool:
        """The zygote's pipe ended: later servers boot plainly. False when it was already gone."""
        if self.answers is None:
            return False
        log("the pre-imported vLLM process is gone: later servers boot plainly")
        with contextlib.suppress(OSError):
            os.close(self.answers)
        self.answers = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)
        if self.zygote is None:
            self.zygote = forking.Zygote(imported=False, error="the importing process died")
        else:
            self.zygote = forking.Zygote(imported=False, error="the pre-imported process died")
        return True

    def close(self) -> None:
        """Stop the zygote (its servers die with it)."""
        if self.requests is not None:
            with contextlib.suppress(OSError):
                self.requests.close()
        if self.pid:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)


def spawn_plain(entry: str, argv: Sequence[str], env: Mapping[str, str]) -> int:
    """A plain boot: a fresh interpreter runs vLLM's CLI (what `vllm serve` does, spawn and all); its pid."""
    module, _, name = entry.partition(":")
    code = (
        f"import sys; sys.argv = sys.argv[1:]; sys.path[:0] = {extra_paths()!r}; "
        f"from {module} import {name or 'main'} as m; sys.exit(m())"
    )
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            die_with_parent(launcher)
            os.execve(sys.executable, [sys.executable, "-c", code, "vllm", "serve", *argv], dict(env))
        finally:
            os._exit(127)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    return pid


def extra_paths() -> list[str]:
    """DANKSERVE_LAUNCHER_PATH: directories to import vLLM's CLI from, before the interpreter's own (a stand-in
    outside site-packages; PYTHONPATH itself is refused in a deployment's env)."""
    return [p for p in os.environ.get("DANKSERVE_LAUNCHER_PATH", "").split(os.pathsep) if p]
