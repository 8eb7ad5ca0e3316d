"""The stand-in's own settings, read from FAKE_VLLM_* environment variables (pure parsing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

GIB: Final = 1 << 30

# An H200 as NVML reports it; the real boot timings in FACTS.md were measured on one.
H200_MEMORY_BYTES: Final = 150754820096

# The real measurements: a cold boot of the measured model took 116.2 s to /health 200.
REAL_COLD_BOOT_SECONDS: Final = 116.2
DEFAULT_COLD_BOOT_SECONDS: Final = 3.0

FAILURE_MODES: Final = (
    "oom_load",
    "no_kv_memory",
    "max_len_too_large",
    "engine_dead",
    "engine_hung",
    "hang",
    "model_not_found",
    "model_gated",
)


class KnobError(ValueError):
    """A FAKE_VLLM_* variable holds a value the stand-in cannot use."""


@dataclass(frozen=True)
class Knobs:
    """Everything the stand-in takes from its environment besides vLLM's own variables."""

    time_scale: float | None
    boot_seconds: float | None
    gpu_memory_bytes: int
    gpu_used_bytes: int
    gpu_name: str
    model_bytes: int
    model_max_len: int
    kv_bytes_per_token: int
    kv_jitter_bytes: int
    crash_after_seconds: float | None
    crash_exit_code: int
    fail: str | None
    fail_after_seconds: float
    watchdog_seconds: float
    require_model: bool
    require_gpu: bool
    stats_interval_seconds: float | None
    kv_usage_percent: float
    preemptions_per_interval: int
    dev_dir: str
    trace_file: str | None = None
    """FAKE_VLLM_TRACE_FILE: append `monotonic wall stream line` for every record written (benchmarks)."""
    token_seconds: float = 0.0
    """FAKE_VLLM_TOKEN_SECONDS: stream one token per event this far apart (0: the whole text in one event)."""
    sleep_seconds: float = 0.22
    """FAKE_VLLM_SLEEP_SECONDS: how long /sleep takes (measured: 0.22 s at level 1 on the H200, FACTS.md)."""
    wake_seconds: float = 0.2
    """FAKE_VLLM_WAKE_SECONDS: how long /wake_up takes (measured: 0.19-0.21 s)."""
    reload_seconds: float = 0.5
    """FAKE_VLLM_RELOAD_SECONDS: collective_rpc reload_weights after a level-2 sleep (staged wake: 0.74 s in all)."""
    shutdown_seconds: float = 0.0
    first_request_seconds: float = 0.0
    """FAKE_VLLM_FIRST_REQUEST_SECONDS: the first completion waits this long and logs vLLM's JIT warning
    (real vLLM 0.26 compiles kernel_unified_attention at its first request: 0.7 s on the H200)."""
    """FAKE_VLLM_SHUTDOWN_SECONDS: how long the engine's teardown takes after SIGTERM (HTTP already closed)."""
    nvml_dir: str | None = None
    """FAKE_VLLM_NVML_DIR: keep this process's GPU memory there as NVML would list it (nvml_record.py)."""
    sleep_keeps_memory: bool = False
    """FAKE_VLLM_SLEEP_KEEPS_MEMORY: /sleep answers and /is_sleeping says true, but the memory stays held
    (vllm issue 32714: a sleep freeing a fraction of it)."""
    wake_tokens_differ: bool = False
    """FAKE_VLLM_WAKE_TOKENS_DIFFER: after any wake, completions answer other token ids (vllm issue 29341)."""
    tokens_differ_file: str | None = None
    """FAKE_VLLM_TOKENS_DIFFER_FILE: while this file exists, completions answer other token ids (each one
    higher): a test makes a restored server answer other ids than the captured ones, at any moment."""
    gpu_checkpoint_fail: int = 0
    """FAKE_VLLM_GPU_CHECKPOINT_FAIL: the engine core's GPU checkpoint answers this CUresult (1/true: 801,
    CUDA_ERROR_NOT_SUPPORTED, as for a process with CUDA IPC or UVM memory); 0 succeeds (engine_core.py)."""
    shm_dir: str = "/dev/shm"
    """FAKE_VLLM_SHM_DIR: where the API server and the engine core share their segment (vLLM's shm queue)."""


def _number(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise KnobError(f"{name}={raw!r} must not be negative")
    return value


def _integer(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise KnobError(f"{name}={raw!r} must not be negative")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


CUDA_ERROR_NOT_SUPPORTED: Final = 801


def _cuda_error(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return 0
    if raw in ("1", "true", "yes", "on"):
        return CUDA_ERROR_NOT_SUPPORTED
    try:
        value = int(raw)
    except ValueError:
        raise KnobError(f"{name}={raw!r} is not a CUresult number or 1") from None
    if not 0 < value < 10000:
        raise KnobError(f"{name}={raw!r} is not a CUresult error code")
    return value


def parse_knobs(env: Mapping[str, str]) -> Knobs:
    """Read the FAKE_VLLM_* variables; raise KnobError naming the variable on a bad value."""
    fail = env.get("FAKE_VLLM_FAIL", "").strip() or None
    if fail is not None and fail not in FAILURE_MODES:
        raise KnobError(f"FAKE_VLLM_FAIL={fail!r} is not one of {', '.join(FAILURE_MODES)}")
    gpu_memory = _integer(env, "FAKE_VLLM_GPU_MEMORY_BYTES", H200_MEMORY_BYTES)
    if gpu_memory == 0:
        raise KnobError("FAKE_VLLM_GPU_MEMORY_BYTES must be positive")
    kv_bytes_per_token = _integer(env, "FAKE_VLLM_KV_BYTES_PER_TOKEN", 16384)
    if kv_bytes_per_token == 0:
        raise KnobError("FAKE_VLLM_KV_BYTES_PER_TOKEN must be positive")
    return Knobs(
        time_scale=_number(env, "FAKE_VLLM_TIME_SCALE", None),
        boot_seconds=_number(env, "FAKE_VLLM_BOOT_SECONDS", None),
        gpu_memory_bytes=gpu_memory,
        gpu_used_bytes=_integer(env, "FAKE_VLLM_GPU_USED_BYTES", 0),
        gpu_name=env.get("FAKE_VLLM_GPU_NAME", "").strip() or "NVIDIA H200",
        model_bytes=_integer(env, "FAKE_VLLM_MODEL_BYTES", 2 * GIB),
        model_max_len=_integer(env, "FAKE_VLLM_MODEL_MAX_LEN", 131072) or 131072,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_jitter_bytes=_integer(env, "FAKE_VLLM_KV_JITTER_BYTES", 0),
        crash_after_seconds=_number(env, "FAKE_VLLM_CRASH_AFTER_SECONDS", None),
        crash_exit_code=_integer(env, "FAKE_VLLM_CRASH_EXIT_CODE", 1) or 1,
        fail=fail,
        fail_after_seconds=_number(env, "FAKE_VLLM_FAIL_AFTER_SECONDS", 1.0) or 0.0,
        watchdog_seconds=_number(env, "FAKE_VLLM_WATCHDOG_SECONDS", 5.0) or 0.0,
        require_model=_flag(env, "FAKE_VLLM_REQUIRE_MODEL"),
        require_gpu=_flag(env, "FAKE_VLLM_REQUIRE_GPU"),
        stats_interval_seconds=_number(env, "FAKE_VLLM_STATS_INTERVAL_SECONDS", None),
        kv_usage_percent=_number(env, "FAKE_VLLM_KV_USAGE", 0.0) or 0.0,
        preemptions_per_interval=_integer(env, "FAKE_VLLM_PREEMPTIONS_PER_INTERVAL", 0),
        dev_dir=env.get("FAKE_VLLM_DEV_DIR", "").strip() or "/dev",
        trace_file=env.get("FAKE_VLLM_TRACE_FILE", "").strip() or None,
        token_seconds=_number(env, "FAKE_VLLM_TOKEN_SECONDS", 0.0) or 0.0,
        first_request_seconds=_number(env, "FAKE_VLLM_FIRST_REQUEST_SECONDS", 0.0) or 0.0,
        sleep_seconds=_number(env, "FAKE_VLLM_SLEEP_SECONDS", 0.22) or 0.0,
        wake_seconds=_number(env, "FAKE_VLLM_WAKE_SECONDS", 0.2) or 0.0,
        reload_seconds=_number(env, "FAKE_VLLM_RELOAD_SECONDS", 0.5) or 0.0,
        shutdown_seconds=_number(env, "FAKE_VLLM_SHUTDOWN_SECONDS", 0.0) or 0.0,
        nvml_dir=env.get("FAKE_VLLM_NVML_DIR", "").strip() or None,
        sleep_keeps_memory=_flag(env, "FAKE_VLLM_SLEEP_KEEPS_MEMORY"),
        wake_tokens_differ=_flag(env, "FAKE_VLLM_WAKE_TOKENS_DIFFER"),
        tokens_differ_file=env.get("FAKE_VLLM_TOKENS_DIFFER_FILE", "").strip() or None,
        gpu_checkpoint_fail=_cuda_error(env, "FAKE_VLLM_GPU_CHECKPOINT_FAIL"),
        shm_dir=env.get("FAKE_VLLM_SHM_DIR", "").strip() or "/dev/shm",
    )
