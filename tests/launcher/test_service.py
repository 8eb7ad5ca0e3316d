"""Tests for dankserve.launcher.service: a real launcher process, run by path as in a container."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dankserve.launcher import protocol
from dankserve.runtime.base import LaunchRequest
from dankserve.runtime.launcher_client import LauncherClient, LauncherRefused, ServerInfo
from tests.harness.wait import wait_until

MAIN = Path(__file__).resolve().parents[2] / "dankserve" / "launcher" / "__main__.py"

ENTRY = f"""
import os, sys, threading, time
SPEC_ENV_VAR = {protocol.SPEC_ENV_VAR!r}
time.sleep(float(os.environ.get("IMPORT_SECONDS", "0")))
if os.environ.get("START_THREAD"):
    threading.Thread(target=time.sleep, args=(60,), name="pool", daemon=True).start()
if os.environ.get("START_NATIVE_THREAD"):  # a thread Python does not know of, as OpenBLAS starts
    import ctypes
    libc = ctypes.CDLL(None)
    tid = ctypes.c_ulong()
    libc.pthread_create(ctypes.byref(tid), None, ctypes.cast(libc.sleep, ctypes.c_void_p), ctypes.c_void_p(60))
def main():
    method = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")
    inherited = os.environ.get("IMAGE_VAR"), os.environ.get("DEPLOYMENT_VAR"), os.environ.get(SPEC_ENV_VAR)
    print("ARGV", sys.argv[1:], "KEY", os.environ.get("KEY"), "METHOD", method, "INHERITED", inherited, flush=True)
    mode = sys.argv[-1]
    if mode == "sleep":
        time.sleep(60)
    return int(mode) if mode.isdigit() else 0
"""


class Launched:
    def __init__(self, proc: subprocess.Popen[bytes], run_dir: Path, log: Path) -> None:
        self.proc = proc
        self.client = LauncherClient(run_dir)
        self.log = log

    def start(self, server_id: int, *argv: str, env: dict[str, str] | None = None, **files: str) -> ServerInfo:
        request = LaunchRequest(argv, env or self.env, files)
        return self.client.start(server_id, request, "fp", timeout=30)

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": os.environ["PYTHONPATH_ENTRY"]}

    def lines(self, server_id: int) -> list[str]:
        return list(protocol.server_lines(self.log.read_text().splitlines(), server_id))


@pytest.fixture
def launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Launched]:
    (tmp_path / "entry").mkdir()
    (tmp_path / "entry" / "fakeentry.py").write_text(ENTRY)
    extra = getattr(request, "param", {})
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(tmp_path / "entry"),
        "DANKSERVE_LAUNCHER_ENTRY": "fakeentry:main",
        "DANKSERVE_LAUNCHER_PRELOAD": "",
        **extra,
    }
    monkeypatch.setenv("PYTHONPATH_ENTRY", str(tmp_path / "entry"))
    log = tmp_path / "launcher.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(MAIN), "--run-dir", str(tmp_path / "run"), "--secrets-dir", str(tmp_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    launched = Launched(proc, tmp_path / "run", log)
    launched.client.wait_listening(10)
    try:
        yield launched
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)


def wait_exit(launched: Launched) -> ServerInfo:
    server = launched.client.wait(10)
    assert server is not None
    return server


def test_a_server_is_forked_with_its_argv_env_and_secret_and_its_exit_reported(
    launched: Launched, tmp_path: Path
) -> None:
    """A forked server runs the CLI with the request's argv and env, a secret read from its file, fork for vLLM's
    engine core; its exit code comes back and its lines sit between its markers."""
    (tmp_path / "key").write_text("s3cret\n")
    server = launched.start(1, "model", "3", env={**launched.env}, KEY=str(tmp_path / "key"))
    assert server.mode == "fork" and server.fingerprint == "fp"
    assert wait_exit(launched).exit_code == 3
    (line,) = launched.lines(1)
    assert "['serve', 'model', '3']" in line and "KEY s3cret" in line and "METHOD fork" in line


def test_a_second_server_is_refused_while_one_runs_then_started(launched: Launched) -> None:
    """One server at a time: a start while one runs is refused; after a stop the next one starts."""
    first = launched.start(1, "m", "sleep")
    with pytest.raises(LauncherRefused, match="still running"):
        launched.start(2, "m", "0")
    stopped = launched.client.stop(5)
    assert stopped is not None and stopped.exited and stopped.exit_code == -signal.SIGTERM
    assert not psutil.pid_exists(first.pid) or psutil.Process(first.pid).status() == psutil.STATUS_ZOMBIE
    assert launched.start(2, "m", "0").id == 2
    assert wait_exit(launched).exit_code == 0


def test_a_wait_that_times_out_says_still_running(launched: Launched) -> None:
    """`wait` answers `exited: false` after its timeout while the server runs."""
    launched.start(1, "m", "sleep")
    assert launched.client.wait(0.2) is None


def test_numa_binding_boots_plainly_and_says_why(launched: Launched) -> None:
    """--numa-bind (vLLM forces spawn) gets a plain boot in a fresh interpreter, which runs the same CLI."""
    server = launched.start(1, "m", "--numa-bind", "0")
    assert server.mode == "plain" and "--numa-bind" in server.mode_reason
    assert wait_exit(launched).exit_code == 0
    (line,) = launched.lines(1)
    assert "METHOD None" in line


@pytest.mark.parametrize("launched", [{"START_THREAD": "1"}], indirect=True)
def test_an_import_that_starts_threads_is_not_forked(launched: Launched) -> None:
    """Threads left by the import make the launcher boot plainly, naming them."""
    server = launched.start(1, "m", "0")
    assert server.mode == "plain" and "pool" in server.mode_reason
    status = launched.client.status()
    assert any("pool" in name for name in status.import_threads)


@pytest.mark.parametrize("launched", [{"START_NATIVE_THREAD": "1"}], indirect=True)
def test_an_import_that_leaves_native_threads_still_forks(launched: Launched) -> None:
    """A native thread left by the import (no Python thread) is counted, and the server is forked."""
    server = launched.start(1, "m", "0")
    assert server.mode == "fork" and "1 native threads" in server.mode_reason
    assert len(launched.client.status().import_threads) == 2
    assert wait_exit(launched).exit_code == 0


@pytest.mark.parametrize("launched", [{"IMPORT_SECONDS": "1.5"}], indirect=True)
def test_the_socket_answers_during_the_import_and_a_start_waits_for_it(launched: Launched) -> None:
    """While vLLM imports, status answers at once (pending); a start waits and then forks."""
    begun = time.monotonic()
    assert launched.client.status().import_state == "pending"
    assert time.monotonic() - begun < 1.0
    server = launched.start(1, "m", "0")
    assert server.mode == "fork"
    assert launched.client.status().import_state == "done"


def test_sigterm_stops_the_server_and_a_killed_launcher_takes_it_along(launched: Launched) -> None:
    """The launcher's SIGTERM stops its server; SIGKILL of the launcher ends the server by the parent-death signal."""
    server = launched.start(1, "m", "sleep")
    launched.proc.send_signal(signal.SIGTERM)
    assert launched.proc.wait(15) == 0
    assert not psutil.pid_exists(server.pid)


def test_a_killed_launcher_leaves_no_server(tmp_path: Path, launched: Launched) -> None:
    """SIGKILL of the launcher: the zygote and the server die with it."""
    server = launched.start(1, "m", "sleep")
    launched.proc.kill()
    launched.proc.wait(5)

    def gone() -> bool:
        try:
            return psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(gone, 5, what=f"the server (pid {server.pid}) to go")


def test_a_malformed_request_is_answered_with_an_error(launched: Launched) -> None:
    """A request that is not a JSON object, or names no known op, is refused in words."""
    for payload in (b"not json\n", b'{"op": "fly"}\n'):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(str(launched.client.path))
            conn.sendall(payload)
            answer = protocol.decode(conn.recv(65536))
        assert answer["ok"] is False and answer["error"]


SPEC_SET = {"IMAGE_VAR": "image", "DEPLOYMENT_VAR": "old", protocol.SPEC_ENV_VAR: "DEPLOYMENT_VAR"}


@pytest.mark.parametrize("launched", [SPEC_SET], indirect=True)
def test_a_server_inherits_the_launchers_env_but_the_deployments_variables_only_from_its_request(
    launched: Launched,
) -> None:
    """A server keeps the launcher's own variables (an image's), gets the deployment's from its request alone (a
    dropped one is gone), and is still forked: the import-time PYTHONPATH is the inherited one."""
    server = launched.start(1, "m", "0", env={"KEY": "k"})
    assert server.mode == "fork", server.mode_reason
    assert wait_exit(launched).exit_code == 0
    (line,) = launched.lines(1)
    assert "KEY k" in line and "INHERITED ('image', None, None)" in line
    launched.start(2, "m", "0", env={"DEPLOYMENT_VAR": "new"})
    wait_exit(launched)
    assert "INHERITED ('image', 'new', None)" in launched.lines(2)[0]


@pytest.mark.parametrize("launched", [{"IMAGE_VAR": "daemon", protocol.SPEC_ENV_VAR: "*"}], indirect=True)
def test_a_star_makes_the_requests_env_the_servers_whole_env(launched: Launched) -> None:
    """`*` (the process runtime): nothing of the launcher's own environment reaches a server."""
    launched.start(1, "m", "0")
    wait_exit(launched)
    assert "INHERITED (None, None, None)" in launched.lines(1)[0]
