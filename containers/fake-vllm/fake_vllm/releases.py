"""What the stand-in's release (FAKE_VLLM_VERSION) changes at the HTTP boundary, read from the wheels (pure).

- 0.29+: `--max-num-queued-reqs` refuses a request beyond the limit with 503 (vllm/v1/engine/async_llm.py
  check_admission counts every unfinished request, waiting or running; vllm/exceptions.py QueueOverflowError).
- 0.32+: `/sleep` takes level 0-2 (0 pauses only) and answers `{"status": "sleeping", "level": n}`; `/wake_up`
  answers `{"status": "awake"|"sleeping", "tags": ...}` (vllm/entrypoints/serve/dev/sleep/api_router.py);
  `vllm:sleep_mode_operation_duration_seconds{operation}` and `vllm:sleep_mode_operations_in_flight`
  (.../dev/sleep/metrics.py); `vllm:admission_rejections{reason}` (vllm/v1/metrics/loggers.py).
  Before: an empty 200, and only levels 1 and 2 mean anything.
- 0.34+: `POST /checkpoint/prepare`, `POST /checkpoint/restore`, `GET /checkpoint/status` whenever
  `--enable-sleep-mode` is set, without dev mode (vllm/entrypoints/serve/checkpoint/api_router.py; the engine's
  side in vllm/v1/engine/core.py `checkpoint_prepare`/`checkpoint_restore`): prepare (`?mode=wait|abort|keep`)
  pauses new requests and releases the KV cache (the weights stay), refused with 400 on an engine asleep or
  failed; restore brings the KV cache back and serves; a prepared engine refuses `/sleep` and `/wake_up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from . import VLLM_VERSION


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


RELEASE: Final = release(VLLM_VERSION)
ADMISSION: Final = RELEASE >= (0, 29)
JSON_SLEEP: Final = RELEASE >= (0, 32)
SLEEP_METRICS: Final = RELEASE >= (0, 32)
CHECKPOINT: Final = RELEASE >= (0, 34)
DOWNLOAD_KERNELS: Final = RELEASE >= (0, 32)
SLEEP_LEVELS: Final = ("0", "1", "2") if JSON_SLEEP else ("1", "2")

SLEEP_BUCKETS: Final = (0.01, 0.1, 1, 10, 30, 60, 120, 300, 600)
OPERATIONS: Final = ("sleep", "release_kv_cache_memory", "wake")
ADMISSION_REASONS: Final = ("max_num_queued_reqs", "max_num_queued_tokens")
QUEUE_FULL_MESSAGE: Final = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance."
)


@dataclass
class ReleaseState:
    """The counters of the newer releases' routes and metrics; every access holds `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    unfinished: int = 0
    """Requests admitted and not yet answered (vLLM's get_num_unfinished_requests)."""
    rejections: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ADMISSION_REASONS, 0))
    durations: dict[str, list[float]] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPERATIONS, 0))
    checkpoint: str = "running"
    """vllm/v1/engine CheckpointState: running, preparing, prepared, restoring, failed."""

    def admit(self, limit: int | None) -> bool:
        """One more unfinished request, unless the limit is reached (then a rejection is counted)."""
        with self.lock:
            if limit is not None and self.unfinished + 1 > limit:
                self.rejections["max_num_queued_reqs"] += 1
                return False
            self.unfinished += 1
            return True

    def finish(self) -> None:
        with self.lock:
            self.unfinished -= 1

    def checkpoint_route(self, route: str, *, asleep: bool = False, mode: str = "wait") -> tuple[int, bytes]:
        """0.34's checkpoint routes as api_router.py answers them: prepare drains and releases (here at once:
        the gateway holds requests), restore serves again; each repeated is a no-op."""
        with self.lock:
            state = self.checkpoint
            if route == "prepare":
                if mode not in PAUSE_MODES:
                    return 422, b'{"detail": [{"type": "literal_error", "loc": ["query", "mode"]}]}'
                if state == "running" and asleep:
                    return checkpoint_answer(state, False, 400, CHECKPOINT_ASLEEP)
                if state in ("restoring", "failed"):
                    return checkpoint_answer(state, False, 400)
                self.checkpoint = "prepared"
            elif route == "restore":
                if state in ("preparing", "failed"):
                    return checkpoint_answer(state, False, 400)
                self.checkpoint = "running"
            return checkpoint_answer(self.checkpoint, route == "status")

    def checkpoint_refusal(self, action: str) -> str | None:
        """A prepared (or preparing, failed) engine refuses a sleep and a wake (core.py sleep, wake_up)."""
        with self.lock:
            state = self.checkpoint
        if state == "running" or (action == "wake up" and state == "restoring"):
            return None
        return f"Cannot {action} while the checkpoint state is {state}"

    @contextlib.contextmanager
    def operation(self, name: str) -> Iterator[None]:
        """One sleep-mode operation: in flight meanwhile, then its duration observed (sleep_mode_operation_metrics)."""
        started = time.monotonic()
        with self.lock:
            self.in_flight[name] += 1
        try:
            yield
        finally:
            with self.lock:
                self.in_flight[name] -= 1
                self.durations.setdefault(name, []).append(time.monotonic() - started)


def sleep_answer(level: int) -> bytes:
    return b'{"status": "sleeping", "level": %d}' % level if JSON_SLEEP else b""


def wake_answer(fully_awake: bool, tags: list[str]) -> bytes:
    if not JSON_SLEEP:
        return b""
    shown = "null" if not tags else "[" + ", ".join(f'"{t}"' for t in tags) + "]"
    return b'{"status": "%s", "tags": %s}' % (b"awake" if fully_awake else b"sleeping", shown.encode())


PAUSE_MODES: Final = ("abort", "wait", "keep")
CHECKPOINT_ASLEEP: Final = "Preparing for a checkpoint requires an awake engine"


def checkpoint_answer(state: str, status_route: bool, code: int = 200, error: str | None = None) -> tuple[int, bytes]:
    """The route's HTTP status and body (CheckpointStateResponse, `error` left out when None): status answers
    200 only once prepared, 503 before, 500 after a failure."""
    if status_route:
        code = 200 if state == "prepared" else 500 if state == "failed" else 503
    body = {"state": state, **({"error": error} if error is not None else {})}
    return code, json.dumps(body).encode()


def metrics_lines(labels: str, state: ReleaseState) -> list[str]:
    """The 0.32+ families: sleep-mode operations and admission rejections."""
    if not SLEEP_METRICS:
        return []
    with state.lock:
        durations = {op: list(values) for op, values in state.durations.items()}
        in_flight = dict(state.in_flight)
        rejections = dict(state.rejections)
    lines = [
        "# HELP vllm:sleep_mode_operation_duration_seconds Duration of one sleep-mode operation.",
        "# TYPE vllm:sleep_mode_operation_duration_seconds histogram",
    ]
    name = "vllm:sleep_mode_operation_duration_seconds"
    for op, values in sorted(durations.items()):
        for bound in (*(str(float(b)) for b in SLEEP_BUCKETS), "+Inf"):
            count = sum(1 for v in values if bound == "+Inf" or v <= float(bound))
            lines.append(f'{name}_bucket{{le="{bound}",operation="{op}"}} {float(count)}')
        lines.append(f'{name}_count{{operation="{op}"}} {float(len(values))}')
        lines.append(f'{name}_sum{{operation="{op}"}} {sum(values)}')
    lines += [
        "# HELP vllm:sleep_mode_operations_in_flight Sleep-mode operations currently awaited.",
        "# TYPE vllm:sleep_mode_operations_in_flight gauge",
        *(f'vllm:sleep_mode_operations_in_flight{{operation="{op}"}} {float(n)}' for op, n in in_flight.items()),
        "# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.",
        "# TYPE vllm:admission_rejections_total counter",
        *(f'vllm:admission_rejections_total{{{labels},reason="{r}"}} {float(n)}' for r, n in rejections.items()),
    ]
    return lines


KERNEL_PACKAGES: Final = ("flashinfer_cubin", "flashinfer_jit_cache")


def download_kernels(env: Mapping[str, str], *, dry_run: bool = False) -> int:
    """`vllm download-kernels` (0.32+): vLLM runs `python -m flashinfer download-kernels`, which pip-installs
    flashinfer-cubin and flashinfer-jit-cache (to PIP_TARGET when set). FAKE_VLLM_NO_NETWORK=1 fails as pip
    does without an index."""
    target = env.get("PIP_TARGET") or "/usr/local/lib/python3/dist-packages"
    for name in KERNEL_PACKAGES:
        print(f"Command: {sys.executable} -m pip install --upgrade --no-deps {name.replace('_', '-')}", flush=True)
    if dry_run:
        print("Dry run requested; pip install was not executed.")
        return 0
    if env.get("FAKE_VLLM_NO_NETWORK", "").strip() not in ("", "0"):
        print("ERROR: Could not find a version that satisfies the requirement flashinfer-cubin", file=sys.stderr)
        print("Error: One or more kernel wheel installs failed", file=sys.stderr)
        return 1
    for name in KERNEL_PACKAGES:
        package = os.path.join(target, name)
        os.makedirs(package, exist_ok=True)
        with open(os.path.join(package, "__init__.py"), "w", encoding="ascii") as handle:
            handle.write("# stand-in kernels\n")
    print("flashinfer-cubin and flashinfer-jit-cache installed successfully.")
    return 0
