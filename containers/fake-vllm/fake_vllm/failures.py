"""Tracebacks and final exception lines of vLLM 0.33's boot failures (pure text builders).

The last line of each traceback is what a log reader classifies on; those are vLLM's (and
torch's, huggingface_hub's, pydantic's) own messages. The frames above them are plausible
paths and line numbers from the 0.33 wheel, not a promise of exact stacks.
"""

from __future__ import annotations

import re
from typing import Final

from .memory import GIB, MIB, format_gib

PACKAGE: Final = "/usr/local/lib/python3.12/dist-packages"
VLLM: Final = f"{PACKAGE}/vllm"
KV_DOCS: Final = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"


def _frame(path: str, line: int, function: str, code: str) -> str:
    return f'  File "{path}", line {line}, in {function}\n    {code}'


def traceback_text(frames: list[str], final: str) -> str:
    return "Traceback (most recent call last):\n" + "\n".join(frames) + "\n" + final


_CLI_FRAMES: Final = [
    _frame("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    _frame(f"{VLLM}/entrypoints/cli/main.py", 123, "main", "args.dispatch_function(args)"),
    _frame(f"{VLLM}/entrypoints/cli/serve.py", 155, "cmd", "uvloop.run(run_server(args))"),
    _frame(f"{PACKAGE}/uvloop/__init__.py", 96, "run", "return __asyncio.run("),
    _frame("/usr/lib/python3.12/asyncio/runners.py", 195, "run", "return runner.run(main)"),
    _frame("/usr/lib/python3.12/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
    _frame(f"{PACKAGE}/uvloop/__init__.py", 48, "wrapper", "return await main"),
    _frame(
        f"{VLLM}/entrypoints/launchers/api_server/entry.py",
        176,
        "run_server",
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
    _frame(
        f"{VLLM}/entrypoints/launchers/api_server/entry.py",
        191,
        "run_server_worker",
        "async with build_async_engine_client(",
    ),
    _frame("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
    _frame(
        f"{VLLM}/entrypoints/launchers/api_server/entry.py",
        60,
        "build_async_engine_client",
        "async with build_async_engine_client_from_engine_args(",
    ),
    _frame("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
]

# build_async_engine_client_from_engine_args -> EngineArgs.create_engine_config (API server process).
_CREATE_ENGINE_CONFIG_FRAMES: Final = [
    *_CLI_FRAMES,
    _frame(
        f"{VLLM}/entrypoints/launchers/api_server/entry.py",
        82,
        "build_async_engine_client_from_engine_args",
        "vllm_config = engine_args.create_engine_config(usage_context=usage_context)",
    ),
]
PYDANTIC_DATACLASS_INIT: Final = _frame(
    f"{PACKAGE}/pydantic/_internal/_dataclasses.py",
    121,
    "__init__",
    "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)",
)
PYDANTIC_ERRORS_URL: Final = "https://errors.pydantic.dev/2.12/v/value_error"

_ENGINE_FRAMES: Final = [
    _frame(
        f"{VLLM}/v1/engine/core.py",
        1555,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    _frame(f"{VLLM}/v1/engine/core.py", 1232, "__init__", "super().__init__("),
]


def engine_core_init_failed() -> str:
    """The API server's traceback once the engine process died during startup."""
    frames = [
        *_CLI_FRAMES,
        _frame(
            f"{VLLM}/entrypoints/launchers/api_server/entry.py",
            85,
            "build_async_engine_client_from_engine_args",
            "async_llm = AsyncLLM.from_vllm_config(",
        ),
        _frame(f"{VLLM}/v1/engine/async_llm.py", 262, "from_vllm_config", "return cls("),
        _frame(
            f"{VLLM}/v1/engine/async_llm.py",
            158,
            "__init__",
            "self.engine_core = EngineCoreClient.make_async_mp_client(",
        ),
        _frame(f"{VLLM}/v1/engine/core_client.py", 130, "make_async_mp_client", "return AsyncMPClient(*client_args)"),
        _frame(f"{VLLM}/v1/engine/core_client.py", 1002, "__init__", "super().__init__("),
        _frame(f"{VLLM}/v1/engine/core_client.py", 612, "__init__", "with launch_core_engines("),
        _frame("/usr/lib/python3.12/contextlib.py", 144, "__exit__", "next(self.gen)"),
        _frame(f"{VLLM}/v1/engine/utils.py", 1305, "launch_core_engines", "wait_for_engine_startup("),
        _frame(f"{VLLM}/v1/engine/utils.py", 1473, "wait_for_engine_startup", "raise RuntimeError("),
    ]
    return traceback_text(
        frames,
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}",
    )


def process_engine_core_traceback(engine_traceback: str) -> str:
    """multiprocessing's own report when the engine process target raised (unprefixed, stderr)."""
    frames = [
        _frame("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
        _frame(
            "/usr/lib/python3.12/multiprocessing/process.py", 108, "run", "self._target(*self._args, **self._kwargs)"
        ),
    ]
    body = engine_traceback.split("\n", 1)[1]
    return "Process EngineCore:\nTraceback (most recent call last):\n" + "\n".join(frames) + "\n" + body


def cuda_oom_message(allocation: int, total: int, free: int, in_use: int) -> str:
    """torch's `CUDA out of memory` message (c10/cuda/CUDACachingAllocator.cpp)."""
    return (
        f"CUDA out of memory. Tried to allocate {_torch_size(allocation)}. GPU 0 has a total capacity of "
        f"{_torch_size(total)} of which {_torch_size(free)} is free. Including non-PyTorch memory, this process "
        f"has {_torch_size(in_use)} memory in use. Of the allocated memory {_torch_size(max(0, in_use - 320 * MIB))} "
        f"is allocated by PyTorch, and {_torch_size(20 * MIB)} is reserved by PyTorch but unallocated. If reserved "
        "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def _torch_size(value: int) -> str:
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / MIB:.2f} MiB"


def cuda_init_304_traceback() -> str:
    """The engine's device init where CUDA cannot start (seen on an H100 with vLLM 0.26.0, driver 580: the
    engine in a PID namespace that shares the host's /proc, docs/snapshots.md "Host pids")."""
    frames = [
        *_ENGINE_FRAMES,
        _frame(f"{VLLM}/v1/engine/core.py", 125, "__init__", "self.model_executor = executor_class(vllm_config)"),
        _frame(f"{VLLM}/v1/executor/abstract.py", 109, "__init__", "self._init_executor()"),
        _frame(f"{VLLM}/v1/executor/uniproc_executor.py", 63, "_init_executor", "self.driver_worker.init_device()"),
        _frame(
            f"{VLLM}/v1/worker/gpu_worker.py", 361, "init_device", "torch.accelerator.set_device_index(self.device)"
        ),
        _frame(f"{PACKAGE}/torch/cuda/__init__.py", 478, "_lazy_init", "torch._C._cuda_init()"),
    ]
    return traceback_text(
        frames,
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 304: OS call failed or operation not "
        "supported on this OS",
    )


def weights_oom_traceback(oom_message: str) -> str:
    frames = [
        *_ENGINE_FRAMES,
        _frame(f"{VLLM}/v1/engine/core.py", 150, "__init__", "self.model_executor = executor_class(vllm_config)"),
        _frame(f"{VLLM}/v1/executor/abstract.py", 103, "__init__", "self._init_executor()"),
        _frame(f"{VLLM}/v1/executor/uniproc_executor.py", 74, "_init_executor", "self.driver_worker.load_model()"),
        _frame(
            f"{VLLM}/v1/worker/gpu_worker.py",
            580,
            "load_model",
            "self.model_runner.load_model(load_dummy_weights=load_dummy_weights)",
        ),
        _frame(
            f"{VLLM}/v1/worker/gpu_model_runner.py",
            4996,
            "load_model",
            "self.model = model or model_loader.load_model(",
        ),
        _frame(
            f"{VLLM}/model_executor/model_loader/base_loader.py",
            61,
            "load_model",
            "self.load_weights(model, model_config)",
        ),
        _frame(
            f"{VLLM}/model_executor/model_loader/default_loader.py",
            503,
            "load_weights",
            "loaded_weights = model.load_weights(self.get_all_weights(model_config, model))",
        ),
        _frame(
            f"{VLLM}/model_executor/model_loader/weight_utils.py",
            1188,
            "safetensors_weights_iterator",
            "param = f.get_tensor(name)",
        ),
    ]
    return traceback_text(frames, f"torch.OutOfMemoryError: {oom_message}")


def kv_allocation_oom_traceback(oom_message: str) -> str:
    """The KV cache tensors do not fit (only possible when --kv-cache-memory-bytes skipped profiling)."""
    frames = [
        *_ENGINE_FRAMES,
        _frame(
            f"{VLLM}/v1/engine/core.py", 163, "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"
        ),
        _frame(
            f"{VLLM}/v1/engine/core.py",
            372,
            "_initialize_kv_caches",
            "self.model_executor.initialize_from_config(kv_cache_configs)",
        ),
        _frame(
            f"{VLLM}/v1/worker/gpu_worker.py",
            880,
            "initialize_from_config",
            "self.model_runner.initialize_kv_cache(kv_cache_config)",
        ),
        _frame(
            f"{VLLM}/v1/worker/gpu_model_runner.py",
            6830,
            "initialize_kv_cache",
            "kv_caches = self.initialize_kv_cache_tensors(",
        ),
        _frame(f"{VLLM}/v1/worker/gpu_model_runner.py", 6702, "_allocate_kv_cache_tensors", "tensor = torch.zeros("),
    ]
    return traceback_text(frames, f"torch.OutOfMemoryError: {oom_message}")


def kv_check_traceback(final_message: str) -> str:
    frames = [
        *_ENGINE_FRAMES,
        _frame(
            f"{VLLM}/v1/engine/core.py", 163, "__init__", "kv_cache_config = self._initialize_kv_caches(vllm_config)"
        ),
        _frame(f"{VLLM}/v1/engine/core.py", 321, "_initialize_kv_caches", "kv_cache_configs = get_kv_cache_configs("),
        _frame(f"{VLLM}/v1/core/kv_cache_planning.py", 1452, "get_kv_cache_configs", "_check_enough_kv_cache_memory("),
        _frame(f"{VLLM}/v1/core/kv_cache_planning.py", 57, "_check_enough_kv_cache_memory", "raise ValueError("),
    ]
    return traceback_text(frames, f"ValueError: {final_message}")


def no_kv_memory_message() -> str:
    """vllm/v1/core/kv_cache_planning.py _check_enough_kv_cache_memory, no memory at all."""
    return (
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
        "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
        f"See {KV_DOCS} for more details."
    )


def max_len_message(max_model_len: int, needed: int, available: int, estimated: int) -> str:
    """The same check when one request of the maximum length does not fit."""
    estimated_text = (
        f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated > 0 else ""
    )
    return (
        f"To serve at least one request with the model's max seq len ({max_model_len}), "
        f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({format_gib(available)} GiB). {estimated_text}Try increasing `gpu_memory_utilization` (which also "
        "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. "
        f"See {KV_DOCS} for more details."
    )


def auto_fit_impossible_message() -> str:
    return (
        "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
        "Try increasing `gpu_memory_utilization`."
    )


def free_below_requested_traceback(free: int, total: int, utilization: float, requested: int) -> str:
    """vllm/v1/worker/utils.py request_memory, raised in the worker's init_device."""
    frames = [
        *_ENGINE_FRAMES,
        _frame(f"{VLLM}/v1/engine/core.py", 150, "__init__", "self.model_executor = executor_class(vllm_config)"),
        _frame(f"{VLLM}/v1/executor/abstract.py", 103, "__init__", "self._init_executor()"),
        _frame(f"{VLLM}/v1/executor/uniproc_executor.py", 70, "_init_executor", "self.driver_worker.init_device()"),
        _frame(f"{VLLM}/v1/worker/gpu_worker.py", 542, "init_device", "self.requested_memory = request_memory("),
        _frame(f"{VLLM}/v1/worker/utils.py", 762, "request_memory", "raise ValueError("),
    ]
    return traceback_text(
        frames,
        f"ValueError: Free memory on device cuda:0 ({format_gib(free)}/{format_gib(total)} GiB) on startup is "
        f"less than desired GPU memory utilization ({utilization}, {format_gib(requested)} GiB). Decrease GPU "
        "memory utilization or reduce GPU memory used by other processes.",
    )


def pydantic_repr(value: str) -> str:
    """pydantic-core's `input_value=` rendering: the repr, cut in the middle beyond 50 characters."""
    text = repr(value)
    return text if len(text) <= 50 else text[:25] + "..." + text[-24:]


def invalid_kv_cache_dtype_traceback(value: str, valid: tuple[str, ...]) -> str:
    """vllm/config/cache.py CacheConfig._validate_cache_dtype, raised in the API server's create_engine_config."""
    frames = [
        *_CREATE_ENGINE_CONFIG_FRAMES,
        _frame(f"{VLLM}/engine/arg_utils.py", 2307, "create_engine_config", "cache_config = CacheConfig("),
        PYDANTIC_DATACLASS_INIT,
    ]
    return traceback_text(
        frames,
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
        "cache_dtype\n"
        f"  Value error, Invalid kv_cache_dtype: {value!r}. Valid values are: {list(valid)} "
        f"[type=value_error, input_value={pydantic_repr(value)}, input_type=str]\n"
        f"    For further information visit {PYDANTIC_ERRORS_URL}",
    )


_SPECULATORS_FRAMES: Final = [
    *_CREATE_ENGINE_CONFIG_FRAMES,
    _frame(f"{VLLM}/engine/arg_utils.py", 2270, "create_engine_config", "maybe_override_with_speculators("),
    _frame(
        f"{VLLM}/transformers_utils/config.py",
        831,
        "maybe_override_with_speculators",
        "config_dict, _ = PreTrainedConfig.get_config_dict(",
    ),
    _frame(
        f"{PACKAGE}/transformers/configuration_utils.py",
        919,
        "get_config_dict",
        "config_dict, kwargs = cls._get_config_dict(pretrained_model_name_or_path, **kwargs)",
    ),
    _frame(
        f"{PACKAGE}/transformers/configuration_utils.py",
        971,
        "_get_config_dict",
        "resolved_config_file = cached_file(",
    ),
    _frame(
        f"{PACKAGE}/transformers/utils/hub.py",
        370,
        "cached_file",
        "file = cached_files(path_or_repo_id=path_or_repo_id, filenames=[filename], **kwargs)",
    ),
]
_HUB_DOWNLOAD_FRAME: Final = _frame(f"{PACKAGE}/transformers/utils/hub.py", 537, "cached_files", "hf_hub_download(")


# huggingface_hub/utils/_validators.py REPO_ID_REGEX
_REPO_ID_RE: Final = re.compile(r"(\b[\w\-.]{1,96}\b/)?\b[\w\-.]{1,96}\b")


def repo_id_problem(model: str) -> tuple[str, int] | None:
    """huggingface_hub's validate_repo_id message (and its line) for a string that is no repo id, else None."""
    if model.count("/") > 1:
        return (
            "Repo id must be in the form 'repo_name' or 'namespace/repo_name':"
            f" '{model}'. Use `repo_type` argument if needed."
        ), 133
    if not _REPO_ID_RE.fullmatch(model):
        return (
            "Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or end with '-' or '.' "
            f"and the maximum length is 96: '{model}'."
        ), 139
    if "--" in model or ".." in model:
        return f"Cannot have -- or .. in repo_id: '{model}'.", 146
    if model.endswith(".git"):
        return f"Repo_id cannot end by '.git': '{model}'.", 149
    return None


def model_not_found_traceback(model: str, gated: bool, local_dir: bool = False) -> str:
    """A model vLLM cannot find, as 0.33 reports it (API server, create_engine_config).

    vLLM first reads the config with transformers (maybe_override_with_speculators), so a
    missing path, an unknown repo or a gated one ends in transformers' OSError with
    huggingface_hub's error as its cause (transformers/utils/hub.py cached_files). Only a
    local directory without config.json gets through to ModelConfig, whose `Invalid
    repository ID or local directory` ValueError pydantic reports as a ValidationError.
    """
    if local_dir:
        return traceback_text(
            [
                *_CREATE_ENGINE_CONFIG_FRAMES,
                _frame(
                    f"{VLLM}/engine/arg_utils.py",
                    2280,
                    "create_engine_config",
                    "model_config = self.create_model_config()",
                ),
                _frame(f"{VLLM}/engine/arg_utils.py", 1994, "create_model_config", "return ModelConfig("),
                PYDANTIC_DATACLASS_INIT,
            ],
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
            f"  Value error, Invalid repository ID or local directory specified: '{model}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.\n"
            f" [type=value_error, input_value=ArgsKwargs((), {{'model': '{model}', ...}}), input_type=ArgsKwargs]\n"
            f"    For further information visit {PYDANTIC_ERRORS_URL}",
        )
    problem = repo_id_problem(model)
    if problem is not None:
        invalid, line = problem
        cause = f"huggingface_hub.errors.HFValidationError: {invalid}"
        cause_frames = [
            _HUB_DOWNLOAD_FRAME,
            _frame(f"{PACKAGE}/huggingface_hub/utils/_validators.py", 85, "_inner_fn", "validate_repo_id(arg_value)"),
            _frame(
                f"{PACKAGE}/huggingface_hub/utils/_validators.py", line, "validate_repo_id", "raise HFValidationError("
            ),
        ]
        final = f"OSError: {invalid}"
        raise_line = (595, 'raise OSError(f"{e}") from e')
    elif gated:
        hub_message = (
            "401 Client Error. (Request ID: Root=1-6749a2b1-3c1f0e5d2a9b8c7d6e5f4a3b)\n"
            "\n"
            f"Cannot access gated repo for url https://huggingface.co/{model}/resolve/main/config.json.\n"
            f"Access to model {model} is restricted. You must have access to it and be authenticated to access it. "
            "Please log in."
        )
        cause = f"huggingface_hub.errors.GatedRepoError: {hub_message}"
        cause_frames = [
            _HUB_DOWNLOAD_FRAME,
            _frame(
                f"{PACKAGE}/huggingface_hub/utils/_http.py",
                892,
                "hf_raise_for_status",
                "raise _format(GatedRepoError, message, response, repo_type=repo_type, repo_id=repo_id) from e",
            ),
        ]
        final = (
            "OSError: You are trying to access a gated repo.\n"
            f"Make sure to have access to it at https://huggingface.co/{model}.\n{hub_message}"
        )
        raise_line = (610, "raise OSError(")
    else:
        cause = (
            "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. "
            "(Request ID: Root=1-6749a2b1-0a1b2c3d4e5f60718293a4b5)\n"
            "\n"
            f"Repository Not Found for url: https://huggingface.co/api/models/{model}/revision/main.\n"
            "Please make sure you specified the correct `repo_id` and `repo_type`.\n"
            "If you are trying to access a private or gated repo, make sure you are authenticated and your token "
            "has the required permissions.\n"
            "For more details, see https://huggingface.co/docs/huggingface_hub/authentication"
        )
        cause_frames = [
            _HUB_DOWNLOAD_FRAME,
            _frame(
                f"{PACKAGE}/huggingface_hub/utils/_http.py",
                953,
                "hf_raise_for_status",
                "raise _format(RepositoryNotFoundError, message, response, repo_type=repo_type, repo_id=repo_id) "
                "from e",
            ),
        ]
        final = (
            f"OSError: {model} is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having "
            "permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`"
        )
        raise_line = (569, "raise OSError(")
    outer_frames = [
        *_SPECULATORS_FRAMES,
        _frame(f"{PACKAGE}/transformers/utils/hub.py", raise_line[0], "cached_files", raise_line[1]),
    ]
    return (
        traceback_text(cause_frames, cause)
        + "\n\nThe above exception was the direct cause of the following exception:\n\n"
        + traceback_text(outer_frames, final)
    )


def max_len_over_derived_traceback(max_model_len: int, derived: int, model: str) -> str:
    """vllm/config/model.py: a --max-model-len above the model's own, as pydantic reports it."""
    frames = [
        *_CREATE_ENGINE_CONFIG_FRAMES,
        _frame(
            f"{VLLM}/engine/arg_utils.py", 2280, "create_engine_config", "model_config = self.create_model_config()"
        ),
        _frame(f"{VLLM}/engine/arg_utils.py", 1994, "create_model_config", "return ModelConfig("),
        PYDANTIC_DATACLASS_INIT,
    ]
    return traceback_text(
        frames,
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        f"  Value error, User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
        f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). To allow "
        "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN "
        "must be used with extreme caution. If the model uses relative position encoding (RoPE), positions "
        "exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, positions "
        "exceeding derived_max_model_len will cause a CUDA array out-of-bounds error. [type=value_error, "
        f"input_value=ArgsKwargs((), {{'model': '{model}', ...}}), input_type=ArgsKwargs]\n"
        f"    For further information visit {PYDANTIC_ERRORS_URL}",
    )


def address_in_use_traceback() -> str:
    frames = [
        *_CLI_FRAMES[:7],
        _frame(
            f"{VLLM}/entrypoints/launchers/api_server/entry.py",
            175,
            "run_server",
            "listen_address, sock = setup_server(args, reuse_port=False)",
        ),
        _frame(
            f"{VLLM}/entrypoints/launchers/launcher.py",
            379,
            "setup_server",
            "sock = create_server_socket(sock_addr, reuse_port=reuse_port)",
        ),
        _frame(f"{VLLM}/entrypoints/launchers/launcher.py", 353, "create_server_socket", "sock.bind(addr)"),
    ]
    return traceback_text(frames, "OSError: [Errno 98] Address already in use")


def engine_fatal_traceback() -> str:
    """What the engine's busy loop reports when the GPU fails under it."""
    frames = [
        _frame(f"{VLLM}/v1/engine/core.py", 1570, "run_engine_core", "engine_core.run_busy_loop()"),
        _frame(f"{VLLM}/v1/engine/core.py", 1612, "run_busy_loop", "self._process_engine_step()"),
        _frame(f"{VLLM}/v1/engine/core.py", 1645, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
        _frame(
            f"{VLLM}/v1/engine/core.py",
            455,
            "step",
            "model_output = self.model_executor.execute_model(scheduler_output)",
        ),
    ]
    return traceback_text(
        frames,
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
        "might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
    )


def engine_dead_traceback() -> str:
    frames = [
        _frame(
            f"{VLLM}/v1/engine/async_llm.py", 898, "output_handler", "outputs = await engine_core.get_output_async()"
        ),
        _frame(
            f"{VLLM}/v1/engine/core_client.py",
            1078,
            "get_output_async",
            "raise self._format_exception(outputs) from None",
        ),
    ]
    return traceback_text(
        frames,
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
        "for the root cause.",
    )


def keyboard_interrupt_traceback() -> str:
    """SIGTERM before uvicorn runs: entry.py's _interrupt_init raises KeyboardInterrupt('terminated')."""
    frames = [
        *_CLI_FRAMES[:7],
        _frame(
            f"{VLLM}/entrypoints/launchers/api_server/entry.py",
            176,
            "run_server",
            "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
        ),
        _frame(
            f"{VLLM}/entrypoints/launchers/api_server/entry.py",
            170,
            "_interrupt_init",
            'raise KeyboardInterrupt("terminated")',
        ),
    ]
    return traceback_text(frames, "KeyboardInterrupt: terminated")


def no_gpu_traceback() -> str:
    """vllm/config/device.py when no platform is detected (no GPU device visible)."""
    frames = [
        *_CREATE_ENGINE_CONFIG_FRAMES,
        _frame(f"{VLLM}/engine/arg_utils.py", 2259, "create_engine_config", "device_config = DeviceConfig("),
        _frame(f"{VLLM}/config/device.py", 55, "__post_init__", "raise RuntimeError("),
    ]
    return traceback_text(
        frames,
        "RuntimeError: Failed to infer device type, please set the environment variable "
        "`VLLM_LOGGING_LEVEL=DEBUG` to turn on verbose logging to help debug the issue.",
    )
