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
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import forking, protocol
from .children import ZygoteLink, extra_paths, log, oom_kills, spawn_plain

DEFAULT_ENTRY = "vllm.entrypoints.cli.main:main"
DEFAULT_PRELOAD = ("vllm.entrypoints.openai.api_server",)
"""What `vllm serve` imports before its first log line (FACTS: 17.4 s of the H200 boot)."""
STOP_ON_EXIT_SECONDS = 10.0
PR_SET_PDEATHSIG = 1


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
    link: ZygoteLink = field(default_factory=ZygoteLink)
    server: Server | None = None
    waiters: list[Waiter] = field(default_factory=list)
    pending_start: list[tuple[socket.socket, dict[str, Any]]] = field(default_factory=list)
    stopping: bool = False

    # -- the zygote --------------------------------------------------------------------------------
    def on_zygote_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "imported":
            self.link.imported(message)
            pending, self.pending_start = self.pending_start, []
            for conn, request in pending:
                self.answer(conn, self.start(request))
        elif kind == "exited" and self.server is not None and self.server.id == message.get("server_id"):
            self.server_exited(int(message["exit_code"]))

    def read_zygote(self, wait_for: str | None = None, timeout: float = 10.0) -> dict[str, Any] | None:
        """Handle what the zygote said; with `wait_for`, block until a message of that type and return it."""
        return self.link.read(self.on_zygote_message, self.zygote_gone, wait_for, timeout)

    def zygote_gone(self) -> None:
        if not self.link.gone():
            return
        if self.server is not None and not self.server.exited and self.server.mode == "fork":
            self.server_exited(-signal.SIGKILL)
        pending, self.pending_start = self.pending_start, []
        for conn, request in pending:
            self.answer(conn, self.start(request))

    # -- servers -----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        zygote = self.link.zygote
        state = "pending" if zygote is None else ("done" if zygote.imported else "failed")
        return {
            "ok": True,
            "version": protocol.VERSION,
            "pid": os.getpid(),
            "import": state,
            "import_seconds": self.link.import_seconds,
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
            env = forking.inherited_env(self.link.import_env or os.environ, protocol.SPEC_ENV_VAR)
            env.update({str(k): str(v) for k, v in dict(request.get("env") or {}).items()})
            server_id = int(request["server_id"])
            for var, path in dict(request.get("env_files") or {}).items():
                env[str(var)] = read_secret(str(path))
        except OSError as exc:
            return {"ok": False, "error": f"cannot read a secret file: {exc.strerror} ({exc.filename})"}
        except (KeyError, TypeError, ValueError) as exc:
            return {"ok": False, "error": f"malformed start request: {exc}"}
        link = self.link
        zygote = link.zygote or forking.Zygote(imported=False, error="the pre-import has not finished")
        decision = forking.decide(argv, env, zygote)
        if link.zygote is None and link.answers is not None:
            plain_anyway = forking.decide(argv, env, forking.Zygote(imported=True, env=link.import_env))
            if plain_anyway.fork:
                return None  # wait for the import: forking then is the faster boot
            decision = plain_anyway
        env = forking.server_env(env, decision)
        oom_before = oom_kills()
        fork = decision.fork and link.requests is not None
        mode = "fork" if fork else "plain"
        print(protocol.started_line(server_id, mode, decision.reason), flush=True)
        if fork:
            link.requests.write(json.dumps({"server_id": server_id, "argv": argv, "env": env}) + "\n")
            forked = self.read_zygote(wait_for="forked")
            if forked is None:
                print(protocol.exited_line(server_id, None, oom_killed=False), flush=True)
                return {"ok": False, "error": "the pre-imported vLLM process did not fork a server"}
            pid = int(forked["pid"])
        else:
            pid = spawn_plain(self.entry, argv, env)
        self.server = Server(server_id, pid, mode, decision.reason, request.get("fingerprint"), time.time(), oom_before)
        log(f"server {server_id} is pid {pid}")
        return {"ok": True, "server": self.server.to_json()}

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
        self.link.close()
        log("stopped")

    def poll(self, timeout: float) -> None:
        fds = [self.link.answers] if self.link.answers is not None else []
        if fds:
            select.select(fds, [], [], timeout)
        else:
            time.sleep(timeout)
        if self.link.answers is not None:
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
        self.link.start(self.entry, self.preload)
        log(f"listening on {protocol.SOCKET_NAME} (pid {os.getpid()})")
        try:
            while not self.stopping:
                fds: list[Any] = [listener]
                if self.link.answers is not None:
                    fds.append(self.link.answers)
                with contextlib.suppress(InterruptedError):
                    ready, _, _ = select.select(fds, [], [], 0.1)
                    if listener in ready:
                        conn, _ = listener.accept()
                        try:
                            self.handle(conn)
                        except Exception as exc:  # a request must never take the launcher and its server down
                            log(f"request failed: {type(exc).__name__}: {exc}")
                            self.answer(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
                if self.link.answers is not None:
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


def _preload_from_env() -> tuple[str, ...]:
    value = os.environ.get("DANKSERVE_LAUNCHER_PRELOAD")
    if value is None:
        return DEFAULT_PRELOAD
    return tuple(name for name in value.split(",") if name.strip())
