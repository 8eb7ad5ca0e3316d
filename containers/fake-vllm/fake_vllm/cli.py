"""`vllm` entry point of the stand-in: argv, environment, then the boot and the server."""

from __future__ import annotations

import os
import random
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import VLLM_VERSION, compile_cache, imports, releases
from .boot_plan import STAND_IN_PREFIX, BootInputs, CacheStatus, build_boot_plan
from .catalogue import CatalogueError, build_parser, load_catalogue, non_default_args, prepare_argv
from .engine_core import EngineLink
from .knobs import DEFAULT_COLD_BOOT_SECONDS, REAL_COLD_BOOT_SECONDS, KnobError, Knobs, parse_knobs
from .logfmt import use_colour
from .lora import LoraRegistry, parse_lora_modules
from .memory import MemoryInputs, asleep_used, plan_memory, sleep_freed
from .output import Output
from .runner import Runner, ServeContext, install_signal_handlers
from .serve_config import ServeConfig, serve_config_from
from .server import EngineState, FakeVllmHTTPServer, ServerFacts
from .timeline import phase_durations

imports.pay_import()  # as real vLLM, importing the CLI costs time (0 unless imitated)

# The argv grammar: 0.34's from FAKE_VLLM_VERSION 0.34 on, 0.33's before (as for 0.26-0.33 until now).
CATALOGUE_FILE = "vllm_args_0.34.json" if releases.RELEASE >= (0, 34) else "vllm_args_0.33.json"
GPU_NODE = re.compile(r"^nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset)$")


def catalogue_path(env: Mapping[str, str]) -> Path:
    """FAKE_VLLM_ARGS_FILE, else the catalogue next to the program (containers/fake-vllm/)."""
    if override := env.get("FAKE_VLLM_ARGS_FILE"):
        return Path(override)
    return Path(__file__).resolve().parent.parent / CATALOGUE_FILE


def gpu_listing(dev_dir: str, cuda_visible_devices: str | None) -> tuple[str, int]:
    """The stand-in's line about the GPU device nodes it sees, and how many GPUs that is."""
    try:
        names = sorted(name for name in os.listdir(dev_dir) if GPU_NODE.match(name))
    except OSError:
        names = []
    visible: set[str] | None = None
    if cuda_visible_devices is not None:
        visible = {item.strip() for item in cuda_visible_devices.split(",") if item.strip()}
    shown = []
    gpus = 0
    for name in names:
        index = name.removeprefix("nvidia")
        if index.isdigit():
            # Indices filter; UUIDs cannot be matched to nodes, so they leave every node listed.
            if visible is not None and all(item.isdigit() for item in visible) and index not in visible:
                continue
            gpus += 1
        shown.append(os.path.join(dev_dir, name))
    setting = "unset" if cuda_visible_devices is None else repr(cuda_visible_devices)
    nodes = ", ".join(shown) if shown else "none"
    return f"GPU device nodes visible (CUDA_VISIBLE_DEVICES {setting}): {nodes}", gpus


def hf_hub_cache(env: Mapping[str, str]) -> Path:
    if hub := env.get("HF_HUB_CACHE"):
        return Path(hub)
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home) / "hub"


def model_present(model: str, env: Mapping[str, str]) -> bool:
    """A local directory with config.json, or a repo id with a snapshot in the Hugging Face cache."""
    path = Path(os.path.expanduser(model))
    if path.exists():
        return (path / "config.json").is_file()
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        return False
    return (hf_hub_cache(env) / ("models--" + model.replace("/", "--")) / "snapshots").is_dir()


def _truthy_int(value: str | None) -> bool:
    try:
        return bool(int(value or "0"))
    except ValueError:
        return False


def host_ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError):
        return 64 << 30


def start_crash_timer(knobs: Knobs, output: Output) -> None:
    seconds = knobs.crash_after_seconds
    if seconds is None:
        return

    def crash() -> None:
        output.write(
            "stderr",
            f"{STAND_IN_PREFIX} simulated crash after {seconds} s (FAKE_VLLM_CRASH_AFTER_SECONDS), "
            f"exit code {knobs.crash_exit_code}\n",
        )
        os._exit(knobs.crash_exit_code)

    timer = threading.Timer(seconds, crash)
    timer.daemon = True
    timer.start()


def serve(
    config: ServeConfig,
    knobs: Knobs,
    env: Mapping[str, str],
    non_default: dict[str, object],
    model_flag: bool,
    *,
    kv_cache_dtypes: tuple[str, ...] | None,
) -> int:
    colour = use_colour(env.get("NO_COLOR"), env.get("FORCE_COLOR"), env.get("VLLM_LOGGING_COLOR"), sys.stdout.isatty())
    try:
        trace = open(knobs.trace_file, "a", encoding="utf-8") if knobs.trace_file else None  # noqa: SIM115  (open for the process's life)
    except OSError as exc:
        print(f"{STAND_IN_PREFIX} FAKE_VLLM_TRACE_FILE={knobs.trace_file!r}: {exc.strerror}", file=sys.stderr)
        return 2
    output = Output(sys.stdout, sys.stderr, colour, os.getpid(), config.tensor_parallel_size, trace=trace)
    start_crash_timer(knobs, output)
    install_signal_handlers()

    listing, gpus = gpu_listing(knobs.dev_dir, env.get("CUDA_VISIBLE_DEVICES"))
    key = compile_cache.compile_cache_key(config, knobs.gpu_name, env)
    root = compile_cache.cache_root(env)
    ranks = config.tensor_parallel_size
    hit = compile_cache.artifacts_present(root, key, ranks)
    jitter = random.randint(-knobs.kv_jitter_bytes, knobs.kv_jitter_bytes) if knobs.kv_jitter_bytes else 0
    forced = knobs.fail if knobs.fail in ("no_kv_memory", "max_len_too_large", "oom_load") else None
    memory = plan_memory(
        MemoryInputs(
            total_bytes=knobs.gpu_memory_bytes,
            used_by_others_bytes=knobs.gpu_used_bytes,
            model_bytes=knobs.model_bytes,
            kv_bytes_per_token=knobs.kv_bytes_per_token,
            model_max_len=knobs.model_max_len,
            tensor_parallel_size=ranks,
            gpu_memory_utilization=config.gpu_memory_utilization,
            max_model_len=config.max_model_len,
            kv_cache_memory_bytes=config.kv_cache_memory_bytes,
            kv_cache_dtype=config.kv_cache_dtype,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enforce_eager=config.enforce_eager,
            activation_jitter_bytes=jitter,
            forced=forced,  # type: ignore[arg-type]
        )
    )
    durations = phase_durations(hit, config.kv_cache_memory_bytes is not None, config.enforce_eager)
    if knobs.boot_seconds is not None:
        scale = knobs.boot_seconds / durations.total
    elif knobs.time_scale is not None:
        scale = knobs.time_scale
    else:
        scale = DEFAULT_COLD_BOOT_SECONDS / REAL_COLD_BOOT_SECONDS
    host = config.host or "0.0.0.0"
    listen_host = f"[{host}]" if ":" in host else host
    over_derived = (
        config.max_model_len is not None
        and config.max_model_len > knobs.model_max_len
        and env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() not in ("1", "true")
    )
    lora = LoraRegistry(config.enable_lora, config.max_lora_rank)
    runtime_updating = env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")
    inputs = BootInputs(
        lora_loads=load_static_loras(lora, config),
        lora_runtime_updating=runtime_updating,
        config=config,
        memory=memory,
        durations=durations,
        cache=CacheStatus(
            hit=hit,
            backend_dirs=tuple(str(compile_cache.backend_cache_dir(root, key, rank)) for rank in range(ranks)),
            aot_model_paths=tuple(str(compile_cache.aot_model_path(root, key, rank)) for rank in range(ranks)),
        ),
        non_default_args=non_default,
        logo=not _truthy_int(env.get("VLLM_DISABLE_LOG_LOGO")) and env.get("VLLM_CONFIGURE_LOGGING", "1") != "0",
        colour=colour,
        gpu_listing=listing,
        # vLLM's setup_server: `unix:PATH` on a socket, else the URL of host and port.
        listen_address=f"unix:{config.uds}" if config.uds else f"http://{listen_host}:{config.port}",
        api_pid=os.getpid(),
        model_flag_used=model_flag,
        fail=knobs.fail,
        model_missing=knobs.require_model and not model_present(config.model, env),
        model_is_local_dir=Path(os.path.expanduser(config.model)).is_dir(),
        no_gpu=knobs.require_gpu and gpus == 0,
        foreign_proc=_foreign_proc(),
        max_len_over_derived=over_derived,
        kv_cache_dtypes=kv_cache_dtypes,
        model_bytes=knobs.model_bytes,
        host_ram_bytes=host_ram_bytes(),
    )
    facts = ServerFacts(
        config=config,
        max_model_len=memory.max_model_len,
        num_gpu_blocks=max(0, memory.limiting_rank.available_kv) // (16 * memory.kv_bytes_per_token_rank),
        started=int(time.time()),
        token_seconds=knobs.token_seconds,
        # FAKE_VLLM_NO_DEV_MODE: a build without the dev-mode routes, whatever VLLM_SERVER_DEV_MODE says.
        dev_mode=_truthy_int(env.get("VLLM_SERVER_DEV_MODE")) and not _truthy_int(env.get("FAKE_VLLM_NO_DEV_MODE")),
        first_request_seconds=knobs.first_request_seconds,
        sleep_seconds=knobs.sleep_seconds,
        wake_seconds=knobs.wake_seconds,
        reload_seconds=knobs.reload_seconds,
        sleep_freed_bytes=sleep_freed(memory),
        kv_cache_bytes=max(0, memory.ranks[0].available_kv),
        asleep_used_bytes=asleep_used(memory),
        own_asleep_bytes=asleep_used(memory) - (memory.ranks[0].total - memory.ranks[0].init_free),
        nvml_dir=knobs.nvml_dir,
        sleep_keeps_memory=knobs.sleep_keeps_memory,
        wake_tokens_differ=knobs.wake_tokens_differ,
        tokens_differ_file=knobs.tokens_differ_file,
        lora=lora,
        lora_runtime_updating=runtime_updating,
        keep_alive_seconds=_keep_alive(env.get("VLLM_HTTP_TIMEOUT_KEEP_ALIVE")),
    )
    state = EngineState()
    server = FakeVllmHTTPServer(config.uds or (host, config.port), facts, state, output)
    engine = EngineLink(knobs.nvml_dir)
    engine.start(
        checkpoint_fail=knobs.gpu_checkpoint_fail,
        shm_dir=knobs.shm_dir,
        close_in_child=(server.socket,),
    )
    server.engine = engine
    context = ServeContext(
        config=config,
        knobs=knobs,
        output=output,
        server=server,
        state=state,
        time_scale=scale,
        write_compile_artifacts=lambda: compile_cache.write_artifacts(
            root, key, ranks, f"(1, {config.max_num_batched_tokens})"
        ),
        keep_alive_on_engine_death=_truthy_int(env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH")),
    )
    try:
        return Runner(context).run(build_boot_plan(inputs))
    finally:
        engine.close_shm()


def _foreign_proc() -> bool:
    """/proc/<our pid> is not this process: a PID namespace sharing the host's /proc (`/proc/self` is resolved
    in /proc's own namespace, so it names our host pid)."""
    try:
        return os.readlink("/proc/self") != str(os.getpid())
    except OSError:
        return False


def _keep_alive(text: str | None) -> float | None:
    """VLLM_HTTP_TIMEOUT_KEEP_ALIVE, as vllm/envs.py reads it (int, 5 unset); 0 or less: never closed idle."""
    try:
        seconds = int(text) if text else 5
    except ValueError:
        seconds = 5
    return float(seconds) if seconds > 0 else None


def load_static_loras(registry: LoraRegistry, config: ServeConfig) -> tuple[tuple[str, str, str | None], ...]:
    """`--lora-modules` loaded into the registry (init_static_loras): (name, path, error) each, up to the first
    that fails (it stops the server)."""
    modules = parse_lora_modules(config.lora_modules)
    assert not isinstance(modules, str)  # main() refused it already
    loads: list[tuple[str, str, str | None]] = []
    for module in modules:
        status, message, _ = registry.load(module.name, module.path)
        loads.append((module.name, module.path, None if status == 200 else message))
        if status != 200:
            break
    return tuple(loads)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    environment = dict(os.environ if env is None else env)
    try:
        knobs = parse_knobs(environment)
        catalogue = load_catalogue(catalogue_path(environment))
    except (KnobError, CatalogueError) as exc:
        print(f"{STAND_IN_PREFIX} {exc}", file=sys.stderr)
        return 2
    top, serve_parser = build_parser(catalogue)
    prepared = prepare_argv(arguments)
    serve_parser.search_keyword = prepared.help_keyword
    namespace = top.parse_args(list(prepared.argv))
    if namespace.subparser is None:
        top.print_help()
        return 0
    if namespace.subparser == "download-kernels":
        return releases.download_kernels(environment, dry_run=bool(getattr(namespace, "dry_run", False)))
    if namespace.subparser != "serve":
        print(
            f"{STAND_IN_PREFIX} `vllm {namespace.subparser}` is not imitated (version {VLLM_VERSION})", file=sys.stderr
        )
        return 2
    if namespace.model_tag is not None:
        namespace.model = namespace.model_tag
    non_default = non_default_args(namespace, serve_parser)
    non_default.pop("subparser", None)
    if "api_key" in non_default:
        non_default["api_key"] = "***"  # vLLM redacts api_key, hf_token (startup.py redact_sensitive_args)
    if "hf_token" in non_default:
        non_default["hf_token"] = "***"
    config = serve_config_from(namespace, environment.get("VLLM_API_KEY"))
    if getattr(namespace, "distributed_executor_backend", None) == "ray":
        from .ray_leader import join_ray_cluster

        pp = int(getattr(namespace, "pipeline_parallel_size", None) or 1)
        world_size = config.tensor_parallel_size * pp
        failed, group = join_ray_cluster(world_size, environment)
        if failed is not None:
            return failed
        if group is not None:
            from .ray_leader import run_workers

            key = compile_cache.compile_cache_key(config, knobs.gpu_name, environment)
            run_workers(group, world_size, environment, key.backend_hash, key.aot_hash)
    imports.start_engine_core(environment)
    modules = parse_lora_modules(config.lora_modules)
    if isinstance(modules, str):
        print(f"vllm serve: error: {modules}", file=sys.stderr)  # argparse's parser.error: exit 2
        return 2
    return serve(
        config, knobs, environment, non_default, prepared.model_flag_used, kv_cache_dtypes=catalogue.kv_cache_dtypes
    )
