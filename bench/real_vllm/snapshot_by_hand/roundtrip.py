"""Device probe for issue 44 item 1: the CUDA checkpoint API round trip, then CRIU around it.

child: holds a tensor on the GPU and answers SIGUSR1 with its checksum in a result file.
parent: lock -> checkpoint -> [criu dump, kill, criu restore] -> restore -> unlock, timed; the child's
checksum must match before and after. `--no-gpu` rehearses the CRIU half on a CPU machine."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(os.environ.get("PROBE_DIR", "/tmp/probe"))


def child(no_gpu: bool) -> None:
    if no_gpu:
        data = list(range(1 << 20))
        checksum = lambda: float(sum(data))  # noqa: E731
    else:
        import torch

        x = torch.arange(1 << 26, device="cuda", dtype=torch.float32)  # 256 MiB
        pad = torch.empty(2 << 30, device="cuda", dtype=torch.uint8)  # 2 GiB held
        pad.fill_(7)
        torch.cuda.synchronize()
        checksum = lambda: float(x.double().sum().item()) + float(pad[::4096].double().sum().item())  # noqa: E731
    first: float = checksum()  # type: ignore[no-untyped-call]
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
    (WORK / "ready.tmp").write_text(json.dumps({"pid": os.getpid(), "checksum": first}))
    os.rename(WORK / "ready.tmp", WORK / "ready")
    n = 0
    while True:
        sig = signal.sigwait({signal.SIGUSR1, signal.SIGUSR2})
        if sig == signal.SIGUSR2:
            return
        n += 1
        value: float = checksum()  # type: ignore[no-untyped-call]
        tmp = WORK / f"result{n}.tmp"
        tmp.write_text(json.dumps({"checksum": value, "pid": os.getpid()}))
        os.rename(tmp, WORK / f"result{n}")


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        rc = self.lib.cuInit(0)
        if rc != 0:
            raise RuntimeError(f"cuInit {rc}")
        v = ctypes.c_int()
        self.lib.cuDriverGetVersion(ctypes.byref(v))
        self.version = v.value

    def call(self, name: str, pid: int, *extra: object) -> int:
        fn = getattr(self.lib, name)
        return int(fn(ctypes.c_int(pid), *extra))

    def lock(self, pid: int, timeout_ms: int = 10000) -> int:
        class LockArgs(ctypes.Structure):
            _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint), ("reserved1", ctypes.c_uint64 * 7)]

        args = LockArgs(timeout_ms, 0)
        return self.call("cuCheckpointProcessLock", pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> int:
        return self.call("cuCheckpointProcessCheckpoint", pid, None)

    def restore(self, pid: int) -> int:
        return self.call("cuCheckpointProcessRestore", pid, None)

    def unlock(self, pid: int) -> int:
        return self.call("cuCheckpointProcessUnlock", pid, None)

    def state(self, pid: int) -> tuple[int, int]:
        s = ctypes.c_int(-1)
        rc = self.call("cuCheckpointProcessGetState", pid, ctypes.byref(s))
        return rc, s.value


class NoGpu:
    version = 0

    def lock(self, pid: int, timeout_ms: int = 10000) -> int:
        return 0

    checkpoint = restore = unlock = lock

    def state(self, pid: int) -> tuple[int, int]:
        return 0, -1


def gpu_mib(pid: int) -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            check=False,
            text=True,
            timeout=20,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"n/a ({exc})"
    rows = [line for line in out.splitlines() if line.split(",")[0].strip() == str(pid)]
    return rows[0].split(",")[1].strip() if rows else "0 (not listed)"


def ask(n: int, pid: int) -> dict[str, object]:
    os.kill(pid, signal.SIGUSR1)
    path = WORK / f"result{n}"
    end = time.monotonic() + 60
    while not path.exists():
        if time.monotonic() > end:
            return {"error": "no answer in 60 s"}
        time.sleep(0.01)
    answer: dict[str, object] = json.loads(path.read_text())
    return answer


def parent(no_gpu: bool, criu: list[str]) -> dict[str, object]:  # noqa: PLR0915 - one probe, in order
    import shutil

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    rows: dict[str, object] = {}
    drv: Driver | NoGpu = NoGpu() if no_gpu else Driver()
    rows["driver_version"] = drv.version
    args = [sys.executable, __file__, "child"] + (["--no-gpu"] if no_gpu else [])
    with open(WORK / "child.log", "wb") as log:
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd="/")
    end = time.monotonic() + 180
    while not (WORK / "ready").exists():
        if proc.poll() is not None or time.monotonic() > end:
            rows["child_failed"] = (WORK / "child.log").read_text()[-3000:]
            return rows
        time.sleep(0.05)
    ready = json.loads((WORK / "ready").read_text())
    pid = ready["pid"]
    rows["checksum_before"] = ready["checksum"]
    rows["gpu_mib_running"] = gpu_mib(pid)
    n = 0

    def timed(name: str, fn, *a):  # type: ignore[no-untyped-def]
        t = time.monotonic()
        rc = fn(*a)
        rows[f"{name}_s"] = round(time.monotonic() - t, 4)
        rows[f"{name}_rc"] = rc
        return rc

    # 1. GPU round trip alone
    timed("gpu1_lock", drv.lock, pid)
    timed("gpu1_checkpoint", drv.checkpoint, pid)
    rows["gpu1_state_checkpointed"] = drv.state(pid)
    rows["gpu_mib_checkpointed"] = gpu_mib(pid)
    timed("gpu1_restore", drv.restore, pid)
    timed("gpu1_unlock", drv.unlock, pid)
    n += 1
    rows["checksum_after_gpu_roundtrip"] = ask(n, pid)
    # 2. GPU checkpoint + CRIU dump (kills the tree), criu restore, GPU restore
    img = WORK / "img"
    img.mkdir()
    timed("gpu2_lock", drv.lock, pid)
    timed("gpu2_checkpoint", drv.checkpoint, pid)
    t = time.monotonic()
    dump = subprocess.run(
        [*criu, "dump", "-t", str(pid), "-D", str(img), "-v4", "-o", "dump.log"],
        capture_output=True,
        text=True,
        check=False,
    )
    rows["criu_dump_s"] = round(time.monotonic() - t, 3)
    rows["criu_dump_rc"] = dump.returncode
    rows["image_bytes"] = sum(p.stat().st_size for p in img.iterdir() if p.is_file())
    if dump.returncode != 0:
        rows["criu_dump_log_tail"] = (
            (img / "dump.log").read_text(errors="replace")[-4000:] if (img / "dump.log").exists() else dump.stderr
        )
        drv.restore(pid)
        drv.unlock(pid)
        os.kill(pid, signal.SIGUSR2)
        return rows
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    t = time.monotonic()
    rest = subprocess.run(
        [*criu, "restore", "-D", str(img), "-d", "-v4", "-o", "restore.log"],
        capture_output=True,
        text=True,
        check=False,
    )
    rows["criu_restore_s"] = round(time.monotonic() - t, 3)
    rows["criu_restore_rc"] = rest.returncode
    if rest.returncode != 0:
        rows["criu_restore_log_tail"] = (img / "restore.log").read_text(errors="replace")[-4000:]
        return rows
    rows["gpu2_state_after_criu_restore"] = drv.state(pid)
    timed("gpu2_restore", drv.restore, pid)
    timed("gpu2_unlock", drv.unlock, pid)
    rows["gpu_mib_restored"] = gpu_mib(pid)
    n += 1
    rows["checksum_after_criu_roundtrip"] = ask(n, pid)
    os.kill(pid, signal.SIGUSR2)
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child("--no-gpu" in sys.argv)
    else:
        no_gpu = "--no-gpu" in sys.argv
        criu = os.environ.get("CRIU", "criu").split()
        result = parent(no_gpu, criu)
        print(json.dumps(result, indent=1))
        out = os.environ.get("OUT")
        if out:
            Path(out, "roundtrip.json").write_text(json.dumps(result, indent=1))
