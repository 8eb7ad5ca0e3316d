"""The launcher process: pre-imports vLLM in a zygote, then starts one `vllm serve` server at a time.

Three kinds of process (all Linux, standard library only):

- the launcher (this process; PID 1 of the container, or the process runtime's workload): never
  imports vLLM, so it stays single-threaded and answers the socket while the import runs. It
  starts plain boots itself (fork + exec of a fresh interpreter) and reaps them;
- the zygote, forked from the launcher at start: imports vLLM in its main thread without
  touching CUDA, reports the threads the import left, then forks a server per request from that
  main thread and reports each server's exit. It dies with the launcher (PR_SET_PDEATHSIG);
- a server: its own process group (so it can be stopped without the launcher), killed if its
  parent dies, running vLLM's CLI `main()` with the request's argv and environment.

A server's lines go to the launcher's stdout (the container log, or the process runtime's log
file) between `protocol.started_line` and `protocol.exited_line`, which is how the daemon reads
one server's boot out of a log that holds several.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import os
import platform
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from . import forking, protocol

DEFAULT_ENTRY = "vllm.entrypoints.cli.main:main"
DEFAULT_PRELOAD = ("vllm.entrypoints.openai.api_server",)
"""What `vllm serve` imports before its first log line (FACTS: 17.4 s of the H200 boot)."""
STOP_ON_EXIT_SECONDS = 10.0
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


# --- the launcher ---------------------------------------------------------------------------------


@dataclass
class Server:
    id: int
    pid: int
    mode: str
    mode_reason: str
    fingerprint: str | None
    started_at: float
    oom_before: int | None
    exited: bool = False
    exit_code: int | None = None
    oom_killed: bool = False
    killed_by_us: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            "mode": self.mode,
            "mode_reason": self.mode_reason,
            "fingerprint": self.fingerprint,
            "started_at": self.started_at,
            "exited": self.exited,
            "exit_code": self.exit_code,
            "oom_killed": self.oom_killed,
        }


@dataclass
class Waiter:
    conn: socket.socket
    deadline: float
    kill_at: float | None = None
    """A stop: when the server's group gets SIGKILL."""


@dataclass
class Launcher:
    run_dir: Path
    entry: str
    preload: tuple[str, ...]
    secrets_dir: str = protocol.SECRETS_DIR
    """The only directory `env_files` may name a file in."""
    zygote_pid: int = 0
    zygote_in: Any = None
    zygote_out: Any = None
    zygote_buffer: bytes = b""
    zygote: forking.Zygote | None = None
    import_seconds: float | None = None
    import_env: dict[str, str] = field(default_factory=dict)
    server: Server | None = None
    waiters: list[Waiter] = field(default_factory=list)
    pending_start: list[tuple[socket.socket, dict[str, Any]]] = field(default_factory=list)
    stopping: bool = False

    # -- the zygote --------------------------------------------------------------------------------
    def start_zygote(self) -> None:
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        self.import_env = dict(os.environ)
        launcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            os.close(requests_w)
            os.close(answers_r)
            try:
                zygote_main(self.entry, self.preload, requests_r, answers_w, launcher)
            finally:
                os._exit(1)
        os.close(requests_r)
        os.close(answers_w)
        self.zygote_pid = pid
        self.zygote_in = os.fdopen(requests_w, "w", buffering=1)
        self.zygote_out = answers_r
        os.set_blocking(answers_r, False)
        log(f"pre-importing vLLM in pid {pid} ({', '.join((*self.preload, self.entry))})")

    def on_zygote_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "imported":
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
            pending, self.pending_start = self.pending_start, []
            for conn, request in pending:
                self.answer(conn, self.start(request))
        elif kind == "exited" and self.server is not None and self.server.id == message.get("server_id"):
            self.server_exited(int(message["exit_code"]))

    def read_zygote(self, wait_for: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
        """Handle what the zygote said; with `wait_for`, block until a message of that type and return it."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.zygote_buffer:
                line, self.zygote_buffer = self.zygote_buffer.split(b"\n", 1)
                message = protocol.decode(line)
                if wait_for is not None and message.get("type") == wait_for:
                    return message
                self.on_zygote_message(message)
            if wait_for is None:
                try:
                    chunk = os.read(self.zygote_out, 65536)
                except BlockingIOError:
                    return None
                if not chunk:
                    self.zygote_gone()
                    return None
                self.zygote_buffer += chunk
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            select.select([self.zygote_out], [], [], remaining)
            try:
                chunk = os.read(self.zygote_out, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.zygote_gone()
                return None
            self.zygote_buffer += chunk

    def zygote_gone(self) -> None:
        if self.zygote_out is None:
            return
        log("the pre-imported vLLM process is gone: later servers boot plainly")
        with contextlib.suppress(OSError):
            os.close(self.zygote_out)
        self.zygote_out = None
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.zygote_pid, os.WNOHANG)
        if self.zygote is None:
            self.zygote = forking.Zygote(imported=False, error="the importing process died")
        else:
            self.zygote = forking.Zygote(imported=False, error="the pre-imported process died")
        if self.server is not None and not self.server.exited and self.server.mode == "fork":
            self.server_exited(-signal.SIGKILL)
        pending, self.pending_start = self.pending_start, []
        for conn, request in pending:
            self.answer(conn, self.start(request))

    # -- servers -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        zygote = self.zygote
        state = "pending" if zygote is None else ("done" if zygote.imported else "failed")
        return {
            "ok": True,
            "version": protocol.VERSION,
            "pid": os.getpid(),
            "import": state,
            "import_seconds": self.import_seconds,
            "import_error": zygote.error if zygote is not None else None,
            "import_threads": list(zygote.threads) if zygote is not None else [],
            "cuda_initialized": zygote.cuda_initialized if zygote is not None else False,
            "server": self.server.to_json() if self.server is not None else None,
        }

    def start(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """Start a server (None: the answer waits for the pre-import)."""
        if self.server is not None and not self.server.exited:
            return {"ok": False, "error": f"server {self.server.id} is still running (pid {self.server.pid})"}
        try:
            argv = [str(a) for a in request["argv"]]
            env = forking.inherited_env(self.import_env or os.environ, protocol.SPEC_ENV_VAR)
            env.update({str(k): str(v) for k, v in dict(request.get("env") or {}).items()})
            server_id = int(request["server_id"])
            for var, path in dict(request.get("env_files") or {}).items():
                env[str(var)] = read_secret(str(path))
        except OSError as exc:
            return {"ok": False, "error": f"cannot read a secret file: {exc.strerror} ({exc.filename})"}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"malformed start request: {exc}"}
        zygote = self.zygote or forking.Zygote(imported=False, error="the pre-import has not finished")
        decision = forking.decide(argv, env, zygote)
        if self.zygote is None and self.zygote_out is not None:
            plain_anyway = forking.decide(argv, env, forking.Zygote(imported=True, env=self.import_env))
            if plain_anyway.fork:
                return None  # wait for the import: forking then is the faster boot
            decision = plain_anyway
        env = forking.server_env(env, decision)
        oom_before = oom_kills()
        fork = decision.fork and self.zygote_in is not None
        mode = "fork" if fork else "plain"
        print(protocol.started_line(server_id, mode, decision.reason), flush=True)
        if fork:
            self.zygote_in.write(json.dumps({"server_id": server_id, "argv": argv, "env": env}) + "\n")
            forked = self.read_zygote(wait_for="forked")
            if forked is None:
                print(protocol.exited_line(server_id, None, oom_killed=False), flush=True)
                return {"ok": False, "error": "the pre-imported vLLM process did not fork a server"}
            pid = int(forked["pid"])
        else:
            pid = self.spawn_plain(argv, env)
        self.server = Server(server_id, pid, mode, decision.reason, request.get("fingerprint"), time.time(), oom_before)
        log(f"server {server_id} is pid {pid}")
        return {"ok": True, "server": self.server.to_json()}

    def spawn_plain(self, argv: Sequence[str], env: Mapping[str, str]) -> int:
        """A plain boot: a fresh interpreter runs vLLM's CLI (what `vllm serve` does, spawn and all)."""
        module, _, name = self.entry.partition(":")
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

    def reap_plain(self) -> None:
        server = self.server
        if server is None or server.exited or server.mode != "plain":
            return
        try:
            pid, status = os.waitpid(server.pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid != 0:
            self.server_exited(os.waitstatus_to_exitcode(status))

    def server_exited(self, code: int) -> None:
        server = self.server
        if server is None or server.exited:
            return
        with contextlib.suppress(OSError):
            os.killpg(server.pid, signal.SIGKILL)  # vLLM's engine core and workers, if any are left
        after = oom_kills()
        server.exited = True
        server.exit_code = code
        server.oom_killed = (
            code == -signal.SIGKILL
            and not server.killed_by_us
            and server.oom_before is not None
            and after is not None
            and after > server.oom_before
        )
        log(protocol.exited_line(server.id, code, server.oom_killed).removeprefix(protocol.PREFIX + " "))
        for waiter in self.waiters:
            self.answer(waiter.conn, {"ok": True, "exited": True, "server": server.to_json()})
        self.waiters = []

    def signal_server(self, sig: signal.Signals) -> None:
        if self.server is not None and not self.server.exited:
            if sig == signal.SIGKILL:
                self.server.killed_by_us = True
            with contextlib.suppress(OSError):
                os.killpg(self.server.pid, sig)

    # -- the socket --------------------------------------------------------------------------------
    def answer(self, conn: socket.socket, message: dict[str, Any] | None) -> None:
        if message is None:
            return
        with contextlib.suppress(OSError):
            conn.sendall(protocol.encode(message))
        with contextlib.suppress(OSError):
            conn.close()

    def handle(self, conn: socket.socket) -> None:
        """One request (a refused one changes nothing: the launcher and its server go on)."""
        if not peer_allowed(conn):
            self.answer(conn, {"ok": False, "error": "only root or the launcher's own user may ask"})
            return
        try:
            request = protocol.decode(read_request(conn, time.monotonic() + protocol.READ_SECONDS))
        except (OSError, ValueError) as exc:  # a slow drip ends in TimeoutError (an OSError)
            self.answer(conn, {"ok": False, "error": f"unreadable request: {exc}"})
            return
        problem = protocol.request_problem(request, self.secrets_dir)
        if problem is not None:
            log(f"request refused: {problem}")
            self.answer(conn, {"ok": False, "error": f"malformed request: {problem}"})
            return
        conn.settimeout(None)
        op = request.get("op")
        now = time.monotonic()
        timeout = float(request.get("timeout") or 0.0)
        server = self.server
        if op == "status":
            self.answer(conn, self.status())
        elif op == "start":
            answer = self.start(request)
            if answer is None:
                self.pending_start.append((conn, request))
            else:
                self.answer(conn, answer)
        elif op in ("wait", "stop"):
            if server is None or server.exited:
                self.answer(conn, {"ok": True, "exited": True, "server": server.to_json() if server else None})
                return
            waiter = Waiter(conn, now + (timeout if op == "wait" else timeout + 30.0))
            if op == "stop":
                waiter.kill_at = now + timeout
                self.signal_server(signal.SIGTERM)
            self.waiters.append(waiter)
        elif op == "shutdown":
            self.answer(conn, {"ok": True})
            self.stopping = True

    def expire(self) -> None:
        now = time.monotonic()
        keep = []
        for waiter in self.waiters:
            if waiter.kill_at is not None and now >= waiter.kill_at:
                self.signal_server(signal.SIGKILL)
                waiter.kill_at = None
            if now >= waiter.deadline:
                server = self.server.to_json() if self.server else None
                self.answer(waiter.conn, {"ok": True, "exited": False, "server": server})
            else:
                keep.append(waiter)
        self.waiters = keep

    def shutdown(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and the zygote."""
        self.signal_server(signal.SIGTERM)
        deadline = time.monotonic() + STOP_ON_EXIT_SECONDS
        while self.server is not None and not self.server.exited and time.monotonic() < deadline:
            self.poll(0.05)
        self.signal_server(signal.SIGKILL)
        if self.zygote_in is not None:
            with contextlib.suppress(OSError):
                self.zygote_in.close()
        if self.zygote_pid:
            with contextlib.suppress(OSError):
                os.kill(self.zygote_pid, signal.SIGKILL)
        log("stopped")

    def poll(self, timeout: float) -> None:
        fds = [self.zygote_out] if self.zygote_out is not None else []
        if fds:
            select.select(fds, [], [], timeout)
        else:
            time.sleep(timeout)
        if self.zygote_out is not None:
            self.read_zygote()
        self.reap_plain()

    def serve(self) -> int:
        path = self.run_dir / protocol.SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            with protocol.socket_address(str(path)) as address:
                listener.bind(address)
        finally:
            os.umask(old)
        listener.listen(16)

        def on_signal(signum: int, frame: Any) -> None:
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.start_zygote()
        log(f"listening on {protocol.SOCKET_NAME} (pid {os.getpid()})")
        try:
            while not self.stopping:
                fds: list[Any] = [listener]
                if self.zygote_out is not None:
                    fds.append(self.zygote_out)
                with contextlib.suppress(InterruptedError):
                    ready, _, _ = select.select(fds, [], [], 0.1)
                    if listener in ready:
                        conn, _ = listener.accept()
                        try:
                            self.handle(conn)
                        except Exception as exc:  # a request must never take the launcher and its server down
                            log(f"request failed: {type(exc).__name__}: {exc}")
                            self.answer(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                if self.zygote_out is not None:
                    self.read_zygote()
                self.reap_plain()
                self.expire()
        finally:
            self.shutdown()
            with contextlib.suppress(OSError):
                path.unlink()
        return 0


def read_secret(path: str) -> str:
    """A Podman secret's text; a symbolic link there is refused (the launcher may read as root)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, encoding="utf-8") as file:
        return file.read(protocol.MAX_MESSAGE_BYTES).strip()


def read_request(conn: socket.socket, deadline: float) -> bytes:
    """The first line a peer sends, whole by `deadline` (TimeoutError otherwise) and at most MAX_MESSAGE_BYTES."""
    data = b""
    while b"\n" not in data and len(data) < protocol.MAX_MESSAGE_BYTES:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the request did not arrive within {protocol.READ_SECONDS:g} s")
        conn.settimeout(left)
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0]


def peer_allowed(conn: socket.socket) -> bool:
    """The peer is root or this launcher's user (SO_PEERCRED); the socket's mode says the same, this holds
    even where a directory above it is opened wider."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return False
    _, uid, _ = struct.unpack("3i", creds)
    return uid in (0, os.getuid())


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="dankserve-launcher", description="The pre-imported vLLM launcher.")
    parser.add_argument("--run-dir", required=True, help="directory of the control socket")
    parser.add_argument(
        "--entry",
        default=os.environ.get("DANKSERVE_LAUNCHER_ENTRY", DEFAULT_ENTRY),
        help="MODULE:FUNCTION of vLLM's CLI",
    )
    parser.add_argument(
        "--preload",
        action="append",
        default=None,
        help="a module to import beforehand (repeatable; default: vLLM's OpenAI API server)",
    )
    parser.add_argument(
        "--secrets-dir", default=protocol.SECRETS_DIR, help="the only directory env_files may name (Podman's secrets)"
    )
    args = parser.parse_args(list(argv))
    preload = tuple(args.preload) if args.preload is not None else _preload_from_env()
    sys.path[:0] = extra_paths()
    run_dir = Path(args.run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"{protocol.PREFIX} cannot use {run_dir}: {exc.strerror}", file=sys.stderr, flush=True)
        return 2
    return Launcher(run_dir, args.entry, preload, secrets_dir=args.secrets_dir.rstrip("/") or "/").serve()


def extra_paths() -> list[str]:
    """DANKSERVE_LAUNCHER_PATH: directories to import vLLM's CLI from, before the interpreter's own (a stand-in
    outside site-packages; PYTHONPATH itself is refused in a deployment's env)."""
    return [p for p in os.environ.get("DANKSERVE_LAUNCHER_PATH", "").split(os.pathsep) if p]


def _preload_from_env() -> tuple[str, ...]:
    value = os.environ.get("DANKSERVE_LAUNCHER_PRELOAD")
    if value is None:
        return DEFAULT_PRELOAD
    return tuple(name for name in value.split(",") if name.strip())
