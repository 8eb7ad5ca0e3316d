"""The boot as a list of events: log lines, raw output, nominal pauses, actions (pure).

The runner executes the list; keeping the sequence pure makes the order of vLLM 0.33's boot
lines, the failure points and the durations one readable function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

from . import VLLM_VERSION
from . import failures as fail
from . import messages as msg
from .logfmt import progress_line, tqdm_bar
from .memory import GIB, MemoryPlan, RankMemory, format_gib
from .messages import Message
from .serve_config import ServeConfig
from .timeline import PhaseDurations


@dataclass(frozen=True)
class Sleep:
    seconds: float  # nominal (H200) seconds; the runner multiplies by the time scale


@dataclass(frozen=True)
class Log:
    message: Message
    args: tuple[object, ...] = ()
    rank: int = 0
    suffix: str = ""  # appended after %-formatting (a logger.exception traceback)


@dataclass(frozen=True)
class Raw:
    stream: Literal["stdout", "stderr"]
    text: str


@dataclass(frozen=True)
class Uvicorn:
    message: str


@dataclass(frozen=True)
class Action:
    name: Literal["bind", "write_compile_artifacts", "listen"]


@dataclass(frozen=True)
class Ready:
    pass


@dataclass(frozen=True)
class Hang:
    pass


@dataclass(frozen=True)
class Exit:
    code: int


Event = Sleep | Log | Raw | Uvicorn | Action | Ready | Hang | Exit

STAND_IN_PREFIX: Final = "FAKE-VLLM stand-in:"
PIECEWISE_GRAPHS: Final = 51
FULL_DECODE_GRAPHS: Final = 35
ATTENTION_BACKENDS: Final = "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']"


@dataclass(frozen=True)
class CacheStatus:
    """The compile cache as found before the boot."""

    hit: bool
    backend_dirs: tuple[str, ...]  # each rank's `Using cache directory`
    aot_model_paths: tuple[str, ...]  # each rank's AOT model file


@dataclass(frozen=True)
class BootInputs:
    """Everything the boot sequence depends on."""

    config: ServeConfig
    memory: MemoryPlan
    durations: PhaseDurations
    cache: CacheStatus
    non_default_args: dict[str, object]
    logo: bool
    colour: bool
    gpu_listing: str
    listen_address: str
    api_pid: int
    model_flag_used: bool
    fail: str | None
    model_missing: bool
    model_is_local_dir: bool  # a missing config.json then fails in ModelConfig, not in transformers
    no_gpu: bool
    foreign_proc: bool
    """In a PID namespace whose /proc is the host's (`/proc/<getpid()>` names another process): CUDA refuses
    to start there (error 304 at the engine's device init, as on a real GPU)."""
    max_len_over_derived: bool
    kv_cache_dtypes: tuple[str, ...] | None  # what CacheConfig accepts; None: anything
    model_bytes: int
    host_ram_bytes: int
    extra_notes: tuple[str, ...] = field(default=())
    lora_loads: tuple[tuple[str, str, str | None], ...] = ()
    """Each --lora-modules item's (name, path, error message or None), loaded in init_app_state."""
    lora_runtime_updating: bool = False


def _per_rank(message: Message, args_by_rank: list[tuple[object, ...]]) -> list[Event]:
    ranks = args_by_rank if message.every_rank else args_by_rank[:1]
    return [Log(message, args, rank) for rank, args in enumerate(ranks)]


def _logo_message(colour: bool) -> Message:
    colours = {"w": "\033[1m", "o": "\033[93m", "b": "\033[94m", "r": "\033[0m"}
    text = msg.VERSION_LOGO.format
    for key, code in colours.items():
        text = text.replace("${" + key + "}", code if colour else "")
    return Message(msg.VERSION_LOGO.process, msg.VERSION_LOGO.level, msg.VERSION_LOGO.origin, text)


def _engine_config_repr(config: ServeConfig, max_len: int) -> str:
    dtype = "torch.bfloat16" if config.dtype in ("auto", "bfloat16") else f"torch.{config.dtype}"
    return (
        f"model={config.model!r}, speculative_config=None, tokenizer={config.model!r}, skip_tokenizer_init=False, "
        f"tokenizer_mode=auto, revision={config.revision}, tokenizer_revision=None, trust_remote_code=False, "
        f"dtype={dtype}, max_seq_len={max_len}, download_dir=None, load_format=auto, "
        f"tensor_parallel_size={config.tensor_parallel_size}, pipeline_parallel_size=1, data_parallel_size=1, "
        f"disable_custom_all_reduce=False, quantization={config.quantization}, enforce_eager={config.enforce_eager}, "
        f"kv_cache_dtype={config.kv_cache_dtype}, device_config=cuda, seed={config.seed}, "
        f"served_model_name={config.served_model_name}, enable_prefix_caching={config.enable_prefix_caching}, "
        "enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': "
        "<CompilationMode.VLLM_COMPILE: 3>, 'backend': 'inductor', 'cudagraph_mode': "
        "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'compile_ranges_endpoints': "
        f"[{config.max_num_batched_tokens}], ...}}"
    )


def _engine_startup_failure(engine_traceback: str, before: list[Event]) -> list[Event]:
    """The engine raised during startup: its report, multiprocessing's, then the API server's."""
    return [
        *before,
        Log(msg.ENGINE_FAILED_TO_START, suffix="\n" + engine_traceback),
        Raw("stderr", fail.process_engine_core_traceback(engine_traceback) + "\n"),
        Sleep(1.0),
        Raw("stderr", fail.engine_core_init_failed() + "\n"),
        Exit(1),
    ]


def _weights_bar(shards: int, seconds: float, failing_at: int | None) -> list[Event]:
    events: list[Event] = []
    step = seconds / shards
    line = ""
    for done in range(shards + 1):
        if failing_at is not None and done > failing_at:
            return events
        elapsed = step * done
        line = progress_line(msg.WEIGHTS_BAR, done, shards, elapsed, done / elapsed if elapsed > 0 else 0.0)
        events.append(Raw("stderr", "\r" + line + "\n"))
        if done < shards:
            events.append(Sleep(step))
    # tqdm's close() repaints the finished bar, and its format already ends in a newline.
    events.append(Raw("stderr", "\r" + line + "\n\n"))
    return events


def _capture_bar(description: str, graphs: int, seconds: float) -> list[Event]:
    events: list[Event] = [Raw("stderr", "\r" + tqdm_bar(description, 0, graphs, 0.0))]
    steps = 4
    for step in range(1, steps + 1):
        events.append(Sleep(seconds / steps))
        done = graphs * step // steps
        events.append(Raw("stderr", "\r" + tqdm_bar(description, done, graphs, seconds * step / steps)))
    events.append(Raw("stderr", "\n"))
    return events


def _compile_events(inputs: BootInputs, ranks: int) -> list[Event]:
    config, durations = inputs.config, inputs.durations
    compile_range = f"(1, {config.max_num_batched_tokens})"
    total = durations.torch_compile
    rank_args: list[tuple[object, ...]] = [("",) for _ in range(ranks)]
    events: list[Event] = []
    if inputs.cache.hit:
        events += _per_rank(msg.USING_CACHE_DIRECTORY, [("", path) for path in inputs.cache.backend_dirs[:ranks]])
        events.append(Sleep(total * 0.8))
        events += _per_rank(msg.DIRECTLY_LOAD_GRAPHS, [("", compile_range, total * 0.78) for _ in range(ranks)])
        events.append(Sleep(total * 0.2))
        events += _per_rank(msg.DIRECTLY_LOAD_AOT, [("", path) for path in inputs.cache.aot_model_paths[:ranks]])
        events += _per_rank(msg.TORCH_COMPILE_TOOK, [("", total) for _ in range(ranks)])
        return events
    dynamo = total * 0.3
    events += _per_rank(msg.STARTING_TORCH_COMPILE, rank_args)
    events += _per_rank(msg.USING_CACHE_DIRECTORY, [("", path) for path in inputs.cache.backend_dirs[:ranks]])
    events.append(Sleep(dynamo))
    events += _per_rank(msg.DYNAMO_TRANSFORM_TIME, [("", dynamo) for _ in range(ranks)])
    events.append(Sleep(total * 0.05))
    events += _per_rank(msg.CACHE_THE_GRAPH, [("", compile_range) for _ in range(ranks)])
    events.append(Sleep(total - dynamo - total * 0.05))
    events += _per_rank(msg.COMPILING_A_GRAPH, [("", compile_range, total - dynamo) for _ in range(ranks)])
    events.append(Action("write_compile_artifacts"))
    events += _per_rank(msg.TORCH_COMPILE_TOOK, [("", total) for _ in range(ranks)])
    events += _per_rank(msg.SAVED_AOT, [("", path) for path in inputs.cache.aot_model_paths[:ranks]])
    return events


def _suggestion_args(rank: RankMemory, utilization: float) -> tuple[object, ...]:
    return (
        format_gib(rank.init_free),
        format_gib(rank.total),
        utilization,
        format_gib(rank.requested),
        format_gib(rank.total_consumed),
        format_gib(rank.peak_activation),
        format_gib(rank.cudagraph_actual),
        rank.suggestion_to_requested,
        format_gib(rank.suggestion_to_requested),
        rank.suggestion_to_gpu,
        format_gib(rank.suggestion_to_gpu),
        format_gib(rank.available_kv),
    )


def _api_server_phase(inputs: BootInputs) -> list[Event]:
    """Imports, the version line, the arguments, the bound socket, the model's config."""
    config, memory, durations = inputs.config, inputs.memory, inputs.durations
    events: list[Event] = [Raw("stdout", f"{STAND_IN_PREFIX} {inputs.gpu_listing}\n")]
    events += [Raw("stdout", f"{STAND_IN_PREFIX} {note}\n") for note in inputs.extra_notes]
    events.append(Sleep(durations.before_first_log))
    if inputs.model_flag_used:
        events.append(Log(msg.MODEL_FLAG_WARNING))
    if inputs.logo:
        events.append(Log(_logo_message(inputs.colour), (VLLM_VERSION, config.model)))
    else:
        events.append(Log(msg.VERSION_PLAIN, (VLLM_VERSION, config.model)))
    events.append(Log(msg.NON_DEFAULT_ARGS, (inputs.non_default_args,)))
    events.append(Action("bind"))
    # EngineArgs.create_engine_config, in its order: DeviceConfig, transformers' config read
    # (maybe_override_with_speculators), ModelConfig, CacheConfig, SchedulerConfig.
    if inputs.no_gpu:
        return [*events, Sleep(1.5), Raw("stderr", fail.no_gpu_traceback() + "\n"), Exit(1)]
    model_missing = inputs.model_missing or inputs.fail in ("model_not_found", "model_gated")
    if model_missing and not inputs.model_is_local_dir:
        traceback = fail.model_not_found_traceback(config.model, gated=inputs.fail == "model_gated")
        return [*events, Sleep(1.5), Raw("stderr", traceback + "\n"), Exit(1)]
    events.append(Sleep(durations.api_server_setup * 0.5))
    if model_missing:
        traceback = fail.model_not_found_traceback(config.model, gated=False, local_dir=True)
        return [*events, Raw("stderr", traceback + "\n"), Exit(1)]
    events.append(Log(msg.RESOLVED_ARCHITECTURE, ("LlamaForCausalLM",)))
    if inputs.max_len_over_derived:
        traceback = fail.max_len_over_derived_traceback(
            config.max_model_len or 0, memory.derived_max_model_len, config.model
        )
        return [*events, Raw("stderr", traceback + "\n"), Exit(1)]
    configured_len = memory.derived_max_model_len if config.max_model_len in (None, -1) else config.max_model_len
    events.append(Log(msg.USING_MAX_MODEL_LEN, (configured_len,)))
    if inputs.kv_cache_dtypes is not None and config.kv_cache_dtype not in inputs.kv_cache_dtypes:
        traceback = fail.invalid_kv_cache_dtype_traceback(config.kv_cache_dtype, inputs.kv_cache_dtypes)
        return [*events, Raw("stderr", traceback + "\n"), Exit(1)]
    return [
        *events,
        Log(msg.CHUNKED_PREFILL, (config.max_num_batched_tokens,)),
        Sleep(durations.api_server_setup * 0.5),
        Log(msg.ENGINE_INIT, (VLLM_VERSION, _engine_config_repr(config, configured_len or 0))),
    ]


def _load_phase(inputs: BootInputs) -> list[Event]:
    """Engine start, device init, the weights."""
    config, memory, durations = inputs.config, inputs.memory, inputs.durations
    ranks = config.tensor_parallel_size
    rank0 = memory.ranks[0]
    events: list[Event] = [
        Sleep(durations.engine_start),
        Log(msg.RANK_ASSIGNMENT, (0, ranks, 0, 0, 0, 0, 0, 0, 0)),
    ]
    if inputs.foreign_proc:
        return _engine_startup_failure(fail.cuda_init_304_traceback(), events)
    if memory.outcome == "free_below_requested":
        traceback = fail.free_below_requested_traceback(
            rank0.init_free, rank0.total, config.gpu_memory_utilization, rank0.requested
        )
        return _engine_startup_failure(traceback, events)
    shards = max(2, math.ceil(inputs.model_bytes / (4 * GIB)))
    events += [
        Log(msg.STARTING_TO_LOAD, (config.model,)),
        Log(msg.ATTENTION_BACKEND, ("FLASH_ATTN", ATTENTION_BACKENDS)),
        Log(msg.CHECKPOINT_FILESYSTEM, ("EXT4", inputs.model_bytes / GIB, inputs.host_ram_bytes / GIB)),
    ]
    if memory.outcome == "weights_oom":
        events += _weights_bar(shards, durations.weights_load, failing_at=shards // 2)
        free = max(0, min(rank0.init_free - rank0.weights // 2, 512 << 20))
        oom = fail.cuda_oom_message(
            allocation=max(rank0.weights // shards, 64 << 20),
            total=rank0.total,
            free=free,
            in_use=rank0.weights // 2 + rank0.non_torch,
        )
        failing = _per_rank(msg.FAILED_TO_LOAD, [(oom,) for _ in range(ranks)])
        return _engine_startup_failure(fail.weights_oom_traceback(oom), [*events, *failing])
    events += _weights_bar(shards, durations.weights_load, failing_at=None)
    events += [
        Log(msg.LOADING_WEIGHTS_TOOK, (durations.weights_load,)),
        Sleep(durations.model_setup),
        Log(msg.MODEL_LOADING_TOOK, (format_gib(rank0.weights), durations.weights_load + durations.model_setup)),
        Sleep(durations.unattributed),
    ]
    if inputs.fail == "hang":
        events.append(Hang())
    return events


def _kv_cache_phase(inputs: BootInputs) -> list[Event]:
    """torch.compile, memory profiling (or the given bytes), the KV cache checks and its size."""
    config, memory, durations = inputs.config, inputs.memory, inputs.durations
    ranks = config.tensor_parallel_size
    rank0 = memory.ranks[0]
    events: list[Event] = []
    if not config.enforce_eager:
        events += _compile_events(inputs, ranks)
    events.append(Sleep(durations.memory_profiling))
    if memory.profiled:
        events.append(Log(msg.AVAILABLE_KV_CACHE, (format_gib(rank0.available_kv),)))
        if not config.enforce_eager:
            delta = rank0.cudagraph_estimate / rank0.total
            utilization = config.gpu_memory_utilization
            suggested = (utilization, round(utilization - delta, 4), min(round(utilization + delta, 4), 1.0))
            events += _per_rank(msg.CUDAGRAPH_PROFILING_ENABLED, [suggested for _ in range(ranks)])
    else:
        events += _per_rank(
            msg.KV_BYTES_RESERVED,
            [(format_gib(rank.init_free), format_gib(rank.available_kv)) for rank in memory.ranks],
        )
    limiting = memory.limiting_rank.available_kv
    if memory.outcome == "no_kv_memory":
        return _engine_startup_failure(fail.kv_check_traceback(fail.no_kv_memory_message()), events)
    if memory.outcome == "auto_fit_impossible":
        return _engine_startup_failure(fail.kv_check_traceback(fail.auto_fit_impossible_message()), events)
    if memory.outcome == "max_len_too_large":
        message = fail.max_len_message(
            memory.max_model_len, memory.needed_kv_bytes, limiting, memory.estimated_max_model_len
        )
        return _engine_startup_failure(fail.kv_check_traceback(message), events)
    kv_memory_text = f"{format_gib(limiting)} GiB GPU"
    if memory.auto_fit == "full":
        events.append(Log(msg.AUTO_FIT_FULL, (memory.derived_max_model_len, kv_memory_text)))
    elif memory.auto_fit == "reduced":
        events.append(Log(msg.AUTO_FIT_REDUCED, (memory.derived_max_model_len, memory.max_model_len, kv_memory_text)))
    size = ("GPU", f"{memory.kv_tokens:,}", f"{memory.max_model_len:,}", memory.max_concurrency)
    events += [Log(msg.KV_CACHE_SIZE, size), Sleep(durations.kv_cache_allocation)]
    if memory.outcome == "kv_allocation_oom":
        in_use = rank0.total_consumed + rank0.transient_peak
        free = max(0, rank0.init_free - in_use)
        oom = fail.cuda_oom_message(allocation=limiting, total=rank0.total, free=free, in_use=in_use)
        return _engine_startup_failure(fail.kv_allocation_oom_traceback(oom), events)
    return [*events, Sleep(durations.warmup)]


def _capture_phase(inputs: BootInputs) -> list[Event]:
    """CUDA-graph capture, the `--kv-cache-memory=<int>` suggestion, the init engine total."""
    config, memory, durations = inputs.config, inputs.memory, inputs.durations
    rank0 = memory.ranks[0]
    events: list[Event] = []
    if not config.enforce_eager:
        capture = durations.graph_capture
        events += _capture_bar(
            "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", PIECEWISE_GRAPHS, capture * 0.6
        )
        events += _capture_bar("Capturing CUDA graphs (decode, FULL)", FULL_DECODE_GRAPHS, capture * 0.4)
        events.append(Log(msg.GRAPH_CAPTURING_FINISHED, (capture, rank0.cudagraph_actual / GIB)))
        if memory.profiled:
            pool_args: list[tuple[object, ...]] = []
            for rank in memory.ranks:
                diff = abs(rank.cudagraph_actual - rank.cudagraph_estimate)
                pool_args.append(
                    (
                        round(rank.cudagraph_actual / GIB, 2),
                        round(rank.cudagraph_estimate / GIB, 2),
                        round(diff / GIB, 2),
                        100 * diff / max(rank.cudagraph_actual, 1),
                    )
                )
            events += _per_rank(msg.CUDAGRAPH_POOL_MEMORY, pool_args)
    if memory.profiled:
        events += _per_rank(
            msg.KV_CACHE_SUGGESTION,
            [_suggestion_args(rank, config.gpu_memory_utilization) for rank in memory.ranks],
        )
    if config.enforce_eager:
        events.append(Log(msg.INIT_ENGINE, (durations.init_engine,)))
    else:
        events.append(Log(msg.INIT_ENGINE_WITH_COMPILE, (durations.init_engine, durations.torch_compile)))
    return events


def _serve_phase(inputs: BootInputs) -> list[Event]:
    """The API server starts uvicorn on the socket bound at the start."""
    durations = inputs.durations
    # 0.26's run_server: "Supported tasks", build_app (the LoRA router's warning), init_app_state (static
    # LoRAs: one that fails raises, and the server exits), then "Starting vLLM server on".
    events: list[Event] = [Sleep(durations.server_start * 0.7), Log(msg.SUPPORTED_TASKS, (["generate"],))]
    if inputs.lora_runtime_updating:
        events.append(Log(msg.LORA_RUNTIME_UPDATING))
    for name, path, error in inputs.lora_loads:
        if error is not None:
            return [*events, Raw("stderr", f"ValueError: {error}\n"), Exit(1)]
        events.append(Log(msg.LORA_LOADED, (name, path)))
    return [
        *events,
        Log(msg.STARTING_SERVER, (inputs.listen_address,)),
        Log(msg.AVAILABLE_ROUTES),
        *[Log(msg.ROUTE, route) for route in msg.ROUTES],
        Uvicorn(f"Started server process [{inputs.api_pid}]"),
        Uvicorn("Waiting for application startup."),
        Sleep(durations.server_start * 0.3),
        Action("listen"),
        Uvicorn("Application startup complete."),
        Ready(),
    ]


def build_boot_plan(inputs: BootInputs) -> list[Event]:
    """vLLM 0.33's boot, line by line, ending in Ready, Hang or Exit."""
    events: list[Event] = []
    for phase in (_api_server_phase, _load_phase, _kv_cache_phase, _capture_phase, _serve_phase):
        events += phase(inputs)
        if isinstance(events[-1], Exit | Hang | Ready):
            break
    return events


def nominal_seconds(events: list[Event]) -> float:
    return sum(event.seconds for event in events if isinstance(event, Sleep))
