"""The log lines the boot-log reader understands: one pattern table per vLLM era.

Each pattern names the vLLM source file and the format string it was built from (read in
the 0.33.0 wheel for the current era, and in vLLM's history for the older ones), a `token`
(a whitespace-separated word every such line contains: the reader's cheap pre-filter, so
most lines never reach a regex) and a `sample` line rendered from that format string (the
tests check that each sample passes the pre-filter and matches).

Regexes use `search`: whatever prefix or wrapper stands in front of the message does not
matter. Numbers with thousands separators (`f"{n:,}"`) are matched with commas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from dankserve.bootlog.facts import FailureClass


class Kind(StrEnum):
    """What a matched line means to the reader."""

    VERSION = "version"
    """A server start banner: the vLLM version, and the start of a new boot."""
    ENGINE_VERSION = "engine_version"
    """The engine's config line: the version (does not by itself start a new boot)."""
    ARGS = "args"
    """The boot's own arguments (`non-default args`, `args: Namespace(...)`)."""
    ARGV_KV = "argv_kv"
    """A command line echo holding `--kv-cache-memory-bytes`."""
    LOAD_START = "load_start"
    WEIGHTS_PROGRESS = "weights_progress"
    WEIGHTS_DONE = "weights_done"
    MODEL_LOADED = "model_loaded"
    COMPILE_START = "compile_start"
    COMPILE_HIT = "compile_hit"
    COMPILE_MISS = "compile_miss"
    COMPILE_TOTAL = "compile_total"
    PROFILING = "profiling"
    KV_AVAILABLE = "kv_available"
    KV_GIVEN = "kv_given"
    KV_SIZE = "kv_size"
    KV_CONCURRENCY = "kv_concurrency"
    KV_BLOCKS = "kv_blocks"
    KV_SUGGESTION = "kv_suggestion"
    CAPTURING = "capturing"
    STATS = "stats"
    PREEMPTED = "preempted"
    READY = "ready"
    FAILURE = "failure"
    EXCEPTION = "exception"
    """The last line of a traceback (`SomeError: message`), when nothing more specific matched."""


# Failure ranks: a later failure replaces the reported one only when its rank is higher, so
# the root cause vLLM logs first is not overwritten by the wrapper errors that follow it.
RANK_OTHER = 0
RANK_ENGINE_DEAD = 1
RANK_VALIDATION = 2  # a pydantic ValidationError header: the next line may say more
RANK_SPECIFIC = 3


@dataclass(frozen=True)
class LinePattern:
    """One kind of log line: how to find it cheaply, how to read it, where vLLM prints it."""

    kind: Kind
    token: str
    regex: re.Pattern[str]
    source: str
    sample: str
    failure: FailureClass | None = None
    rank: int = RANK_SPECIFIC


def _p(
    kind: Kind,
    token: str,
    regex: str,
    source: str,
    sample: str,
    *,
    failure: FailureClass | None = None,
    rank: int = RANK_SPECIFIC,
) -> LinePattern:
    return LinePattern(kind, token, re.compile(regex), source, sample, failure, rank)


_N = r"([\d,]+)"  # an integer as vLLM prints it, maybe with thousands separators
_F = r"(-?[\d.]+)"  # a float

# --- V1 engine, 0.2x to 0.33 (read from the vllm-0.33.0 wheel) ---------------------------------
V1_CURRENT: tuple[LinePattern, ...] = (
    _p(
        Kind.VERSION,
        "version",
        r"vLLM server version (\S+?),? serving model",
        'entrypoints/common/startup.py: "vLLM server version %s, serving model %s"',
        "(APIServer pid=1) INFO 11-29 18:00:00 [startup.py:27] vLLM server version 0.33.0, serving model m",
    ),
    _p(
        Kind.VERSION,
        "version",
        r"\u2588\s+version\s+(\d\S*)",
        'entrypoints/common/startup.py: logo line "\u2588 ...  version ${w}%s${r}"',
        "(APIServer pid=1) INFO 11-29 18:00:00 [startup.py:38]  \u2584\u2584 \u2584\u2588 \u2588     \u2588     "
        "\u2588 \u2580\u2584\u2580 \u2588  version 0.33.0",
    ),
    _p(
        Kind.ARGS,
        "args:",
        r"non-default args: (\{.*)",
        'entrypoints/common/startup.py: "non-default args: %s" (a dict repr)',
        "(APIServer pid=1) INFO 11-29 18:00:00 [startup.py:96] non-default args: {'model_tag': 'm', "
        "'max_model_len': 4096, 'kv_cache_memory_bytes': 21474836480}",
    ),
    _p(
        Kind.ENGINE_VERSION,
        "Initializing",
        r"Initializing an? (?:V[01] )?LLM engine \(v(\S+?)\) with config",
        'v1/engine/core.py: "Initializing a V1 LLM engine (v%s) with config: %s"',
        "(EngineCore pid=3) INFO 11-29 18:00:05 [core.py:140] Initializing a V1 LLM engine (v0.33.0) with "
        "config: model='m', speculative_config=None",
    ),
    _p(
        Kind.LOAD_START,
        "Starting",
        r"Starting to load model ",
        'v1/worker/gpu_model_runner.py: "Starting to load model %s..."',
        "(EngineCore pid=3) INFO 11-29 18:00:10 [gpu_model_runner.py:4979] Starting to load model m...",
    ),
    _p(
        Kind.WEIGHTS_PROGRESS,
        "Completed",
        r"(\d{1,3})% Completed \|",
        'model_executor/model_loader/weight_utils.py: _BAR_FORMAT "{desc}: {percentage:3.0f}% Completed | ..."',
        "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:00<00:00,  1.42it/s]",
    ),
    _p(
        Kind.WEIGHTS_DONE,
        "weights",
        r"Loading weights took " + _F + " seconds",
        'model_executor/model_loader/default_loader.py: "Loading weights took %.2f seconds"',
        "(EngineCore pid=3) INFO 11-29 18:00:12 [default_loader.py:507] Loading weights took 0.40 seconds",
    ),
    _p(
        Kind.MODEL_LOADED,
        "loading",
        r"Model loading took " + _F + r" ?Gi?B(?: memory)? and " + _F + " seconds",
        'v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f seconds"',
        "(EngineCore pid=3) INFO 11-29 18:00:12 [gpu_model_runner.py:5089] Model loading took 1.94 GiB memory "
        "and 2.012345 seconds",
    ),
    _p(
        Kind.COMPILE_START,
        "directory:",
        r"Using cache directory: .* for vLLM's torch\.compile",
        'compilation/backends.py: "%sUsing cache directory: %s for vLLM\'s torch.compile"',
        "(EngineCore pid=3) INFO 11-29 18:00:13 [backends.py:1126] Using cache directory: "
        "/root/.cache/vllm/torch_compile_cache/0f8b20bdea/rank_0_0/backbone for vLLM's torch.compile",
    ),
    _p(
        Kind.COMPILE_START,
        "Starting",
        r"Starting torch\.compile",
        'compilation/monitor.py: "%sStarting torch.compile"',
        "(EngineCore pid=3) INFO 11-29 18:00:13 [monitor.py:40] Starting torch.compile",
    ),
    _p(
        Kind.COMPILE_START,
        "Dynamo",
        r"Dynamo bytecode transform time: ",
        'compilation/backends.py: "%sDynamo bytecode transform time: %.2f s"',
        "(EngineCore pid=3) INFO 11-29 18:00:15 [backends.py:1188] Dynamo bytecode transform time: 1.47 s",
    ),
    _p(
        Kind.COMPILE_HIT,
        "Directly",
        r"Directly load the compiled graph\(s\) for .*from the cache, took",
        'compilation/backends.py: "%sDirectly load the compiled graph(s) for compile range %s from the cache, '
        'took %.3f s"',
        "(EngineCore pid=3) INFO 11-29 18:00:16 [backends.py:311] Directly load the compiled graph(s) for compile "
        "range (1, 8192) from the cache, took 0.717 s",
    ),
    _p(
        Kind.COMPILE_HIT,
        "Directly",
        r"Directly load AOT compilation from path ",
        'compilation/decorators.py: "%sDirectly load AOT compilation from path %s"',
        "(EngineCore pid=3) INFO 11-29 18:00:16 [decorators.py:327] Directly load AOT compilation from path "
        "/root/.cache/vllm/torch_compile_cache/torch_aot_compile/6ee4/rank_0_0/model",
    ),
    _p(
        Kind.COMPILE_MISS,
        "Compiling",
        r"Compiling a graph for .* takes " + _F + " s",
        'compilation/backends.py: "%sCompiling a graph for compile range %s takes %.2f s"',
        "(EngineCore pid=3) INFO 11-29 18:00:30 [backends.py:418] Compiling a graph for compile range (1, 8192) "
        "takes 12.93 s",
    ),
    _p(
        Kind.COMPILE_MISS,
        "disabled.",
        r"vLLM's torch\.compile cache is disabled",
        'compilation/backends.py: "%svLLM\'s torch.compile cache is disabled."',
        "(EngineCore pid=3) INFO 11-29 18:00:13 [backends.py:1124] vLLM's torch.compile cache is disabled.",
    ),
    _p(
        Kind.COMPILE_TOTAL,
        "torch.compile",
        r"(?:\[([\w.-]+)\] )?torch\.compile took " + _F + " s in total",
        'compilation/monitor.py: "%storch.compile took %.2f s in total"',
        "(EngineCore pid=3) INFO 11-29 18:00:31 [monitor.py:62] torch.compile took 17.60 s in total",
    ),
    _p(
        Kind.PROFILING,
        "profiling/warmup",
        r"Initial profiling/warmup run took ",
        'compilation/monitor.py: "%sInitial profiling/warmup run took %.2f s"',
        "(EngineCore pid=3) INFO 11-29 18:00:32 [monitor.py:92] Initial profiling/warmup run took 0.85 s",
    ),
    _p(
        Kind.PROFILING,
        "Profiling",
        r"Profiling CUDA graph memory: ",
        'v1/worker/gpu_model_runner.py: "Profiling CUDA graph memory: %s"',
        "(EngineCore pid=3) INFO 11-29 18:00:32 [gpu_model_runner.py:6304] Profiling CUDA graph memory: "
        "PIECEWISE=19 (largest=128), FULL=11 (largest=64)",
    ),
    _p(
        Kind.KV_AVAILABLE,
        "Available",
        r"Available KV cache memory: " + _F + " GiB",
        'v1/worker/gpu_worker.py: "Available KV cache memory: %s GiB"',
        "(EngineCore pid=3) INFO 11-29 18:00:40 [gpu_worker.py:773] Available KV cache memory: 121.67 GiB",
    ),
    _p(
        Kind.KV_GIVEN,
        "kv_cache_memory_bytes",
        r"reserved " + _F + r" GiB memory for KV Cache as specified by kv_cache_memory_bytes",
        'v1/worker/gpu_worker.py: f"Initial free memory {..} GiB, reserved {..} GiB memory for KV Cache as '
        'specified by kv_cache_memory_bytes config and skipped memory profiling. ..."',
        "(EngineCore pid=3) INFO 11-29 18:00:33 [gpu_worker.py:675] Initial free memory 139.27 GiB, reserved "
        "120.00 GiB memory for KV Cache as specified by kv_cache_memory_bytes config and skipped memory "
        "profiling. This does not respect the gpu_memory_utilization config.",
    ),
    _p(
        Kind.KV_SIZE,
        "size:",
        r"KV cache size: " + _N + r" tokens(?:, Maximum concurrency for " + _N + r" tokens per request: " + _F + "x)?",
        'v1/core/kv_cache_utils.py: "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per '
        'request: %.2fx" (one line since 0.27)',
        "(EngineCore pid=3) INFO 11-29 18:00:40 [kv_cache_utils.py:1148] GPU KV cache size: 1,138,960 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 278.07x",
    ),
    _p(
        Kind.CAPTURING,
        "Capturing",
        r"Capturing CUDA graphs? ",
        'v1/worker/gpu_model_runner.py: tqdm desc "Capturing CUDA graphs ({}, {})"',
        "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|####5     | 30/67 [00:01<00:01, 20.7it/s]",
    ),
    _p(
        Kind.CAPTURING,
        "capturing",
        r"Graph capturing finished in ",
        'v1/worker/gpu_model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB"',
        "(EngineCore pid=3) INFO 11-29 18:00:48 [gpu_model_runner.py:6517] Graph capturing finished in 8 secs, "
        "took 0.52 GiB",
    ),
    _p(
        Kind.KV_SUGGESTION,
        "Replace",
        r"Replace gpu_memory_utilization config with `--kv-cache-memory=(\d+)`",
        'v1/worker/gpu_worker.py: f"... Replace gpu_memory_utilization config with `--kv-cache-memory='
        '{kv_cache_memory_bytes_to_requested_limit}` ({..} GiB) to fit into requested memory, or ..."',
        "(EngineCore pid=3) INFO 11-29 18:00:48 [gpu_worker.py:1065] Free memory on device (139.27/139.81 GiB) "
        "on startup. Desired GPU memory utilization is (0.92, 128.63 GiB). Actual usage is 2.31 GiB for consumed "
        "memory (weights + non-torch), 1.15 GiB for peak activation, and 0.52 GiB for CUDAGraph memory. Replace "
        "gpu_memory_utilization config with `--kv-cache-memory=132530194268` (123.43 GiB) to fit into requested "
        "memory, or `--kv-cache-memory=144070307840` (134.17 GiB) to fully utilize gpu memory. Current kv cache "
        "memory in use is 121.67 GiB.",
    ),
    _p(
        Kind.STATS,
        "usage:",
        r"(?:Preemptions: (\d+), )?\w+ KV cache usage: " + _F + "%",
        'v1/metrics/loggers.py: log_parts "Running: %d reqs", "Waiting: %d reqs", ["Preemptions: %d"], '
        '"%s KV cache usage: %.1f%%"',
        "(APIServer pid=1) INFO 11-29 18:01:00 [loggers.py:336] Engine 000: Avg prompt throughput: 5.7 tokens/s, "
        "Avg generation throughput: 1.5 tokens/s, Running: 1 reqs, Waiting: 0 reqs, Preemptions: 2, GPU KV cache "
        "usage: 1.0%, Prefix cache hit rate: 0.0%",
    ),
    _p(
        Kind.FAILURE,
        "Failed",
        r"Failed to load model - not enough GPU memory\..*",
        'v1/worker/gpu_model_runner.py: "Failed to load model - not enough GPU memory. Try lowering '
        '--gpu-memory-utilization ..."',
        "(EngineCore pid=3) ERROR 11-29 18:00:12 [gpu_model_runner.py:5087] Failed to load model - not enough GPU "
        "memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing "
        "--tensor-parallel-size, or using --quantization.",
        failure=FailureClass.OOM_LOAD,
    ),
    _p(
        Kind.FAILURE,
        "desired",
        r"Free memory on device .*on startup is less than desired GPU memory utilization.*",
        'v1/worker/utils.py: f"Free memory on device {..} ({..}/{..} GiB) on startup is less than desired GPU '
        "memory utilization ({..}, {..} GiB). Decrease GPU memory utilization or reduce GPU memory used by "
        'other processes."',
        "ValueError: Free memory on device cuda:0 (40.12/139.81 GiB) on startup is less than desired GPU memory "
        "utilization (0.92, 128.63 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes.",
        failure=FailureClass.OOM_LOAD,
    ),
    _p(
        Kind.FAILURE,
        "available",
        r"No available memory for the cache blocks\..*",
        'v1/core/kv_cache_planning.py: "No available memory for the cache blocks. Try increasing '
        '`gpu_memory_utilization` when initializing the engine ..."',
        "(EngineCore pid=3) ERROR 11-29 18:00:41 [core.py:1584] ValueError: No available memory for the cache "
        "blocks. Try increasing `gpu_memory_utilization` when initializing the engine.",
        failure=FailureClass.NO_KV_MEMORY,
    ),
    _p(
        Kind.FAILURE,
        "auto-fit",
        r"Cannot auto-fit max_model_len: not enough GPU memory.*",
        'v1/core/kv_cache_planning.py: "Cannot auto-fit max_model_len: not enough GPU memory available to serve '
        'even a single token. ..."',
        "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
        "Try increasing `gpu_memory_utilization`.",
        failure=FailureClass.NO_KV_MEMORY,
    ),
    _p(
        Kind.FAILURE,
        "serve",
        r"To serve at least one request with the model's max seq len \(\d+\)"
        r"(?:.*?estimated maximum model length is (\d+))?",
        "v1/core/kv_cache_planning.py: f\"To serve at least one request with the model's max seq len "
        "({max_model_len}), ({..} GiB KV cache is needed, which is larger than the available KV cache memory "
        '({..} GiB). Based on the available memory, the estimated maximum model length is {estimated_max_len}. ..."',
        "(EngineCore pid=3) ERROR 11-29 18:00:41 [core.py:1584] ValueError: To serve at least one request with "
        "the model's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV "
        "cache memory (4.21 GiB). Based on the available memory, the estimated maximum model length is 34480. "
        "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
        failure=FailureClass.MAX_LEN_TOO_LARGE,
    ),
    _p(
        Kind.FAILURE,
        "divisible",
        r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)\.?",
        'config/model.py: "Total number of attention heads (%d) must be divisible by tensor parallel size (%d)."',
        "  Value error, Total number of attention heads (32) must be divisible by tensor parallel size (3). "
        "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]",
        failure=FailureClass.BAD_ARGUMENT,
    ),
    _p(
        Kind.FAILURE,
        "derived",
        r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len.*?(?= \[type=|$)",
        'config/model.py: f"User-specified max_model_len ({..}) is greater than the derived max_model_len '
        "({max_len_key}={..} or model_max_length={..} in model's config.json). ...\"",
        "  Value error, User-specified max_model_len (65536) is greater than the derived max_model_len "
        "(max_position_embeddings=32768 or model_max_length=None in model's config.json). To allow overriding "
        "this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error, input_value=x]",
        failure=FailureClass.BAD_ARGUMENT,
    ),
    _p(
        Kind.FAILURE,
        "Invalid",
        r"Invalid repository ID or local directory specified: '[^']*'\.?",
        "transformers_utils/config.py: \"Invalid repository ID or local directory specified: '{model}'.\\n...\"",
        "  Value error, Invalid repository ID or local directory specified: 'nope/missing'.",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "Invalid",
        r"Invalid kv_cache_dtype: .*?(?= \[type=|$)",
        'config/cache.py CacheConfig._validate_cache_dtype: f"Invalid kv_cache_dtype: {cache_dtype!r}. Valid values '
        'are: {KV_CACHE_DTYPES}" (a pydantic ValidationError for CacheConfig, API server); v1/attention/selector.py '
        "get_attn_backend asserts the same text without the quotes",
        "  Value error, Invalid kv_cache_dtype: 'q8_0'. Valid values are: ['auto', 'float16', 'bfloat16', 'fp8'] "
        "[type=value_error, input_value='q8_0', input_type=str]",
        failure=FailureClass.BAD_ARGUMENT,
    ),
    _p(
        Kind.FAILURE,
        "initialization",
        r"Engine core initialization failed\..*",
        'v1/engine/utils.py: "Engine core initialization failed. See root cause above. Failed core proc(s): ..."',
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
        failure=FailureClass.ENGINE_DEAD,
        rank=RANK_ENGINE_DEAD,
    ),
    _p(
        Kind.FAILURE,
        "EngineCore",
        r"EngineCore (?:failed to start|encountered a fatal error)\.",
        'v1/engine/core.py: logger.exception("EngineCore failed to start.") / ("EngineCore encountered a fatal '
        'error.")',
        "(EngineCore pid=3) ERROR 11-29 18:00:41 [core.py:1584] EngineCore failed to start.",
        failure=FailureClass.ENGINE_DEAD,
        rank=RANK_ENGINE_DEAD,
    ),
    _p(
        Kind.FAILURE,
        "output_handler",
        r"AsyncLLM output_handler failed\.",
        'v1/engine/async_llm.py: logger.exception("AsyncLLM output_handler failed.")',
        "(APIServer pid=1) ERROR 11-29 19:00:00 [async_llm.py:943] AsyncLLM output_handler failed.",
        failure=FailureClass.ENGINE_DEAD,
        rank=RANK_ENGINE_DEAD,
    ),
    _p(
        Kind.FAILURE,
        "unexpectedly",
        r"(?:Worker proc|Engine core proc(?:ess)?) \S+ died unexpectedly.*",
        'v1/executor/multiproc_executor.py: "Worker proc %s died unexpectedly (exit code: %s), shutting down '
        'executor."; v1/utils.py: "Engine core process %s died unexpectedly."',
        "(EngineCore pid=3) ERROR 11-29 19:00:00 [multiproc_executor.py:381] Worker proc VllmWorker-1 died "
        "unexpectedly (exit code: -9), shutting down executor.",
        failure=FailureClass.ENGINE_DEAD,
        rank=RANK_ENGINE_DEAD,
    ),
    _p(
        Kind.FAILURE,
        "issue.",
        r"EngineCore encountered an issue\. See stack trace \(above\) for the root cause\.",
        "v1/engine/exceptions.py: EngineDeadError.ENGINE_DEAD_MESSAGE",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for "
        "the root cause.",
        failure=FailureClass.ENGINE_DEAD,
        rank=RANK_ENGINE_DEAD,
    ),
)

# --- V1 engine, 0.8 to 0.1x (two-line KV size, shape-based compile lines) ---------------------------
V1_EARLY: tuple[LinePattern, ...] = (
    _p(
        Kind.VERSION,
        "version",
        r"vLLM API server version (\S+)",
        'entrypoints/openai/api_server.py run_server: "vLLM API server version %s"',
        "INFO 03-14 09:12:30 [api_server.py:1043] vLLM API server version 0.8.5",
    ),
    _p(
        Kind.ARGS,
        "args:",
        r"args: Namespace\((.*)",
        'entrypoints/openai/api_server.py run_server: "args: %s" (an argparse Namespace)',
        "INFO 03-14 09:12:30 [api_server.py:1044] args: Namespace(subparser='serve', model_tag='m', "
        "max_model_len=4096, kv_cache_memory_bytes=None)",
    ),
    _p(
        Kind.KV_SIZE,
        "size:",
        r"KV cache size: " + _N + " tokens",
        'v1/core/kv_cache_utils.py: "GPU KV cache size: %s tokens" (then the concurrency on its own line)',
        "INFO 03-14 09:13:08 [kv_cache_utils.py:566] GPU KV cache size: 447,088 tokens",
    ),
    _p(
        Kind.KV_CONCURRENCY,
        "concurrency",
        r"Maximum concurrency for " + _N + r" tokens per request: " + _F + "x",
        'v1/core/kv_cache_utils.py: "Maximum concurrency for %s tokens per request: %.2fx"',
        "INFO 03-14 09:13:08 [kv_cache_utils.py:570] Maximum concurrency for 32,768 tokens per request: 13.64x",
    ),
    _p(
        Kind.COMPILE_TOTAL,
        "torch.compile",
        r"(?:\[([\w.-]+)\] )?torch\.compile takes " + _F + " s in total",
        'compilation/monitor.py: "torch.compile takes %.2f s in total"',
        "(EngineCore_DP0 pid=143) INFO 03-18 14:05:52 [monitor.py:34] torch.compile takes 9.37 s in total",
    ),
    _p(
        Kind.PROFILING,
        "profiling",
        r"Memory profiling takes " + _F + " seconds",
        'v1/worker/gpu_worker.py and worker/worker.py: f"Memory profiling takes {..:.2f} seconds\\n..."',
        "INFO 03-14 09:13:07 [gpu_worker.py:227] Memory profiling takes 11.85 seconds",
    ),
    _p(
        Kind.CAPTURING,
        "Capturing",
        r"Capturing CUDA graph shapes",
        'v1/worker/gpu_model_runner.py: tqdm desc "Capturing CUDA graph shapes"',
        "Capturing CUDA graph shapes: 100%|##########| 67/67 [00:03<00:00, 20.71it/s]",
    ),
)

# --- V0 engine (vLLM up to 0.10; `# GPU blocks` era) -------------------------------------------------
V0: tuple[LinePattern, ...] = (
    _p(
        Kind.KV_BLOCKS,
        "blocks:",
        r"# (?:GPU|cuda|\w+) blocks: (\d+), # CPU blocks: \d+",
        'executor/gpu_executor.py: "# GPU blocks: %d, # CPU blocks: %d"; executor/executor_base.py: '
        '"# %s blocks: %d, # CPU blocks: %d"',
        "INFO 12-22 10:55:35 gpu_executor.py:76] # GPU blocks: 715, # CPU blocks: 1310",
    ),
    _p(
        Kind.KV_AVAILABLE,
        "reserved",
        r"the rest of the memory reserved for KV Cache is " + _F + " ?GiB",
        'worker/worker.py (V0) and v1/worker/gpu_worker.py (0.7-0.8): "... the rest of the memory reserved for '
        'KV Cache is {..:.2f}GiB."',
        "INFO 12-22 10:55:34 worker.py:241] model weights take 8.51GiB; non_torch_memory takes 0.26GiB; PyTorch "
        "activation peak memory takes 0.94GiB; the rest of the memory reserved for KV Cache is 2.18GiB.",
    ),
    _p(
        Kind.WEIGHTS_DONE,
        "weights",
        r"Loading model weights took " + _F + " ?GB",
        'worker/model_runner.py: "Loading model weights took %.4f GB"',
        "INFO 12-22 10:55:34 model_runner.py:1097] Loading model weights took 8.5107 GB",
    ),
    _p(
        Kind.CAPTURING,
        "Capturing",
        r"Capturing cudagraphs for decoding",
        'worker/model_runner.py: "Capturing cudagraphs for decoding. This may lead to unexpected consequences ..."',
        "INFO 12-22 10:55:38 model_runner.py:1413] Capturing cudagraphs for decoding. This may lead to unexpected "
        "consequences if the model is not static.",
    ),
    _p(
        Kind.PREEMPTED,
        "preempted",
        r"total_num_cumulative_preemption=(\d+)",
        'core/scheduler.py: "Sequence group %s is preempted by %s mode because there is not enough KV cache '
        'space. ... total_num_cumulative_preemption=%d"',
        "WARNING 11-27 02:04:48 scheduler.py:1481] Sequence group cmpl-f5a9-0 is preempted by "
        "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the end-to-end "
        "performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption=51",
    ),
    _p(
        Kind.FAILURE,
        "stored",
        r"The model's max seq len \(\d+\) is larger than the maximum number of tokens that can be stored in KV "
        r"cache \((\d+)\)\..*",
        "worker/worker.py raise_if_cache_size_invalid: f\"The model's max seq len ({max_model_len}) is larger than "
        'the maximum number of tokens that can be stored in KV cache ({max_seq_len}). ..."',
        "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
        "stored in KV cache (93760). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.",
        failure=FailureClass.MAX_LEN_TOO_LARGE,
    ),
)

# --- Not vLLM's logger: uvicorn, argparse, huggingface_hub, torch, Python -----------------------------
COMMON: tuple[LinePattern, ...] = (
    _p(
        Kind.READY,
        "Application",
        r"Application startup complete\.",
        'uvicorn/lifespan/on.py: "Application startup complete." (uvicorn\'s logger: "INFO:     ...")',
        "(APIServer pid=1) INFO:     Application startup complete.",
    ),
    _p(
        Kind.FAILURE,
        "error:",
        r"(?:^|[\s:|])((?:vllm(?: serve)?|[\w.-]+\.py): error: .*)",
        'Lib/argparse.py ArgumentParser.error: "%(prog)s: error: %(message)s" (prog "vllm serve")',
        "vllm serve: error: unrecognized arguments: --swap-space 4",
        failure=FailureClass.BAD_ARGUMENT,
    ),
    _p(
        Kind.FAILURE,
        "gated",
        r"(?:Cannot access gated repo for url \S+|You are trying to access a gated repo\.)",
        'huggingface_hub/utils/_http.py: "Cannot access gated repo for url %s."; transformers: "You are trying '
        'to access a gated repo."',
        "Cannot access gated repo for url https://huggingface.co/meta-llama/Llama-3.1-8B/resolve/main/config.json.",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "Repository",
        r"Repository Not Found for url: \S+",
        'huggingface_hub/utils/_http.py: "Repository Not Found for url: %s."',
        "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url: "
        "https://huggingface.co/api/models/nope/missing/revision/main.",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "traffic",
        r"Cannot find the requested files in the disk cache and outgoing traffic has been disabled.*",
        'huggingface_hub/file_download.py: "Cannot find the requested files in the disk cache and outgoing '
        'traffic has been disabled. ..." (HF_HUB_OFFLINE=1 and the model not cached)',
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache and "
        "outgoing traffic has been disabled. To enable hf.co look-ups and downloads online, set 'local_files_only' "
        "to False.",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "Repo",
        r"Repo id must (?:be in the form|use alphanumeric chars).*",
        "huggingface_hub/utils/_validators.py validate_repo_id: \"Repo id must be in the form 'repo_name' or "
        "'namespace/repo_name': '{repo_id}'. ...\" / \"Repo id must use alphanumeric chars ...\" (a model path that "
        "does not exist is no repo id; transformers/utils/hub.py cached_files re-raises it as OSError(str(e)))",
        "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/models/missing'. Use "
        "`repo_type` argument if needed.",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "identifier",
        r"is not a local folder and is not a valid model identifier.*",
        'transformers/utils/hub.py: "%s is not a local folder and is not a valid model identifier listed on '
        "'https://huggingface.co/models'\"",
        "OSError: nope/missing is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models'",
        failure=FailureClass.MODEL_NOT_FOUND,
    ),
    _p(
        Kind.FAILURE,
        "memory.",
        r"CUDA out of memory\..*",
        'torch/csrc/.../CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate %s ..."',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
        "139.81 GiB of which 1.02 GiB is free.",
        failure=FailureClass.OOM_LOAD,
    ),
)

ERAS: dict[str, tuple[LinePattern, ...]] = {
    "v1 (0.2x-0.33)": V1_CURRENT,
    "v1 early (0.8-0.1x)": V1_EARLY,
    "v0": V0,
    "common": COMMON,
}
ALL_PATTERNS: tuple[LinePattern, ...] = V1_CURRENT + V1_EARLY + V0 + COMMON

# A traceback's last line: `pkg.mod.SomeError: message` (column 0 of the message). Not
# KeyboardInterrupt: vLLM raises `KeyboardInterrupt("terminated")` on SIGTERM, a stop.
EXCEPTION_RE = re.compile(r"^((?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception))): ?(.*)")


@dataclass(frozen=True)
class ExceptionClass:
    """A failure class named by an exception's type alone (the message varies)."""

    failure: FailureClass
    rank: int
    source: str


# Exception types whose name says the class, whatever the message.
EXCEPTION_CLASSES: dict[str, ExceptionClass] = {
    "ValidationError": ExceptionClass(
        FailureClass.BAD_ARGUMENT,
        RANK_VALIDATION,
        'pydantic_core: "%d validation error for %s" (vLLM\'s config classes are pydantic dataclasses; the '
        "detail follows on the next line)",
    ),
    "HFValidationError": ExceptionClass(
        FailureClass.MODEL_NOT_FOUND,
        RANK_SPECIFIC,
        "huggingface_hub/errors.py: HFValidationError (validate_repo_id: the model is neither a local directory nor "
        "a repo id)",
    ),
    "RepositoryNotFoundError": ExceptionClass(
        FailureClass.MODEL_NOT_FOUND, RANK_SPECIFIC, "huggingface_hub/errors.py: RepositoryNotFoundError"
    ),
    "RevisionNotFoundError": ExceptionClass(
        FailureClass.MODEL_NOT_FOUND, RANK_SPECIFIC, "huggingface_hub/errors.py: RevisionNotFoundError"
    ),
    "GatedRepoError": ExceptionClass(
        FailureClass.MODEL_NOT_FOUND, RANK_SPECIFIC, "huggingface_hub/errors.py: GatedRepoError"
    ),
    "LocalEntryNotFoundError": ExceptionClass(
        FailureClass.MODEL_NOT_FOUND,
        RANK_SPECIFIC,
        "huggingface_hub/errors.py: LocalEntryNotFoundError (offline and not in the cache)",
    ),
    "OutOfMemoryError": ExceptionClass(
        FailureClass.OOM_LOAD, RANK_SPECIFIC, "torch: torch.OutOfMemoryError / torch.cuda.OutOfMemoryError"
    ),
    "EngineDeadError": ExceptionClass(
        FailureClass.ENGINE_DEAD, RANK_ENGINE_DEAD, "v1/engine/exceptions.py: EngineDeadError"
    ),
    "AsyncEngineDeadError": ExceptionClass(
        FailureClass.ENGINE_DEAD,
        RANK_ENGINE_DEAD,
        'V0 engine/async_llm_engine.py: AsyncEngineDeadError("Background loop has errored already.")',
    ),
}
# A pydantic error's detail line follows its header: `  Value error, <message> [type=...]`; a field
# error has the field's location on a line of its own in between (`cache_dtype`, `a.b.0`).
VALUE_ERROR_DETAIL_RE = re.compile(r"^\s*(?:Value error, |Assertion failed, )?(.+?)(?:\s*\[type=.*)?$")
PYDANTIC_LOCATION_RE = re.compile(r"^[A-Za-z_][\w.\[\]-]*$")
# The given KV bytes on an echoed command line (`--kv-cache-memory-bytes 20G`, `=21474836480`).
ARGV_KV_RE = re.compile(r"--kv-cache-memory(?:-bytes)?[= ]+(\d+(?:\.\d+)?[kKmMgGtT]?)(?![\w`])")
ARGS_KV_RE = re.compile(r"kv_cache_memory_bytes['\"]?[:=]\s*(\d+)")
ARGS_MAX_LEN_RE = re.compile(r"max_model_len['\"]?[:=]\s*(\d+)")
ARGS_BLOCK_SIZE_RE = re.compile(r"block_size['\"]?[:=]\s*(\d+)")
