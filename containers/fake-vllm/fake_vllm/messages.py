"""Every vLLM log message the stand-in prints: format string, level, source file and line.

Read from the vLLM 0.33.0 wheel (paths under vllm/). `info_once` calls log the caller's line
(stacklevel=3), so the line is that of the `logger.info_once(` call. Messages logged by the
engine's workers carry `(EngineCore pid=N)` with one GPU and `(Worker_TP<r> pid=N)` with more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from .logfmt import Origin

Process = Literal["main", "api", "engine", "worker"]


@dataclass(frozen=True)
class Message:
    """A vLLM log call: who logs it, at which level, from where, with which format string."""

    process: Process
    level: str
    origin: Origin
    format: str
    every_rank: bool = False  # plain logger.info in a worker: each rank prints it (info_once: rank 0)


def _m(process: Process, level: str, file: str, line: int, fmt: str, *, every_rank: bool = False) -> Message:
    return Message(process, level, Origin(file, line), fmt, every_rank)


# vllm/utils/argparse_utils.py, before the process name is set
MODEL_FLAG_WARNING: Final = _m(
    "main",
    "WARNING",
    "argparse_utils.py",
    330,
    "With `vllm serve`, you should provide the model as a positional argument or in a config file "
    "instead of via the `--model` option. The `--model` option will be removed in a future version.",
)

# vllm/entrypoints/common/startup.py (called from launcher.setup_server)
# vllm/v1/.../jit_monitor.py (0.26.0), as the H200 logs show it: a kernel compiled at the first request it runs.
JIT_DURING_INFERENCE: Final = _m(
    "engine",
    "WARNING",
    "jit_monitor.py",
    135,
    "Triton kernel JIT compilation during inference: %s. This causes a latency spike; "
    "consider extending warmup to cover this shape/config.",
)
VERSION_PLAIN: Final = _m("api", "INFO", "startup.py", 38, "vLLM server version %s, serving model %s")
VERSION_LOGO: Final = _m(
    "api",
    "INFO",
    "startup.py",
    38,
    "\n       ${w}█     █     █▄   ▄█${r}\n"
    " ${o}▄▄${r} ${b}▄█${r} ${w}█     █     █ ▀▄▀ █${r}  version ${w}%s${r}\n"
    "  ${o}█${r}${b}▄█▀${r} ${w}█     █     █     █${r}  model   ${w}%s${r}\n"
    "   ${b}▀▀${r}  ${w}▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀${r}\n",
)
NON_DEFAULT_ARGS: Final = _m("api", "INFO", "startup.py", 96, "non-default args: %s")

# vllm/config/model.py, vllm/config/scheduler.py (API server builds the engine config)
RESOLVED_ARCHITECTURE: Final = _m("api", "INFO", "model.py", 744, "Resolved architecture: %s")
USING_MAX_MODEL_LEN: Final = _m("api", "INFO", "model.py", 2170, "Using max model len %s")
CHUNKED_PREFILL: Final = _m(
    "api", "INFO", "scheduler.py", 310, "Chunked prefill is enabled with max_num_batched_tokens=%d."
)

# vllm/v1/engine/core.py
ENGINE_INIT: Final = _m("engine", "INFO", "core.py", 139, "Initializing a V1 LLM engine (v%s) with config: %s")
INIT_ENGINE_WITH_COMPILE: Final = _m(
    "engine",
    "INFO",
    "core.py",
    405,
    "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
)
INIT_ENGINE: Final = _m(
    "engine", "INFO", "core.py", 412, "init engine (profile, create kv cache, warmup model) took %.2f s"
)
ENGINE_FAILED_TO_START: Final = _m("engine", "ERROR", "core.py", 1584, "EngineCore failed to start.")
ENGINE_FATAL_ERROR: Final = _m("engine", "ERROR", "core.py", 1586, "EngineCore encountered a fatal error.")
ENGINE_EXITING_BUSY_LOOP: Final = _m("engine", "INFO", "core.py", 1573, "[shutdown] EngineCore: exiting busy loop")

# vllm/distributed/parallel_state.py
RANK_ASSIGNMENT: Final = _m(
    "worker",
    "INFO",
    "parallel_state.py",
    2385,
    "rank %s in world size %s is assigned as DP rank %s, PP rank %s, PCP rank %s, "
    "TP rank %s, ETP rank %s, EP rank %s, EPLB rank %s",
)

# vllm/v1/worker/gpu_model_runner.py
STARTING_TO_LOAD: Final = _m("worker", "INFO", "gpu_model_runner.py", 4978, "Starting to load model %s...")
FAILED_TO_LOAD: Final = _m(
    "worker",
    "ERROR",
    "gpu_model_runner.py",
    5086,
    "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization to free memory "
    "for weights, increasing --tensor-parallel-size, or using --quantization. See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. (original error: %s)",
    every_rank=True,
)
MODEL_LOADING_TOOK: Final = _m(
    "worker", "INFO", "gpu_model_runner.py", 5088, "Model loading took %s GiB memory and %.6f seconds"
)
GRAPH_CAPTURING_FINISHED: Final = _m(
    "worker", "INFO", "gpu_model_runner.py", 6516, "Graph capturing finished in %.0f secs, took %.2f GiB"
)

# vllm/platforms/cuda.py
ATTENTION_BACKEND: Final = _m(
    "worker", "INFO", "cuda.py", 508, "Using %s attention backend out of potential backends: %s."
)

# vllm/model_executor/model_loader/weight_utils.py, default_loader.py
CHECKPOINT_FILESYSTEM: Final = _m(
    "worker",
    "INFO",
    "weight_utils.py",
    1144,
    "Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. Available RAM: %.2f GiB.",
)
LOADING_WEIGHTS_TOOK: Final = _m("worker", "INFO", "default_loader.py", 506, "Loading weights took %.2f seconds")
WEIGHTS_BAR: Final = "Loading safetensors checkpoint shards"

# vllm/compilation/monitor.py, backends.py, decorators.py
STARTING_TORCH_COMPILE: Final = _m("worker", "INFO", "monitor.py", 40, "%sStarting torch.compile", every_rank=True)
USING_CACHE_DIRECTORY: Final = _m(
    "worker", "INFO", "backends.py", 1125, "%sUsing cache directory: %s for vLLM's torch.compile", every_rank=True
)
DYNAMO_TRANSFORM_TIME: Final = _m(
    "worker", "INFO", "backends.py", 1187, "%sDynamo bytecode transform time: %.2f s", every_rank=True
)
CACHE_THE_GRAPH: Final = _m(
    "worker", "INFO", "backends.py", 401, "%sCache the graph of compile range %s for later use", every_rank=True
)
COMPILING_A_GRAPH: Final = _m(
    "worker", "INFO", "backends.py", 417, "%sCompiling a graph for compile range %s takes %.2f s", every_rank=True
)
DIRECTLY_LOAD_GRAPHS: Final = _m(
    "worker",
    "INFO",
    "backends.py",
    310,
    "%sDirectly load the compiled graph(s) for compile range %s from the cache, took %.3f s",
    every_rank=True,
)
DIRECTLY_LOAD_AOT: Final = _m(
    "worker", "INFO", "decorators.py", 326, "%sDirectly load AOT compilation from path %s", every_rank=True
)
TORCH_COMPILE_TOOK: Final = _m(
    "worker", "INFO", "monitor.py", 62, "%storch.compile took %.2f s in total", every_rank=True
)
SAVED_AOT: Final = _m("worker", "INFO", "decorators.py", 752, "%ssaved AOT compiled function to %s", every_rank=True)

# vllm/v1/worker/gpu_worker.py
KV_BYTES_RESERVED: Final = _m(
    "worker",
    "INFO",
    "gpu_worker.py",
    676,
    "Initial free memory %s GiB, reserved %s GiB memory for KV Cache as specified by kv_cache_memory_bytes "
    "config and skipped memory profiling. This does not respect the gpu_memory_utilization config. Only use "
    "kv_cache_memory_bytes config when you want manual control of KV cache memory size. If OOM'ed, check the "
    "difference of initial free memory between the current run and the previous run where "
    "kv_cache_memory_bytes is suggested and update it correspondingly.",
    every_rank=True,
)
AVAILABLE_KV_CACHE: Final = _m("worker", "INFO", "gpu_worker.py", 772, "Available KV cache memory: %s GiB")
CUDAGRAPH_PROFILING_ENABLED: Final = _m(
    "worker",
    "INFO",
    "gpu_worker.py",
    787,
    "CUDA graph memory profiling is enabled (default since v0.21.0). The current "
    "--gpu-memory-utilization=%.4f is equivalent to --gpu-memory-utilization=%.4f without CUDA graph "
    "memory profiling. To maintain the same effective KV cache size as before, increase "
    "--gpu-memory-utilization to %.4f. To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
    every_rank=True,
)
CUDAGRAPH_POOL_MEMORY: Final = _m(
    "worker",
    "INFO",
    "gpu_worker.py",
    1003,
    "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), difference: %s GiB (%.1f%%).",
    every_rank=True,
)
KV_CACHE_SUGGESTION: Final = _m(
    "worker",
    "INFO",
    "gpu_worker.py",
    1066,
    "Free memory on device (%s/%s GiB) on startup. Desired GPU memory utilization is (%s, %s GiB). "
    "Actual usage is %s GiB for consumed memory (weights + non-torch), %s GiB for peak activation, "
    "and %s GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
    "`--kv-cache-memory=%d` (%s GiB) to fit into requested memory, or `--kv-cache-memory=%d` "
    "(%s GiB) to fully utilize gpu memory. Current kv cache memory in use is %s GiB.",
    every_rank=True,
)

# vllm/v1/core/kv_cache_utils.py, kv_cache_planning.py
KV_CACHE_SIZE: Final = _m(
    "engine",
    "INFO",
    "kv_cache_utils.py",
    1147,
    "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx",
)
AUTO_FIT_FULL: Final = _m(
    "engine",
    "INFO",
    "kv_cache_planning.py",
    1395,
    "Auto-fit max_model_len: full model context length %d fits in available KV cache memory (%s)",
)
AUTO_FIT_REDUCED: Final = _m(
    "engine",
    "INFO",
    "kv_cache_planning.py",
    1404,
    "Auto-fit max_model_len: reduced from %d to %d to fit in available KV cache memory (%s)",
)

# vllm/entrypoints/launchers/api_server/entry.py, launcher.py
SUPPORTED_TASKS: Final = _m("api", "INFO", "entry.py", 135, "Supported tasks: %s")
STARTING_SERVER: Final = _m("api", "INFO", "entry.py", 139, "Starting vLLM server on %s")
AVAILABLE_ROUTES: Final = _m("api", "INFO", "launcher.py", 188, "Available routes are:")
ROUTE: Final = _m("api", "INFO", "launcher.py", 197, "Route: %s, Methods: %s")
SHUTDOWN_TRIGGERED: Final = _m("api", "INFO", "launcher.py", 256, "[shutdown] API server: shutdown triggered")
STOPPING_ENGINE_CLIENT: Final = _m(
    "api", "INFO", "launcher.py", 272, "[shutdown] API server: stopping engine client mode=%s timeout=%ss"
)
ENGINE_CLIENT_STOPPED: Final = _m("api", "INFO", "launcher.py", 281, "[shutdown] API server: engine client stopped")
SIGNALLING_HTTP_SHUTDOWN: Final = _m(
    "api", "INFO", "launcher.py", 284, "[shutdown] API server: signalling HTTP server shutdown"
)
SHUTTING_DOWN_HTTP: Final = _m(
    "api", "INFO", "launcher.py", 306, "[shutdown] API server: shutting down FastAPI HTTP server"
)

# vllm/v1/engine/core_client.py, async_llm.py (engine death seen from the API server)
ENGINE_CORE_EXITED: Final = _m(
    "api",
    "WARNING",
    "core_client.py",
    839,
    "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
)
OUTPUT_HANDLER_FAILED: Final = _m("api", "ERROR", "async_llm.py", 943, "AsyncLLM output_handler failed.")

# vllm/v1/metrics/loggers.py (the API server's stats logger, every VLLM_LOG_STATS_INTERVAL s)
STATS: Final = _m("api", "INFO", "loggers.py", 335, "%s")

# Routes listed at startup (a representative part of 0.33's list).
ROUTES: Final = (
    ("/openapi.json", "GET, HEAD"),
    ("/docs", "GET, HEAD"),
    ("/health", "GET"),
    ("/load", "GET"),
    ("/ping", "GET, POST"),
    ("/version", "GET"),
    ("/v1/models", "GET"),
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/metrics", "GET"),
)

# Sleep mode (vllm/v1/executor/abstract.py, vllm/v1/worker/gpu_worker.py). The format strings
# are vLLM's; the line numbers are not read from the 0.33 wheel (no reader keys on them).
FELL_ASLEEP: Final = _m("engine", "INFO", "abstract.py", 262, "It took %.6f seconds to fall asleep.")
WOKE_UP: Final = _m("engine", "INFO", "abstract.py", 279, "It took %.6f seconds to wake up tags %s.")
SLEEP_FREED: Final = _m(
    "worker", "INFO", "gpu_worker.py", 160, "Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in use."
)
ALREADY_SLEEPING: Final = _m("engine", "WARNING", "abstract.py", 256, "Executor is already sleeping.")
NOT_SLEEPING: Final = _m("engine", "WARNING", "abstract.py", 268, "Executor is not sleeping.")
TAG_NOT_SLEEPING: Final = _m("engine", "WARNING", "abstract.py", 273, "Tag %s is not in sleeping tags %s")

ENGINE_DEAD_MESSAGE: Final = "EngineCore encountered an issue. See stack trace (above) for the root cause."
ENGINE_DEAD_CLIENT_MESSAGE: Final = "The server had an error while processing your request."

# vllm/entrypoints/openai/models/serving.py and vllm/entrypoints/serve/lora/api_router.py (read from 0.26.0)
LORA_LOADED: Final = _m("api", "INFO", "serving.py", 216, "Loaded new LoRA adapter: name '%s', path '%s'")
LORA_REMOVED: Final = _m("api", "INFO", "serving.py", 234, "Removed LoRA adapter: name '%s'")
LORA_RUNTIME_UPDATING: Final = _m(
    "api",
    "WARNING",
    "api_router.py",
    30,
    "LoRA dynamic loading & unloading is enabled in the API server. This should ONLY be used for local development!",
)
