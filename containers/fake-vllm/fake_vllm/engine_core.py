"""vLLM's process shape: the API server and its engine-core child, joined by a unix socket.

The API server forks the engine core at the start of serving (vLLM spawns it early in the boot),
holds a multiprocessing lock made before that (a named POSIX semaphore: /dev/shm/sem.*, mapped under
the temporary name glibc's sem_open unlinked, as vLLM's), shares a /dev/shm segment with it (vLLM's shm message queue;
`FAKE_VLLM_SHM_DIR`), and forwards
each completion to it: the engine core answers the token ids. The engine core "holds the GPU": it
keeps the per-process GPU memory record (nvml_record.py), and answers the CUDA driver's checkpoint
actions the way a CUDA process does, asked per process by dankserve's stand-in GpuCheckpoint
(dankserve/snapshot/gpu_stand_in.py): a request file beside its record and SIGUSR2. Locked, its
"CUDA calls" (completions, memory changes) block until unlocked; checkpointed, it holds 0 bytes;
restored, its bytes come back. `FAKE_VLLM_GPU_CHECKPOINT_FAIL` makes the checkpoint answer a
CUresult error. A process restored by CRIU resumes here, already past its boot.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import signal
import socket
import threading
from pathlib import Path

from .nvml_record import record_path, remove_record, write_record
from .server import completion_token_ids

ACTION_SIGNAL = signal.SIGUSR2
REQUEST_BYTES = 4096
SHM_BYTES = 64 << 10
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
ENGINE_CORE_NAME = "VLLM::EngineCor"
_OK, _ILLEGAL_STATE, _INVALID_VALUE = 0, 401, 1


class _Core:
    """The engine core's GPU context (runs in the child)."""

    def __init__(self, nvml_dir: str | None, checkpoint_fail: int) -> None:
        self.nvml_dir = nvml_dir
        self.checkpoint_fail = checkpoint_fail
        self.cond = threading.Condition()
        self.state = "running"
        self.used = 0
        self.held = 0
        self.written = False
        self.answer: tuple[str, int] | None = None

    def write(self) -> None:
        extra: dict[str, object] = {"gpu_state": self.state}
        if self.answer is not None:
            extra.update(answered=self.answer[0], code=self.answer[1])
        write_record(self.nvml_dir, self.used, **extra)
        self.written = True

    def act(self, action: str) -> int:
        transitions = {
            "lock": ("running", "locked"),
            "checkpoint": ("locked", "checkpointed"),
            "restore": ("checkpointed", "locked"),
            "unlock": ("locked", "running"),
        }
        if action in ("state", "restore_thread_id"):
            return _OK
        if action not in transitions:
            return _INVALID_VALUE
        before, after = transitions[action]
        if self.state != before:
            return _ILLEGAL_STATE
        if action == "checkpoint":
            if self.checkpoint_fail:
                return self.checkpoint_fail  # the process stays locked, as the driver leaves it
            self.held, self.used = self.used, 0
        elif action == "restore":
            self.used, self.held = self.held, 0
        self.state = after
        return _OK

    def on_signal(self) -> None:
        """One request from the file beside the record; bounded and checked (anyone may have written it)."""
        if not self.nvml_dir:
            return
        path = record_path(self.nvml_dir).with_suffix(".request")
        try:
            with path.open("rb") as handle:
                request = json.loads(handle.read(REQUEST_BYTES))
        except (OSError, ValueError):
            return
        if not isinstance(request, dict):
            return
        ident, action = request.get("id"), request.get("action")
        if not isinstance(ident, str) or not isinstance(action, str) or len(ident) > 64:
            return
        with self.cond:
            if self.answer is not None and self.answer[0] == ident:
                return  # already answered (a signal repeated)
            self.answer = (ident, self.act(action))
            self.write()
            self.cond.notify_all()

    def serve_link(self, link: socket.socket) -> None:
        """The API server's requests, one JSON line each; the answers in order."""
        reader = link.makefile("rb")
        for line in reader:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            answer = self._handle(message if isinstance(message, dict) else {})
            link.sendall(json.dumps(answer).encode() + b"\n")
        os._exit(0)  # the API server is gone

    def _handle(self, message: dict[str, object]) -> dict[str, object]:
        op = message.get("op")
        if op == "stop":
            with self.cond:
                remove_record(self.nvml_dir)
            os._exit(0)
        with self.cond:
            self.cond.wait_for(lambda: self.state == "running")  # a locked process's CUDA calls block
            if op == "generate":
                tokens = message.get("tokens")
                count = tokens if isinstance(tokens, int) and tokens > 0 else 0
                return {"ids": completion_token_ids(count)}
            if op == "memory":
                used = message.get("bytes")
                self.used = used if isinstance(used, int) and used >= 0 else 0
                self.write()
        return {}


def _engine_main(link: socket.socket, parent: int, nvml_dir: str | None, checkpoint_fail: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the API server shuts it down
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # vLLM's own name for it (setproctitle "VLLM::EngineCore"; the kernel keeps 15 bytes): dankserve's
        # stand-in GpuCheckpoint signals only a process so named, never a stranger that reused a pid.
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(ENGINE_CORE_NAME.encode()), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)
    signal.pthread_sigmask(signal.SIG_BLOCK, {ACTION_SIGNAL})  # the thread below inherits the mask
    core = _Core(nvml_dir, checkpoint_fail)
    threading.Thread(target=core.serve_link, args=(link,), name="link", daemon=True).start()
    while True:
        signal.sigwait({ACTION_SIGNAL})
        core.on_signal()


class EngineLink:
    """The API server's side: the engine core's pid, the socket to it, the shared segment."""

    def __init__(self, nvml_dir: str | None) -> None:
        self.nvml_dir = nvml_dir
        self.pid: int | None = None
        self._link: socket.socket | None = None
        self._reader: object = None
        self._lock = threading.Lock()
        self._shm: Path | None = None
        self._map: mmap.mmap | None = None
        self._semaphore: str | None = None

    def start(
        self,
        *,
        checkpoint_fail: int,
        shm_dir: str,
        close_in_child: tuple[socket.socket, ...] = (),
    ) -> None:
        self._open_shm(shm_dir)
        self._open_semaphore()
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                parent_end.close()
                for sock in close_in_child:
                    sock.close()
                _engine_main(child_end, parent, self.nvml_dir, checkpoint_fail)
            finally:
                os._exit(1)
        child_end.close()
        self.pid, self._link = pid, parent_end
        self._reader = parent_end.makefile("rb")

    def _open_shm(self, shm_dir: str) -> None:
        """vLLM's shared-memory queue between the two: a segment both map (left behind by kill -9, as vLLM's)."""
        token = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]") if shm_dir else ""
        path = Path(shm_dir) / f"fake-vllm-{token}-{os.getpid()}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        except OSError:
            return
        try:
            os.ftruncate(fd, SHM_BYTES)
            self._map = mmap.mmap(fd, SHM_BYTES, mmap.MAP_SHARED)
            self._map[:16] = b"fake-vllm shm\n\0\0"
            self._shm = path
        except OSError:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)

    def _open_semaphore(self) -> None:
        """vLLM's API server holds multiprocessing locks made before it starts the engine core (spawn context:
        named POSIX semaphores). glibc's sem_open creates such a file under a temporary name, maps it, links it
        to its name and unlinks the temporary one: the process maps a deleted path of a file that still has a
        link. CRIU links it back as /dev/shm/link_remap.N for the restore (`--link-remap`) and deletes that
        after a `--leave-running` dump: a later restore of that image fails here as on real vLLM. Unlinked at
        a clean exit (multiprocessing's resource tracker does it for vLLM), left behind by kill -9."""
        token = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
        name = f"/fake-vllm-{token}-{os.getpid()}"
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.sem_open.restype = ctypes.c_void_p
            libc.sem_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_uint]
            libc.sem_unlink(name.encode())  # one a killed server of a reused namespace left: made anew
            handle = libc.sem_open(name.encode(), os.O_CREAT | os.O_EXCL, 0o600, 1)
            if handle not in (None, 0, ctypes.c_void_p(-1).value):  # SEM_FAILED is (sem_t *) -1
                self._semaphore = name

    def _call(self, message: dict[str, object]) -> dict[str, object] | None:
        """One request and its answer; None when the engine core is gone."""
        if self._link is None:
            return None
        with self._lock:
            try:
                self._link.sendall(json.dumps(message).encode() + b"\n")
                line = self._reader.readline()  # type: ignore[attr-defined]
            except OSError:
                return None
        if not line:
            return None
        answer = json.loads(line)
        return answer if isinstance(answer, dict) else None

    def generate(self, tokens: int) -> list[int] | None:
        """The engine core's token ids for a completion; None when it is gone (the engine is dead)."""
        if self._link is None:
            return completion_token_ids(tokens)
        answer = self._call({"op": "generate", "tokens": tokens})
        ids = answer.get("ids") if answer is not None else None
        return [int(i) for i in ids] if isinstance(ids, list) else None

    def memory(self, used_bytes: int) -> None:
        """The GPU memory the engine holds now (its record, as NVML would list it)."""
        if self._link is None:
            write_record(self.nvml_dir, used_bytes)
            return
        self._call({"op": "memory", "bytes": int(used_bytes)})

    def stop(self) -> None:
        """The engine core's teardown: its GPU memory freed (the record removed), the segment unlinked."""
        if self._link is None:
            remove_record(self.nvml_dir)
        else:
            self._call({"op": "stop"})
            with contextlib.suppress(ChildProcessError, OSError):
                if self.pid is not None:
                    os.waitpid(self.pid, 0)
            self._link.close()
            self._link = None
        self.close_shm()

    def close_shm(self) -> None:
        if self._semaphore is not None:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL(None, use_errno=True).sem_unlink(self._semaphore.encode())
            self._semaphore = None
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._shm is not None:
            self._shm.unlink(missing_ok=True)
            self._shm = None
