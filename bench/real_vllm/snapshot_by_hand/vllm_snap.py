"""Issue 44 items 2-3 by hand on the GPU machine: real vLLM as a process, captured once (sleep level 1,
CUDA lock + checkpoint of every process of its tree, `criu dump --leave-running`, restore + unlock, wake),
then restored after kill -9 and after a stop, each timed to the first streamed token with its breakdown,
the greedy text compared. Also the cold boot and the manual best (every cache warm). Rows as JSON lines.

VLLM_CMD: the server command before `serve` (default: python3 -m vllm.entrypoints.cli.main);
`--no-gpu` rehearses on the stand-in (no CUDA calls)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
import contextlib

from roundtrip import Driver, NoGpu, gpu_mib  # type: ignore[import-not-found]

PROMPT = "The capital of France is"
OUT = Path(os.environ.get("OUT", "/tmp/out"))


def row(**kw: object) -> None:
    print(json.dumps(kw), flush=True)
    with open(OUT / "results.jsonl", "a") as f:
        f.write(json.dumps(kw) + "\n")


def tree(root: int) -> list[int]:
    """root and every descendant (from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(sorted(children.get(p, [])))
    return out


class Server:
    def __init__(self, model: str, port: int, log: Path, extra: list[str]) -> None:
        self.model, self.port, self.log, self.extra = model, port, log, extra
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.root = 0

    def start(self) -> None:
        cmd = os.environ.get("VLLM_CMD", f"{sys.executable} -m vllm.entrypoints.cli.main").split()
        args = [
            *cmd,
            "serve",
            self.model,
            "--port",
            str(self.port),
            "--served-model-name",
            "m",
            "--enable-sleep-mode",
            *self.extra,
        ]
        env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", UV_USE_IO_URING="0", TORCHINDUCTOR_COMPILE_THREADS="1")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env, cwd="/"
            )
        self.root = self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the tree, then wait until every pid of it is gone from /proc (a zombie leader still holds its
        pid while its threads leave the driver: CRIU restores onto the same pids)."""
        pids = tree(self.root)
        for p in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        end = time.monotonic() + 90
        while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < end:
            reap()
            time.sleep(0.01)

    def first_token(self, deadline: float = 900) -> tuple[float, str]:
        """Poll until a streamed completion gives its first token; returns (time of that token, greedy text)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                with httpx.Client(timeout=httpx.Timeout(60, connect=0.5), headers={"Connection": "close"}) as c:
                    body = {
                        "model": "m",
                        "prompt": PROMPT,
                        "max_tokens": 16,
                        "temperature": 0,
                        "stream": True,
                        "return_token_ids": True,
                    }
                    with c.stream("POST", self.base + "/v1/completions", json=body) as r:
                        if r.status_code != 200:
                            time.sleep(0.05)
                            continue
                        first = 0.0
                        text = ""
                        for line in r.iter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                chunk = json.loads(line[6:])
                                if not first:
                                    first = time.monotonic()
                                choice = chunk["choices"][0]
                                text += choice.get("text", "")
                                ids = choice.get("token_ids") or []
                                text += "".join(f"<{i}>" for i in ids) if ids else ""
                        return first, text
            except (httpx.HTTPError, OSError):
                time.sleep(0.05)
        raise RuntimeError("no first token before the deadline")

    def post(self, path: str) -> float:
        t = time.monotonic()
        with httpx.Client(timeout=300, headers={"Connection": "close"}) as c:
            r = c.post(self.base + path)
            r.raise_for_status()
        return time.monotonic() - t


def reap() -> bool:
    """Reap every ended child (restored trees are reparented to us: we are their subreaper); False, to chain."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return False


def subreaper() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of restored trees come to us


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def gpu_pids(drv: Driver | NoGpu, pids: list[int]) -> list[int]:
    found = []
    for p in pids:
        rc, state = drv.state(p)
        if rc == 0 and (state >= 0 or isinstance(drv, NoGpu)):
            found.append(p)
    return found if not isinstance(drv, NoGpu) else pids[-1:]


def capture(srv: Server, drv: Driver | NoGpu, criu: list[str], img: Path, level: int) -> dict[str, object]:
    b: dict[str, object] = {}
    t0 = time.monotonic()
    b["sleep_s"] = round(srv.post(f"/sleep?level={level}"), 3)
    pids = tree(srv.root)
    gp = gpu_pids(drv, pids)
    b["tree"] = len(pids)
    b["gpu_pids"] = len(gp)
    gpu_suspend(drv, gp, b)
    b["gpu_mib_checkpointed"] = [gpu_mib(p) for p in gp]
    shutil.rmtree(img, ignore_errors=True)
    img.mkdir(parents=True)
    shared = shm_files(pids)
    leave = ["--leave-running"] if os.environ.get("LEAVE_RUNNING") == "1" else []
    dumped = run_criu(criu, ["dump", "-t", str(srv.root), *leave], img, "dump", b)
    b["image_bytes"] = sum(f.stat().st_size for f in img.rglob("*") if f.is_file())
    b["ok"] = dumped
    if leave or not dumped:
        gpu_resume(drv, gp, b)
        wake(srv, level, b)
    else:
        srv.kill()  # CRIU ended the tree at the dump; wait until its pids are gone
        b["shm_kept"] = keep_shm(img, shared)
        back = restore(srv, drv, criu, img, t0)  # serve again from the image: the snapshot proves itself
        b["restore"] = back
        b["ok"] = "seconds" in back
    b["outage_s"] = round(time.monotonic() - t0, 3)
    return b


SHM = Path("/dev/shm")
"""Where vLLM keeps shared files (segments, POSIX semaphores) and CRIU's --link-remap leaves `link_remap.N`."""


def shm_files(pids: list[int]) -> set[str]:
    """The /dev/shm files the tree has open or mapped: CRIU saves their paths, not their bytes."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[5] if len(line.split(maxsplit=5)) == 6 else ""
                if path.startswith("/dev/shm/") and not path.endswith(" (deleted)"):
                    found.add(path)
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("/dev/shm/") and not target.endswith(" (deleted)"):
                        found.add(target)
    return found


def keep_shm(img: Path, names: set[str]) -> list[str]:
    """Copy the tree's /dev/shm files as they were at the dump, and CRIU's link_remap files (a restore consumes
    them; a clean stop deletes the segments; a restored server changes them): every restore gets them back."""
    kept = img / "shm"
    kept.mkdir(exist_ok=True)
    files = [Path(n) for n in names] + list(SHM.glob("link_remap.*"))
    for f in files:
        with contextlib.suppress(FileNotFoundError):
            shutil.copy2(f, kept / f.name)
    return sorted(f.name for f in kept.iterdir())


def put_back_shm(img: Path) -> None:
    for f in (img / "shm").glob("*"):
        shutil.copy2(f, SHM / f.name)


def gpu_used_mib() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            check=False,
            text=True,
            timeout=20,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"n/a ({exc})"


CRIU_OPTIONS = (
    "--tcp-established",
    "--link-remap",
    "--network-lock",
    "skip",
    "--ext-unix-sk",
    f"-v{os.environ.get('CRIU_V', '2')}",  # -v4 logs every VMA: seconds of a restore's time
)
"""What the H200 lease taught a vLLM tree needs (docs/hardware/h200x1-snapshot/README.md)."""


def run_criu(criu: list[str], action: list[str], img: Path, name: str, b: dict[str, object]) -> bool:
    """`criu ACTION -D IMG` with CRIU_OPTIONS, timed into b[criu_NAME_s]; its log's tail in b on failure."""
    t = time.monotonic()
    done = subprocess.run(
        [*criu, *action, "-D", str(img), *CRIU_OPTIONS, "-o", f"{name}.log"],
        capture_output=True,
        check=False,
        text=True,
    )
    b[f"criu_{name}_s"] = round(time.monotonic() - t, 3)
    if done.returncode:
        b[f"criu_{name}_error"] = (img / f"{name}.log").read_text(errors="replace")[-3000:]
    return done.returncode == 0


def gpu_suspend(drv: Driver | NoGpu, pids: list[int], b: dict[str, object], key: str = "gpu_checkpoint_s") -> None:
    """CUDA lock then checkpoint of every process holding a context, timed into b[key]."""
    t = time.monotonic()
    for p in pids:
        rc = drv.lock(p, 20000)
        if rc:
            raise RuntimeError(f"lock {p}: {rc}")
    for p in pids:
        rc = drv.checkpoint(p)
        if rc:
            raise RuntimeError(f"checkpoint {p}: {rc}")
    b[key] = round(time.monotonic() - t, 3)


def gpu_resume(drv: Driver | NoGpu, pids: list[int], b: dict[str, object]) -> None:
    """CUDA restore then unlock of every checkpointed process, timed into b[gpu_restore_s]."""
    t = time.monotonic()
    for p in pids:
        rc = drv.restore(p)
        if rc:
            b[f"gpu_restore_rc_{p}"] = rc
    for p in pids:
        drv.unlock(p)
    b["gpu_restore_s"] = round(time.monotonic() - t, 3)


def wake(srv: Server, level: int, b: dict[str, object]) -> None:
    """Level 1: one wake. Level 2 (vLLM 0.26): weights, reload_weights, kv_cache, prefix cache reset."""
    t = time.monotonic()
    if level == 1:
        srv.post("/wake_up")
    else:
        srv.post("/wake_up?tags=weights")
        with httpx.Client(timeout=300, headers={"Connection": "close"}) as c:
            c.post(srv.base + "/collective_rpc", json={"method": "reload_weights"}).raise_for_status()
        srv.post("/wake_up?tags=kv_cache")
        srv.post("/reset_prefix_cache")
    b["wake_s"] = round(time.monotonic() - t, 3)


def restore(srv: Server, drv: Driver | NoGpu, criu: list[str], img: Path, t0: float) -> dict[str, object]:
    b: dict[str, object] = {}
    put_back_shm(img)
    if not run_criu(criu, ["restore", "-d"], img, "restore", b):
        return b
    pids = tree(srv.root)
    gpu_resume(drv, gpu_pids(drv, pids), b)
    wake(srv, int(os.environ.get("SNAP_LEVEL", "1")), b)
    t = time.monotonic()
    first, text = srv.first_token(120)
    b["canary_first_token_s"] = round(first - t, 3)
    b["seconds"] = round(first - t0, 3)
    b["text"] = text
    return b


def main() -> None:
    no_gpu = "--no-gpu" in sys.argv
    subreaper()
    args = [a for a in sys.argv[1:] if a != "--no-gpu"]
    model, label, port = args[0], args[1], int(args[2])
    level = int(os.environ.get("SNAP_LEVEL", "1"))
    repeats = int(os.environ.get("REPEATS", "3"))
    extra = os.environ.get("SERVE_ARGS", "").split()
    OUT.mkdir(parents=True, exist_ok=True)
    criu = os.environ.get("CRIU", "criu").split()
    img = Path(os.environ.get("SNAP_DIR", "/dev/shm/snap")) / label
    drv: Driver | NoGpu = NoGpu() if no_gpu else Driver()
    srv = Server(model, port, OUT / f"{label}-server.log", extra)
    if os.environ.get("SKIP_COLD") != "1":
        t0 = time.monotonic()
        srv.start()
        first, greedy = srv.first_token()
        row(kind="cold", model=label, runtime="process", seconds=round(first - t0, 3), text=greedy)
        srv.kill()
    else:
        greedy = None
    # manual best: every cache warm, a plain boot
    t0 = time.monotonic()
    srv.start()
    first, text = srv.first_token()
    row(
        kind="manual-best",
        model=label,
        runtime="process",
        seconds=round(first - t0, 3),
        same_text=text == greedy,
        text=text,
    )
    greedy = text
    for level in [int(x) for x in os.environ.get("LEVELS", "2").split()]:
        os.environ["SNAP_LEVEL"] = str(level)
        b = capture(srv, drv, criu, img, level)
        row(kind="capture", model=label, runtime="process", seconds=b["outage_s"], level=level, breakdown=b)
        if not b["ok"]:
            srv.kill()
            return
        for kind, sig in (("restore-kill", signal.SIGKILL), ("restore-down-up", signal.SIGTERM)):
            for i in range(repeats):
                t0 = time.monotonic()
                srv.kill(sig)
                stopped = round(time.monotonic() - t0, 3)
                r = restore(srv, drv, criu, img, t0)
                r["stop_s"] = stopped
                same = r.get("text") == greedy
                row(
                    kind=kind,
                    model=label,
                    runtime="process",
                    seconds=r.get("seconds"),
                    level=level,
                    n=i + 1,
                    breakdown=r,
                    same_text=same,
                )
                if "seconds" not in r:
                    return
    srv.kill(signal.SIGTERM)
    row(kind="down", model=label, gpu_used_mib_after=gpu_used_mib())


if __name__ == "__main__":
    main()
