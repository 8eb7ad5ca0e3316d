"""Tests for dankserve.runtime.process with real child processes."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from dankserve.errors import InvalidInput
from dankserve.runtime.base import GpuRef, Mount, SecretFile, WorkloadSpec, with_bind_address
from dankserve.runtime.process import ProcessRuntime, oom_kills, serve_command
from tests.harness.wait import wait_until

SERVER = textwrap.dedent(
    """\
    #!{python}
    import os, signal, sys, time
    print("argv", " ".join(sys.argv[1:]), flush=True)
    print("cuda", os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"), flush=True)
    print("cache", os.environ.get("VLLM_CACHE_ROOT"), "hf", os.environ.get("HF_HOME"), flush=True)
    print("key-set", bool(os.environ.get("VLLM_API_KEY")), flush=True)
    mode = os.environ.get("MODE", "serve")
    if mode == "ignore-int":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mode == "crash":
        sys.exit(3)
    child = os.fork()
    if child == 0:
        while True:
            time.sleep(1)
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        print("shutting down", flush=True)
        sys.exit(0)
    """
)


def write_server(tmp_path: Path) -> str:
    """The stand-in `vllm` script above, executable."""
    path = tmp_path / "vllm"
    path.write_text(SERVER.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fake_vllm(tmp_path: Path) -> str:
    return write_server(tmp_path)


def _spec(tmp_path: Path, executable: str, **env: str) -> WorkloadSpec:
    key = tmp_path / "key"
    key.write_text("sekrit\n")
    key.chmod(0o600)
    return WorkloadSpec(
        deployment="chat",
        image="",
        argv=("org/model", "--max-model-len", "4096"),
        env=env,
        port=18000,
        gpus=(GpuRef(1, "GPU-b"), GpuRef(3, "GPU-d")),
        mounts=(Mount(tmp_path / "hf", "/root/.cache/huggingface"),),
        secrets=(SecretFile("api_key", key, "VLLM_API_KEY"),),
        labels={"io.dankserve.fingerprint": "abc"},
        executable=executable,
        cache_dir=tmp_path / "cache",
    )


def _live_group_members(pgid: int) -> list[int]:
    """Processes of the group that are not zombies (an orphaned zombie awaits init's reaping)."""
    out = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _runtime(tmp_path: Path) -> ProcessRuntime:
    return ProcessRuntime(tmp_path / "procs", gpu_release=lambda uuids, timeout: None)


def _wait_for(predicate: object, timeout: float = 10.0) -> None:
    wait_until(predicate, timeout)  # type: ignore[arg-type]


def test_serve_command_for_vllm_script_and_python() -> None:
    """A vllm script gets `serve ARGS`; a Python gets `-m vllm.entrypoints.cli.main serve ARGS`."""
    assert serve_command("/v/bin/vllm", ("m",)) == ["/v/bin/vllm", "serve", "m"]
    assert serve_command("/v/bin/python3", ("m",)) == [
        "/v/bin/python3",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "m",
    ]
    with pytest.raises(InvalidInput):
        serve_command("", ("m",))


def test_bind_address_is_the_deployments() -> None:
    """--host/--port are the deployment's, replacing any other value in the argv."""
    assert with_bind_address(("m",), "127.0.0.1", 8001) == ("m", "--host", "127.0.0.1", "--port", "8001")
    assert with_bind_address(("m", "--port", "9", "--x"), "h", 1) == ("m", "--x", "--host", "h", "--port", "1")
    assert with_bind_address(("m", "--host=0.0.0.0"), "h", 1) == ("m", "--host", "h", "--port", "1")


def test_started_process_gets_gpus_caches_and_key_but_not_in_argv(tmp_path: Path, fake_vllm: str) -> None:
    """The server sees its GPUs, cache dirs and API key in env; the key is not in its argv."""
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, fake_vllm))
    try:
        _wait_for(lambda: len(list(runtime.logs(workload.id))) >= 4)
        lines = list(runtime.logs(workload.id))
        assert lines[0] == "argv serve org/model --max-model-len 4096 --host 127.0.0.1 --port 18000"
        assert lines[1] == "cuda 1,3 PCI_BUS_ID"
        assert lines[2] == f"cache {tmp_path / 'cache'} hf {tmp_path / 'hf'}"
        assert lines[3] == "key-set True"
        cmdline = Path(f"/proc/{workload.pid}/cmdline").read_bytes()
        assert b"sekrit" not in cmdline
        assert workload.running
        assert runtime.find("chat") == runtime.inspect(workload.id)
    finally:
        runtime.stop(workload.id, 5)
        runtime.remove(workload.id)
    assert runtime.find("chat") is None


def test_stop_interrupts_then_kills_the_whole_group(tmp_path: Path, fake_vllm: str) -> None:
    """A server ignoring SIGINT is killed with its children after the timeout."""
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, fake_vllm, MODE="ignore-int"))
    assert workload.pid is not None
    _wait_for(lambda: len(list(runtime.logs(workload.id))) >= 4)
    started = time.monotonic()
    runtime.stop(workload.id, 0.5)
    assert time.monotonic() - started >= 0.5
    assert _live_group_members(workload.pid) == []
    assert runtime.inspect(workload.id) is not None
    assert not runtime.inspect(workload.id).running  # type: ignore[union-attr]
    runtime.remove(workload.id)


def test_exit_code_and_follow_end_when_process_exits(tmp_path: Path, fake_vllm: str) -> None:
    """A crashing server's log stream ends and wait reports its exit code."""
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, fake_vllm, MODE="crash"))
    lines = list(runtime.logs(workload.id, follow=True))
    assert lines[-1] == "key-set True"
    event = runtime.wait(workload.id, timeout=5)
    assert event is not None and event.exit_code == 3
    runtime.remove(workload.id)


def test_restarted_runtime_finds_server_by_pid_and_start_time(tmp_path: Path, fake_vllm: str) -> None:
    """A new runtime object (a restarted daemon) finds the running server and can stop it."""
    first = _runtime(tmp_path)
    workload = first.start(_spec(tmp_path, fake_vllm))
    second = _runtime(tmp_path)
    found = second.find("chat")
    assert found is not None and found.running and found.fingerprint == "abc"
    second.stop(found.id, 5)
    _wait_for(lambda: not second.inspect(found.id).running)  # type: ignore[union-attr]
    second.remove(found.id)
    first.wait(workload.id, timeout=1)


def test_reused_pid_is_not_mistaken_for_the_server(tmp_path: Path, fake_vllm: str) -> None:
    """A record whose pid now belongs to another process (other start time) is not running."""
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, fake_vllm))
    record = tmp_path / "procs" / "chat.json"
    text = record.read_text().replace(f'"pid": {workload.pid}', f'"pid": {os.getpid()}')
    os.killpg(workload.pid or 0, signal.SIGKILL)
    record.write_text(text)
    found = runtime.find("chat")
    assert found is not None and not found.running
    runtime.remove(found.id)


KILLED_BEFORE_RECORD = textwrap.dedent(
    """\
    import os, signal, sys
    from pathlib import Path
    import dankserve.runtime.process as process
    from dankserve.runtime.base import GpuRef, WorkloadSpec

    def die(*args, **kwargs):  # the daemon is killed with -9 after the start, before the record is written
        os.kill(os.getpid(), signal.SIGKILL)

    process.write_private_file = die
    tmp = Path(sys.argv[1])
    spec = WorkloadSpec(deployment="chat", image="", argv=("org/model",), env={{"MARK": sys.argv[2]}}, port=18000,
                        gpus=(GpuRef(0, "GPU-a"),), executable=sys.argv[3])
    process.ProcessRuntime(tmp / "processes", gpu_release=lambda uuids, timeout: None).start(spec)
    """
)


def test_a_daemon_killed_before_the_record_is_written_leaves_no_server(tmp_path: Path, fake_vllm: str) -> None:
    """A daemon killed with -9 between starting a server and recording it leaves no server behind."""
    mark = f"dankserve-gate-{os.getpid()}-{time.monotonic_ns()}"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_RECORD.format(), str(tmp_path), mark, fake_vllm],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    with contextlib.suppress(AssertionError):
        wait_until(lambda: not _with_mark(mark), 5, what="the marked servers to go")
    survivors = _with_mark(mark)
    for proc in survivors:
        with contextlib.suppress(psutil.Error):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not survivors, f"a server no record names outlived its daemon: {survivors}"
    assert "argv" not in (tmp_path / "processes" / "chat.log").read_text()  # the server never ran


def _with_mark(mark: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
    return out


def test_a_sigkill_is_an_oom_kill_only_when_the_kernel_counted_one(tmp_path: Path, fake_vllm: str) -> None:
    """SIGKILL from anyone but the kernel's OOM killer (whose counter did not rise) is no OOM kill."""
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, fake_vllm))
    assert workload.pid is not None
    os.killpg(workload.pid, signal.SIGKILL)
    event = runtime.wait(workload.id, timeout=10)
    assert event is not None and event.exit_code == -signal.SIGKILL
    assert event.oom_killed is False
    runtime.remove(workload.id)


def test_the_oom_kill_counter_is_read_from_vmstat(tmp_path: Path) -> None:
    """oom_kills reads the kernel's counter; an unreadable or absent one is unknown (None)."""
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 10\noom_kill 3\n")
    assert oom_kills(vmstat) == 3
    vmstat.write_text("pgfault 10\n")
    assert oom_kills(vmstat) is None
    assert oom_kills(tmp_path / "absent") is None


STAMPED_SERVER = textwrap.dedent(
    """\
    #!{python}
    import sys, time
    time.sleep(1)  # vLLM's imports take seconds before its first line: the watcher follows the log by then
    print("one", flush=True)
    time.sleep(0.3)
    print("two", flush=True)
    sys.stdout.write("three, no newline")
    """
)


def test_each_log_line_keeps_the_time_it_was_written_to_the_microsecond(tmp_path: Path) -> None:
    """A process server's lines come with the times its watcher wrote beside the log as they appeared (sub-second,
    as conmon's for a container), the last line without its newline too; the watcher ends with the server."""
    server = tmp_path / "stamped"
    server.write_text(STAMPED_SERVER.format(python=sys.executable))
    server.chmod(0o755)
    runtime = _runtime(tmp_path)
    before = time.time()
    workload = runtime.start(_spec(tmp_path, str(server)))
    assert runtime.wait(workload.id, timeout=30) is not None
    timed = list(runtime.timed_logs(workload.id))
    assert [text for _, text in timed] == ["one", "two", "three, no newline"]
    stamps = [at.timestamp() for at, _ in timed if at is not None]
    assert len(stamps) == 3 and before <= stamps[0] <= stamps[1] <= stamps[2] <= time.time()
    assert 0.25 <= stamps[1] - stamps[0] < 5  # the sleep between them, not whole seconds
    assert any(s != int(s) for s in stamps)
    assert not runtime._watchers, "the watcher was not reaped"


def test_a_log_without_line_times_gives_its_lines_without_times(tmp_path: Path) -> None:
    """A server started by a dankserve that kept no line times (no file beside its log): lines, no times."""
    server = tmp_path / "stamped"
    server.write_text(STAMPED_SERVER.format(python=sys.executable))
    server.chmod(0o755)
    runtime = _runtime(tmp_path)
    workload = runtime.start(_spec(tmp_path, str(server)))
    assert runtime.wait(workload.id, timeout=30) is not None
    (tmp_path / "procs" / "chat.log.times").unlink()
    assert list(runtime.timed_logs(workload.id)) == [(None, "one"), (None, "two"), (None, "three, no newline")]
