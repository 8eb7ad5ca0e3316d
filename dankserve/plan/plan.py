"""From a host, a deployment and a vLLM release to the `vllm serve` command line, with reasons.

`plan_deployment` is pure: it reads nothing and starts nothing. The CLI and the supervisor
gather its inputs (recorded or probed host, settings, catalogue, HF cache facts, learned boot
facts) and hand it them. The steps: validate the values a user can mistype (exit 2), size the
memory (utilisation, KV dtype, TP, context; exit 4 when it cannot fit), then spell the flags
for the target release (exit 4 for a configured flag it lacks).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from dankserve.errors import ConfigError
from dankserve.host.model import Gpu, Host
from dankserve.plan import checks, extra_args, families, gpu_choice, lora, releases, rules, shm, sleep_mode
from dankserve.plan.catalogue import DEFAULT_CONTAINER_CACHE_ROOT, Catalogue, VllmCapabilities
from dankserve.plan.exposure import DEV_MODE_ENV, env_flag, exposure, exposure_warning
from dankserve.plan.models import ModelFacts, kv_element_bytes
from dankserve.plan.rules import GIB, Decision
from dankserve.plan.serve_args import option_number
from dankserve.plan.sleep_mode import SLEEP_MODE_FLAG, has_sleep_mode
from dankserve.plan.types import FlagChoice, Plan
from dankserve.settings import CpuOffloadSettings, DeploymentSettings


class _Flags:
    """The flags in argv order, each with its reason and the setting that asked for it."""

    def __init__(self) -> None:
        self.choices: list[FlagChoice] = []
        self.causes: list[tuple[str, str]] = []

    def add(self, flag: str, value: str | tuple[str, ...] | None, reason: str, cause: str) -> None:
        self.choices.append(FlagChoice(flag, value, reason))
        self.causes.append((flag, cause))

    def decision(self, flag: str, decision: Decision[Any], cause: str) -> None:
        value = decision.value
        shown = value if isinstance(value, str | tuple) or value is None else rules.number(value)
        self.add(flag, shown, decision.reason, cause)


@dataclass(frozen=True)
class Sizing:
    """The memory side of a plan: how much of which GPUs, and what fits in it."""

    utilisation: Decision[float]
    kv_cache_dtype: Decision[str]
    cpu_offload: Decision[CpuOffloadSettings | None]
    tensor_parallel: Decision[int]
    gpus: tuple[Gpu, ...]
    compute_capability: tuple[int, int]
    context: Decision[str | None]
    warnings: tuple[str, ...]
    kv_capacity: int | None = None
    """Bytes for the KV cache on each GPU (estimated, or learned from a boot)."""
    kv_bytes_per_token: float | None = None


def plan_deployment(
    name: str,
    deployment: DeploymentSettings,
    host: Host,
    caps: VllmCapabilities,
    model: ModelFacts,
    *,
    learned_kv_cache_memory_bytes: int | None = None,
    vllm_cache_root: str = DEFAULT_CONTAINER_CACHE_ROOT,
    catalogue: Catalogue | None = None,
    offload_share: rules.OffloadShare | None = None,
    adapters: Sequence[lora.AdapterFacts] = (),
    socket: str | None = None,
    gateway: releases.GatewayQueue | None = None,
) -> Plan:
    """The plan for one deployment; raises InvalidInput (exit 2) or InfeasiblePlan (exit 4).

    `socket`: the unix socket path vLLM binds (`--uds`: the deployment's private socket), None: TCP host:port.
    `offload_share`: the host RAM this deployment shares with the others for CPU KV offload (None: it is alone).
    `adapters`: the LoRA adapters' facts (read from their directories by `planning`).
    `gateway`: the gateway's queue for this deployment (None: no gateway), which vLLM's admission follows."""
    absorbed = extra_args.absorb(deployment, name)
    deployment = absorbed.deployment
    validate_values(deployment, caps, catalogue)
    releases.check_removed(name, deployment.extra_args, deployment.env, caps, catalogue)
    assigned = checks.resolve_gpus(host, deployment.gpus, name)
    checks.check_has_gpus(assigned, name)
    lora_plan = lora.lora_sizing(adapters, model)
    sizing = size_memory(
        deployment,
        host,
        caps,
        replace(model, parameter_bytes=model.parameter_bytes + lora_plan.slot_bytes)
        if lora_plan.slot_bytes and model.parameter_bytes is not None
        else model,
        assigned=assigned,
        learned_kv_cache_memory_bytes=learned_kv_cache_memory_bytes,
    )
    warnings = [*caps.warnings, *sizing.warnings]
    flags = _Flags()
    warnings += memory_flags(flags, deployment, sizing, caps, learned_kv_cache_memory_bytes)
    warnings += offload_flags(flags, deployment, host, sizing, caps, share=offload_share)
    serving_flags(flags, deployment)
    admission_flags(flags, caps, gateway)
    warnings += model_flags(flags, deployment, model, caps)
    access_log_flags(flags, caps, sleeping=has_sleep_mode(deployment))
    numa = rules.numa_binding(host, sizing.gpus, deployment.numa_bind)
    numa_bind, numa_warnings = numa_flags(flags, numa, deployment.numa_bind, caps)
    warnings += numa_warnings
    placement_flags(flags, deployment, socket)
    warnings += lora_flags(flags, adapters, lora_plan)
    swap_reason, swap_env, swap_warnings = sleep_mode.for_swap(deployment, caps)
    snapshot_reason, snapshot_env, snapshot_note = sleep_mode.for_snapshot(
        deployment, caps, socket, sizing.tensor_parallel.value
    )
    for reason, cause in ((swap_reason, "swap_group"), (snapshot_reason, "snapshot")):
        if reason is not None:
            flags.add(SLEEP_MODE_FLAG, None, reason, cause)
    warnings += swap_warnings
    swap_env = {**snapshot_env, **swap_env}
    checks.check_flags_supported(flags.causes, caps, catalogue)
    warnings += [*host.warnings, *rules.host_warnings(host, sizing.gpus), *rules.env_warnings(deployment.env)]
    unknown_extra = [a for a in deployment.extra_args if a.startswith("--") and not caps.has(a.split("=", 1)[0])]
    if unknown_extra:
        warnings.append(f"extra_args not known to vLLM {caps.version}: {', '.join(unknown_extra)} (passed as given)")
    choices = _replace_from_extra(flags.choices, absorbed.replaced)
    env = rules.container_env(
        vllm_cache_root,
        numa_bind,
        {**legacy_env(deployment, caps), **swap_env, **lora.runtime_update_env(adapters), **deployment.env},
    )
    exposed = exposure(
        socket,
        deployment.host,
        deployment.port,
        dev_mode=env_flag(env, DEV_MODE_ENV),
        lora_updating=env_flag(env, lora.RUNTIME_UPDATE_ENV),
        keyed=deployment.api_key_file is not None,
        runtime=deployment.runtime,
    )
    if (warning := exposure_warning(exposed)) is not None:
        warnings.append(warning)
    kernels = releases.kernel_download(
        caps,
        vllm_cache_root,
        first_boot=learned_kv_cache_memory_bytes is None,
        container=deployment.runtime == "podman" and not deployment.uses_launcher,
    )
    notes = [releases.kv_sizing_note(caps, learned_kv_cache_memory_bytes)]
    notes.append(kernels.describe() if kernels is not None and kernels.download else None)
    uses_launcher, why_launcher = deployment.launcher_choice()
    ram = host.memory.total_bytes  # a container's /dev/shm is sized by it (shm.py)
    notes += [f"launcher: {'used' if uses_launcher else 'not used'} ({why_launcher})", shm.shm_note(deployment, ram)]
    notes.append(snapshot_note)

    argv: list[str] = [deployment.model]
    for choice in choices:
        argv.extend(choice.tokens())
    argv.extend(deployment.extra_args)  # verbatim, last
    max_num_seqs = next(
        (int(c.value) for c in choices if c.flag == "--max-num-seqs" and isinstance(c.value, str)), None
    )
    return Plan(
        deployment=name,
        image=deployment.image,
        model=deployment.model,
        vllm_version=caps.version,
        argv=tuple(argv),
        env=env,
        flags=tuple(choices),
        warnings=tuple(warnings),
        gpu_indices=tuple(g.index for g in sizing.gpus),
        gpu_uuids=tuple(g.uuid for g in sizing.gpus),
        tensor_parallel_size=sizing.tensor_parallel.value,
        numa_bind=numa_bind,
        fingerprint=fingerprint(
            name, deployment, host, caps, model, gpus=sizing.gpus, vllm_cache_root=vllm_cache_root, socket=socket
        ),
        gpu_memory_utilization=sizing.utilisation.value,
        weights_bytes=model.parameter_bytes,
        sleep_mode=SLEEP_MODE_FLAG in argv,
        max_model_len=sizing.context.value,
        kv_cache_dtype=sizing.kv_cache_dtype.value,
        capacity=rules.capacity(
            sizing.context.value,
            model.max_position_embeddings,
            sizing.kv_capacity,
            sizing.kv_bytes_per_token,
            max_num_seqs,
        ),
        host_ram_bytes=host_ram_bytes(argv, sizing.tensor_parallel.value) + lora_plan.host_bytes,
        lora_mounts=tuple((a.host_dir, a.server_path) for a in adapters if a.host_dir is not None),
        exposure=exposed,
        notes=tuple(n for n in notes if n),
        kernels=kernels,
        shm_size=shm.shm_choice(deployment, ram).value,
    )


LORA_ONLY_FACTS = frozenset({"hidden_size", "intermediate_size"})


def lora_flags(flags: _Flags, adapters: Sequence[lora.AdapterFacts], sizing: lora.LoraSizing) -> list[str]:
    """vLLM's LoRA flags for the configured adapters (plan/lora.py's rules)."""
    for flag, value, reason in lora.flag_choices(adapters, sizing):
        flags.add(flag, value, reason, "adapters")
    return [sizing.slot_reason] if adapters and not sizing.slot_bytes else []


def _replace_from_extra(choices: list[FlagChoice], replaced: frozenset[str]) -> list[FlagChoice]:
    """Planned flags that extra_args sets: setting-backed ones say so, the others give way to extra_args."""
    from dankserve.plan.extra_args import SETTING_FLAGS

    kept: list[FlagChoice] = []
    for choice in choices:
        if choice.flag not in replaced:
            kept.append(choice)
        elif choice.flag in SETTING_FLAGS:
            kept.append(FlagChoice(choice.flag, choice.value, f"set in extra_args ({choice.flag}); {choice.reason}"))
    return kept


def host_ram_bytes(argv: Sequence[str], tensor_parallel_size: int) -> int:
    """Host RAM the server pins besides its process: CPU KV offload (a total; `--swap-space` is per
    GPU) and offloaded weights (`--cpu-offload-gb` is per GPU), read from the final argv as vLLM reads it."""
    total = (option_number(argv, "--kv-offloading-size") or 0.0) * GIB
    for per_gpu in ("--swap-space", "--cpu-offload-gb"):
        total += (option_number(argv, per_gpu) or 0.0) * GIB * tensor_parallel_size
    return int(total)


def model_flags(flags: _Flags, deployment: DeploymentSettings, model: ModelFacts, caps: VllmCapabilities) -> list[str]:
    """The model family's reasoning and tool-call parsers (each switchable off)."""
    proposed, warnings = families.family_flags(model, caps, deployment.reasoning_parser, deployment.tool_call_parser)
    for f in proposed:
        flags.add(f.flag, f.value, f.reason, f.cause)
    return warnings


def check_inputs(
    name: str, deployment: DeploymentSettings, host: Host, caps: VllmCapabilities, catalogue: Catalogue | None
) -> None:
    """What plan_deployment checks of the user's values (exit 2), without model facts: run before
    fetching them, so a typo is reported as such even where the Hub cannot be reached."""
    deployment = extra_args.absorb(deployment, name).deployment
    validate_values(deployment, caps, catalogue)
    releases.check_removed(name, deployment.extra_args, deployment.env, caps, catalogue)
    checks.resolve_gpus(host, deployment.gpus, name)


def legacy_env(deployment: DeploymentSettings, caps: VllmCapabilities) -> dict[str, str]:
    """Settings that releases before the matching flag took from the environment."""
    backend = attention_backend(deployment)
    if backend is not None and not caps.has("--attention-backend"):
        return {"VLLM_ATTENTION_BACKEND": backend}
    return {}


def validate_values(deployment: DeploymentSettings, caps: VllmCapabilities, catalogue: Catalogue | None) -> None:
    """Values a user can mistype: exit 2 (or 4 for a method a newer release has) before any arithmetic."""
    if deployment.kv_cache_dtype is not None:
        checks.check_kv_cache_dtype(deployment.kv_cache_dtype, caps, catalogue)
    if deployment.attention_backend is not None:
        checks.check_attention_backend(deployment.attention_backend, caps)
    if deployment.speculative is not None:
        checks.check_speculative_method(deployment.speculative.method, caps, catalogue)
    if deployment.max_model_len == "auto":
        checks.check_max_model_len_auto(caps, catalogue)
    if not isinstance(deployment.kv_offload, str) and deployment.kv_offload <= 0:
        raise ConfigError(
            f"kv_offload = {deployment.kv_offload} is not a positive number of GiB",
            fix='set kv_offload to a positive GiB amount, "auto" or "off"',
        )


def size_memory(
    deployment: DeploymentSettings,
    host: Host,
    caps: VllmCapabilities,
    model: ModelFacts,
    *,
    assigned: tuple[Gpu, ...],
    learned_kv_cache_memory_bytes: int | None,
) -> Sizing:
    """Utilisation, KV dtype, TP and context length, with the fit checks (exit 4)."""
    warnings: list[str] = []
    smallest = rules.smallest_gpu(assigned)
    low = min(tuple(g.compute_capability) for g in assigned)
    cc = (low[0], low[1])
    dtype = rules.kv_cache_dtype(deployment.kv_cache_dtype, cc, deployment.attention_backend, caps)
    element_bytes = kv_element_bytes(dtype.value, model.dtype_bytes)
    offload = rules.cpu_offload(deployment.cpu_offload)
    offload_per_gpu = int(offload.value.gib * GIB) if offload.value is not None else 0

    def kv_per_token(tp: int) -> float | None:
        return model.kv_bytes_per_token(element_bytes, tp) if element_bytes is not None else None

    wanted = deployment.max_model_len if isinstance(deployment.max_model_len, int) else None
    by_fit = deployment.gpu_memory_utilization is None and model.parameter_bytes is not None
    if by_fit:  # TP by the band's top; then the lowest point of the band that holds it
        row = rules.utilisation_row(smallest)
        util = Decision(row.top, "")
    else:
        util = rules.gpu_memory_utilization(assigned, deployment.gpu_memory_utilization)
    budget = int(util.value * smallest.memory_total_bytes)
    tp = rules.tensor_parallel_size(
        len(assigned),
        budget,
        model,
        deployment.tensor_parallel_size,
        kv_one_sequence_at=_one_sequence(wanted, len(assigned), kv_per_token),
        cpu_offload_bytes_per_gpu=offload_per_gpu,
    )
    if by_fit and model.parameter_bytes is not None:
        util = _utilisation_by_fit(
            deployment, model, assigned, tp=tp.value, offload_per_gpu=offload_per_gpu, per_token=kv_per_token(tp.value)
        )
        budget = int(util.value * smallest.memory_total_bytes)
        reason = _refit_reason(
            tp, budget, model, offload_per_gpu=offload_per_gpu, wanted=wanted, kv_per_token=kv_per_token
        )
        tp = Decision(tp.value, reason)
    checks.check_tensor_parallel(tp.value, len(assigned), model)
    chosen = gpu_choice.choose_gpus(host, assigned, tp.value)
    used = chosen.value
    checks.check_cores(host, tp.value)
    if len(used) < len(assigned):
        tp = Decision(tp.value, f"{tp.reason}; uses {chosen.reason}")
        warnings.append(_idle_warning(assigned, used, tp.value))
    if model.missing:
        warnings.append(
            f"model facts unknown for {model.model} ({', '.join(model.missing)}): the checks needing them are "
            "skipped; cache the model under hf_cache_dir or declare model_facts"
        )

    kv_capacity: int | None = None
    if model.parameter_bytes is not None:
        fit = rules.gpu_fit(tp.value, budget, model.parameter_bytes, 0, offload_per_gpu)
        checks.check_weights_fit(fit, model, len(assigned), util.value)
        kv_capacity = fit.kv_capacity
    if learned_kv_cache_memory_bytes is not None:
        kv_capacity = learned_kv_cache_memory_bytes  # measured by vLLM itself on the first boot
    per_token = kv_per_token(tp.value)
    warnings += _unestimated_kv(model, per_token, dtype.value if element_bytes is None else None)
    if wanted is not None and kv_capacity is not None and per_token is not None:
        checks.check_max_model_len(wanted, kv_capacity, per_token, caps)
    context = rules.max_model_len(
        deployment.max_model_len,
        model,
        kv_capacity=kv_capacity,
        kv_bytes_per_token=per_token,
        supports_auto=caps.max_model_len_auto,
    )
    if deployment.kv_cache_dtype in rules.FP8_FAMILY:
        ok, why = rules.fp8_supported(cc, deployment.attention_backend)
        if not ok:
            warnings.append(f"kv_cache_dtype {deployment.kv_cache_dtype} may fail here: {why}")
    return Sizing(util, dtype, offload, tp, used, cc, context, tuple(warnings), kv_capacity, per_token)


def _unestimated_kv(model: ModelFacts, per_token: float | None, unknown_dtype: str | None) -> list[str]:
    """Why the plan gives no KV-cache figure (none when it gives one)."""
    if per_token is not None:
        return []
    if model.kv_layout_note:
        return [f"KV-cache size not estimated for {model.model}: {model.kv_layout_note}"]
    if unknown_dtype is not None:
        return [
            f"KV-cache size not estimated for {model.model}: the element size of --kv-cache-dtype {unknown_dtype} "
            "is not known here (context and concurrency are not checked)"
        ]
    return []


def _idle_warning(assigned: tuple[Gpu, ...], used: tuple[Gpu, ...], tp: int) -> str:
    idle = [g.index for g in assigned if g not in used]
    several = len(idle) > 1
    return (
        f"uses {len(used)} of the {len(assigned)} assigned GPUs (tensor parallel size {tp}): "
        f"GPUs {', '.join(str(g.index) for g in used)}; GPU{'s' if several else ''} "
        f"{', '.join(map(str, idle))} stay{'' if several else 's'} idle (narrow gpus to free "
        f"{'them' if several else 'it'} for another deployment, or set tensor_parallel_size to use "
        f"{'them' if several else 'it'})"
    )


def _utilisation_by_fit(
    deployment: DeploymentSettings,
    model: ModelFacts,
    assigned: tuple[Gpu, ...],
    *,
    tp: int,
    offload_per_gpu: int,
    per_token: float | None,
) -> Decision[float]:
    """The band's lowest point holding weights, reserve and one request of the wanted context."""
    assert model.parameter_bytes is not None
    base = rules.gpu_fit(tp, 0, model.parameter_bytes, 0, offload_per_gpu)
    required = base.weights + base.reserve
    what = f"weights {rules.gib(base.weights)} + reserve {rules.gib(base.reserve)}"
    length: int | None = None
    if isinstance(deployment.max_model_len, int):
        length = deployment.max_model_len
    elif deployment.max_model_len is None:
        length = model.max_position_embeddings
    desired = required
    if length is not None and per_token is not None:
        kv = int(length * per_token)
        desired = required + kv
        what += f" + KV for one {length:,}-token request {rules.gib(kv)}"
        if isinstance(deployment.max_model_len, int):
            required = desired
    if deployment.swap_group == "auto":  # grouped by fit: plan just the bytes it needs
        return rules.utilisation_for_bytes(assigned, required, desired, what)
    return rules.utilisation_by_fit(assigned, required, desired, what)


def _refit_reason(
    tp: Decision[int],
    budget: int,
    model: ModelFacts,
    *,
    offload_per_gpu: int,
    wanted: int | None,
    kv_per_token: Callable[[int], float | None],
) -> str:
    """The TP reason with the fit at the chosen utilisation (it was chosen at the band's top)."""
    if model.parameter_bytes is None or "set in config" in tp.reason or "no split" in tp.reason:
        return tp.reason
    per_token = kv_per_token(tp.value)
    kv = int(wanted * per_token) if wanted is not None and per_token is not None else 0
    fit = rules.gpu_fit(tp.value, budget, model.parameter_bytes, kv, offload_per_gpu)
    head = tp.reason.split(":", 1)[0]
    return f"{head}: {fit.describe()}"


def _one_sequence(length: int | None, gpu_count: int, kv_per_token: Callable[[int], float | None]) -> dict[int, int]:
    """KV bytes of one `length`-token sequence per GPU, for each TP size (empty when unknown)."""
    if length is None:
        return {}
    sizes: dict[int, int] = {}
    for t in range(1, gpu_count + 1):
        per_token = kv_per_token(t)
        if per_token is not None:
            sizes[t] = int(length * per_token)
    return sizes


def memory_flags(
    flags: _Flags,
    deployment: DeploymentSettings,
    sizing: Sizing,
    caps: VllmCapabilities,
    learned_kv_cache_memory_bytes: int | None,
) -> list[str]:
    """TP, utilisation, a learned KV size, context length, KV dtype, attention backend."""
    warnings: list[str] = []
    flags.decision("--tensor-parallel-size", sizing.tensor_parallel, "tensor_parallel_size")
    flags.decision("--gpu-memory-utilization", sizing.utilisation, "gpu_memory_utilization")
    if learned_kv_cache_memory_bytes is not None:
        if caps.has("--kv-cache-memory-bytes"):
            flags.add(
                "--kv-cache-memory-bytes",
                str(learned_kv_cache_memory_bytes),
                "learned from the first boot's log: vLLM skips memory profiling "
                "(and then ignores --gpu-memory-utilization)" + releases.kv_sizing_reason(caps),
                "a learned KV-cache size",
            )
        else:
            warnings.append(f"vLLM {caps.version} has no --kv-cache-memory-bytes: the learned KV-cache size is unused")
    if sizing.context.value is not None:
        flags.decision("--max-model-len", sizing.context, "max_model_len")
    flags.decision("--kv-cache-dtype", sizing.kv_cache_dtype, "kv_cache_dtype")
    backend = attention_backend(deployment)
    if backend is not None and caps.has("--attention-backend"):
        flags.add("--attention-backend", backend, "set in config (attention_backend)", "attention_backend")
    elif backend is not None:
        warnings.append(f"vLLM {caps.version} has no --attention-backend: passed as VLLM_ATTENTION_BACKEND={backend}")
    return warnings


def attention_backend(deployment: DeploymentSettings) -> str | None:
    """The configured attention backend as vLLM names it (None: vLLM chooses, also for `auto`)."""
    value = deployment.attention_backend
    if value is None or value.lower() == "auto":
        return None
    return value.upper()


def offload_flags(
    flags: _Flags,
    deployment: DeploymentSettings,
    host: Host,
    sizing: Sizing,
    caps: VllmCapabilities,
    *,
    share: rules.OffloadShare | None = None,
) -> list[str]:
    """CPU KV offload (by RAM, shared with the other deployments) and, only when configured, weights in CPU memory."""
    warnings: list[str] = []
    swap = rules.kv_offload_gib(host.memory, deployment.kv_offload, share)
    if swap.value is not None:
        spelt = rules.kv_offload_flags(swap.value, sizing.tensor_parallel.value, caps)
        for i, (flag, value, why) in enumerate(spelt.flags):
            flags.add(flag, value, f"{swap.reason}; {why}" if i == 0 else why, "kv_offload")
        if spelt.note:
            warnings.append(spelt.note + ": no CPU KV offload")
        available = host.memory.available_bytes
        if not isinstance(deployment.kv_offload, str) and available is not None and swap.value * GIB > available:
            warnings.append(
                f"kv_offload {rules.number(swap.value)} GiB exceeds the {rules.gib(available)} of RAM available"
            )
    offload = sizing.cpu_offload.value
    if offload is not None:
        flags.add("--cpu-offload-gb", rules.number(offload.gib), sizing.cpu_offload.reason, "cpu_offload.gib")
        if offload.params:
            flags.add(
                "--cpu-offload-params",
                tuple(offload.params),
                "set in config: only these parameters are offloaded",
                "cpu_offload.params",
            )
        warnings.append(
            "cpu_offload keeps weights in CPU memory: every forward pass copies them over PCIe, "
            "so latency rises a lot (a memory-saving measure, not a speed-up)"
        )
    return warnings


def serving_flags(flags: _Flags, deployment: DeploymentSettings) -> None:
    """Batching from the profile, CUDA graphs, speculative decoding."""
    speculative = deployment.speculative is not None
    flags.decision(
        "--max-num-batched-tokens",
        rules.max_num_batched_tokens(deployment.profile, deployment.max_num_batched_tokens),
        "max_num_batched_tokens",
    )
    flags.decision(
        "--max-num-seqs", rules.max_num_seqs(deployment.profile, speculative, deployment.max_num_seqs), "max_num_seqs"
    )
    if deployment.enforce_eager:
        flags.add(
            "--enforce-eager", None, "set in config: no CUDA graphs (faster start, slower serving)", "enforce_eager"
        )
    if deployment.speculative is not None:
        flags.decision(
            "--speculative-config", rules.speculative_config(deployment.speculative, deployment.profile), "speculative"
        )
    if deployment.served_model_name is not None:
        flags.add(
            "--served-model-name",
            deployment.served_model_name,
            "set in config: the name clients send as `model` (and the gateway lists)",
            "served_model_name",
        )


def admission_flags(flags: _Flags, caps: VllmCapabilities, gateway: releases.GatewayQueue | None) -> None:
    """vLLM's own admission (`--max-num-queued-reqs`) from the gateway's queue, where the release has it."""
    seqs = next((c.value for c in flags.choices if c.flag == "--max-num-seqs" and isinstance(c.value, str)), None)
    queued = releases.queued_reqs(caps, gateway, int(seqs) if seqs is not None else None)
    if queued is not None:
        flags.add(releases.QUEUED_REQS_FLAG, str(queued[0]), queued[1], "the gateway's queue")


PROBED_ENDPOINTS = ("/health", "/metrics", "/ping")
"""What dankserve itself asks the server all the time: kept out of its access log."""
SWAP_PROBED_ENDPOINTS = ("/is_sleeping",)
"""What it asks a swap group's member besides (every sleep and wake polls it: 44 % of a group's lines)."""


def access_log_flags(flags: _Flags, caps: VllmCapabilities, *, sleeping: bool = False) -> None:
    """Keep dankserve's own probes out of the server's access log, where the release can; `sleeping`: a
    member of a swap group, whose sleeps and wakes poll /is_sleeping."""
    if caps.has("--disable-access-log-for-endpoints"):
        endpoints = PROBED_ENDPOINTS + (SWAP_PROBED_ENDPOINTS if sleeping else ())
        flags.add(
            "--disable-access-log-for-endpoints",
            ",".join(endpoints),
            "dankserve polls /health and reads /metrics all the time"
            + (", and /is_sleeping at each sleep and wake" if sleeping else "")
            + ": their lines would drown the requests",
            "dankserve's probes",
        )


def numa_flags(
    flags: _Flags, numa: Decision[tuple[int, ...] | None], configured: bool | None, caps: VllmCapabilities
) -> tuple[bool, list[str]]:
    """`--numa-bind` (and `--numa-bind-nodes`, one node per GPU) where the release has them."""
    if numa.value is None:
        return False, []
    if not caps.has("--numa-bind"):
        if configured:
            flags.add("--numa-bind", None, numa.reason, "numa_bind = true")  # the flag check reports it
            return True, []
        return False, [f"vLLM {caps.version} has no --numa-bind: workers are not bound to NUMA nodes"]
    flags.add(
        "--numa-bind",
        None,
        numa.reason + "; needs VLLM_WORKER_MULTIPROC_METHOD=spawn, numactl in the image and SYS_NICE",
        "numa_bind",
    )
    if numa.value and caps.has("--numa-bind-nodes"):
        nodes = tuple(str(n) for n in numa.value)
        flags.add("--numa-bind-nodes", nodes, "the NUMA node of each GPU, in GPU order", "numa_bind")
    return True, []


def placement_flags(flags: _Flags, deployment: DeploymentSettings, socket: str | None) -> None:
    """The model revision, and the address: the private socket, or TCP for the process runtime (a container
    on TCP is given its address by the runtime)."""
    if deployment.revision is not None:
        flags.add("--revision", deployment.revision, "set in config (revision)", "revision")
    if socket is not None:
        flags.add(
            "--uds",
            socket,
            "the server listens on a unix socket in a 0700 directory: only dankserve can connect (every route, "
            "the ones vLLM's key does not guard too); clients come through the gateway",
            "listen",
        )
    elif deployment.runtime == "process":
        flags.add("--host", deployment.host, "process runtime: the server binds the host address itself", "host")
        flags.add("--port", str(deployment.port), "process runtime: the server listens on the port itself", "port")


def _settings_payload(deployment: DeploymentSettings) -> dict[str, Any]:
    """The settings as the fingerprint hashes them: LoRA's keys only when set, so a server planned before
    they existed keeps its fingerprint (and is adopted, not replaced, after an upgrade)."""
    dumped = deployment.model_dump(mode="json")
    del dumped["listen"]  # the fingerprint holds where the server listens as resolved (`socket`), not the key
    dumped.update(shm.fingerprinted(deployment))
    if not dumped["adapters"]:
        del dumped["adapters"]
    facts = dumped.get("model_facts")
    if isinstance(facts, dict):
        for key in LORA_ONLY_FACTS:
            if facts.get(key) is None:
                facts.pop(key, None)
    return dumped


def fingerprint(
    name: str,
    deployment: DeploymentSettings,
    host: Host,
    caps: VllmCapabilities,
    model: ModelFacts,
    *,
    gpus: tuple[Gpu, ...],
    vllm_cache_root: str,
    socket: str | None = None,
) -> str:
    """sha256 of the configuration and the host's totals: never live free memory, never learned values.

    Equal inputs give equal fingerprints, so a learned KV-cache size can be keyed by it and reused
    only while the deployment, the GPUs, the vLLM release and the model are the same."""
    payload = {
        "deployment": name,
        "settings": _settings_payload(deployment),
        "vllm": caps.version,
        "vllm_cache_root": vllm_cache_root,
        "gpus": [
            {"name": g.name, "memory_total_bytes": g.memory_total_bytes, "cc": list(g.compute_capability)} for g in gpus
        ],
        "host": {
            "physical_cores": host.cpu.physical_cores,
            "logical_cores": host.cpu.logical_cores,
            "memory_total_bytes": host.memory.total_bytes,
            "numa_nodes": len(host.numa_nodes),
        },
        # The sizes only LoRA reads follow from the model itself: kept out, so fingerprints stay as they were.
        "model": {k: v for k, v in asdict(model).items() if k not in LORA_ONLY_FACTS},
    }
    if socket is not None:  # a server on TCP keeps the fingerprint it had before sockets existed (it is adopted)
        payload["socket"] = socket
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
