"""Checks run before anything starts. Each raises the documented error, naming value and fix.

exit 2 (InvalidInput): an unknown KV-cache dtype, attention backend or speculative method, and
`gpus` naming a GPU the host lacks. exit 4 (InfeasiblePlan): too few physical cores, weights
or a context length that cannot fit, a tensor-parallel size that does not divide the heads or
exceeds the GPUs, GPUs shared beyond 0.95, and flags the target vLLM release lacks.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dankserve.errors import ConfigError, InfeasiblePlan, UnknownValueError
from dankserve.host.model import Gpu, Host
from dankserve.plan.catalogue import Catalogue, VllmCapabilities
from dankserve.plan.models import ModelFacts
from dankserve.plan.rules import GpuFit, divides_heads, gib, host_ram_limit, largest_context
from dankserve.plan.types import Plan
from dankserve.settings import DeploymentSettings

MAX_SHARED_UTILISATION = 0.95
BASE_PROCESSES = 2  # the API server and the engine core, besides one worker per GPU (seeds)

# Names from other engines mapped to the closest vLLM KV-cache dtypes.
KV_DTYPE_ALIASES: dict[str, tuple[str, ...]] = {
    "q8_0": ("fp8", "int8_per_token_head"),
    "q8": ("fp8", "int8_per_token_head"),
    "int8": ("int8_per_token_head", "fp8"),
    "f8": ("fp8",),
    "q4_0": ("int4_per_token_head", "nvfp4", "turboquant_4bit_nc"),
    "q4": ("int4_per_token_head", "nvfp4", "turboquant_4bit_nc"),
    "int4": ("int4_per_token_head", "nvfp4"),
    "f16": ("float16",),
    "fp16": ("float16",),
    "half": ("float16",),
    "bf16": ("bfloat16",),
}


def suggest_kv_cache_dtypes(value: str, valid: Sequence[str]) -> tuple[str, ...]:
    """The valid dtypes closest to an unknown one (known aliases first, then spelling)."""
    aliases = [d for d in KV_DTYPE_ALIASES.get(value.lower(), ()) if d in valid]
    close = difflib.get_close_matches(value.lower(), valid, n=2, cutoff=0.6)
    return tuple(dict.fromkeys([*aliases, *close]))


def check_kv_cache_dtype(value: str, caps: VllmCapabilities, catalogue: Catalogue | None = None) -> None:
    """An unknown `kv_cache_dtype` (e.g. llama.cpp's q8_0) is invalid input: exit 2; one that only
    newer releases have is infeasible with this one: exit 4."""
    valid = caps.kv_cache_dtypes
    if not valid or value in valid:
        return
    _refuse_if_newer(
        catalogue, "kv_cache_dtypes", value, caps, what="kv_cache_dtype", otherwise=f"one of: {', '.join(valid)}"
    )
    suggestions = suggest_kv_cache_dtypes(value, valid)
    closest = f"; closest: {' or '.join(suggestions)}" if suggestions else ""
    raise UnknownValueError(
        f"kv_cache_dtype {value!r} is not a vLLM {caps.version} KV-cache dtype{closest}. "
        f"Valid: {', '.join(valid)} ({caps.kv_cache_dtypes_source})",
        fix=f"set kv_cache_dtype to one of those (e.g. {suggestions[0] if suggestions else 'auto'}), or leave it unset",
    )


def check_attention_backend(value: str, caps: VllmCapabilities) -> None:
    """An attention backend that this vLLM release does not name is invalid input: exit 2."""
    valid = caps.attention_backends
    if not valid or value.upper() in valid or value.lower() == "auto":
        return
    close = difflib.get_close_matches(value.upper(), valid, n=2, cutoff=0.6)
    raise UnknownValueError(
        f"attention_backend {value!r} is not a vLLM {caps.version} attention backend"
        + (f"; closest: {' or '.join(close)}" if close else "")
        + f". Valid: {', '.join(valid)}",
        fix="set attention_backend to one of those, or leave it unset so vLLM chooses",
    )


def check_speculative_method(method: str, caps: VllmCapabilities, catalogue: Catalogue | None = None) -> None:
    """A method this release lacks: exit 4 if a newer release has it, else exit 2 (unknown)."""
    valid = caps.speculative_methods
    if not valid or method in valid:
        return
    _refuse_if_newer(
        catalogue,
        "speculative_methods",
        method,
        caps,
        what="speculative method",
        otherwise=f"another method ({', '.join(valid)})",
    )
    close = difflib.get_close_matches(method, valid, n=2, cutoff=0.6)
    raise UnknownValueError(
        f"speculative.method {method!r} is not a vLLM speculative method"
        + (f"; closest: {' or '.join(close)}" if close else "")
        + f". Valid in {caps.version}: {', '.join(valid)}",
        fix="set speculative.method to one of those",
    )


def _refuse_if_newer(
    catalogue: Catalogue | None, fact: str, value: str, caps: VllmCapabilities, *, what: str, otherwise: str
) -> None:
    """A value only later releases know is infeasible with this one (exit 4), naming the first."""
    newer = _first_release_with_fact(catalogue, fact, value) if catalogue else None
    if newer is not None:
        raise InfeasiblePlan(
            f"{what} {value!r} is not in vLLM {caps.version}; it appears in {newer}",
            fix=f"use an image of vLLM {newer} or newer, or {otherwise}",
        )


def _first_release_with_fact(catalogue: Catalogue, fact: str, value: str) -> str | None:
    for version in catalogue.releases:
        if value in catalogue.entries[version]["facts"].get(fact, {}).get("value", ()):
            return version
    return None


def resolve_gpus(host: Host, refs: Sequence[int | str] | None, deployment: str) -> tuple[Gpu, ...]:
    """The GPUs a deployment may use, in PCI bus order; naming one the host lacks is exit 2."""
    if refs is None:
        return tuple(sorted(host.gpus, key=lambda g: g.index))
    found: list[Gpu] = []
    for ref in refs:
        gpu = host.gpu(ref)
        if gpu is None:
            have = ", ".join(f"{g.index} ({g.uuid})" for g in host.gpus) or "none"
            raise ConfigError(
                f"deployments.{deployment}.gpus names GPU {ref!r}, which this host does not have (GPUs: {have})",
                fix="list GPU indices or UUIDs from `dankserve probe`, or leave gpus out to use all",
            )
        found.append(gpu)
    return tuple(sorted(found, key=lambda g: g.index))


def check_has_gpus(gpus: Sequence[Gpu], deployment: str) -> None:
    """A deployment needs at least one GPU: exit 4."""
    if not gpus:
        raise InfeasiblePlan(
            f"deployment {deployment!r} has no GPU to run on: the host description lists none",
            fix="run on a host with an NVIDIA GPU (check `dankserve probe`)",
        )


def check_cores(host: Host, gpu_count: int) -> None:
    """Physical cores below 2 + GPUs (API server, engine core, one worker per GPU): exit 4."""
    need = BASE_PROCESSES + gpu_count
    if host.cpu.physical_cores < need:
        raise InfeasiblePlan(
            f"{host.cpu.physical_cores} physical CPU cores for {gpu_count} GPU worker(s): vLLM needs at least "
            f"{need} (API server + engine core + one per GPU)",
            fix=f"use fewer GPUs (tensor_parallel_size <= {max(0, host.cpu.physical_cores - BASE_PROCESSES)}) "
            "or a host with more cores",
        )


def check_tensor_parallel(tensor_parallel_size: int, gpu_count: int, model: ModelFacts) -> None:
    """TP larger than the assigned GPUs, or not dividing the attention heads: exit 4."""
    if tensor_parallel_size > gpu_count:
        raise InfeasiblePlan(
            f"tensor_parallel_size {tensor_parallel_size} exceeds the {gpu_count} GPU(s) assigned",
            fix=f"set tensor_parallel_size to at most {gpu_count}, or assign more GPUs (gpus)",
        )
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    if not divides_heads(tensor_parallel_size, heads, kv_heads):
        valid = [t for t in range(1, gpu_count + 1) if divides_heads(t, heads, kv_heads)]
        raise InfeasiblePlan(
            f"tensor_parallel_size {tensor_parallel_size} does not divide {model.model}'s {heads} attention heads "
            f"({kv_heads} KV heads); vLLM stops with 'Total number of attention heads ({heads}) must be divisible "
            f"by tensor parallel size ({tensor_parallel_size}).'",
            fix=f"use a tensor_parallel_size of {', '.join(map(str, valid)) or '1'}",
        )


def check_weights_fit(fit: GpuFit, model: ModelFacts, gpu_count: int, utilisation: float) -> None:
    """Weights plus the runtime reserve that do not fit on each GPU's budget: exit 4, with the numbers."""
    if fit.weights + fit.reserve <= fit.budget:
        return
    raise InfeasiblePlan(
        f"{model.model} does not fit: {gib(model.parameter_bytes or 0)} of weights over "
        f"{fit.tensor_parallel_size} GPU(s) is {gib(fit.weights)} each, plus a {gib(fit.reserve)} runtime reserve, "
        f"more than the {gib(fit.budget)} budget per GPU ({utilisation:.2f} x the smallest GPU)",
        fix=f"assign more GPUs (of {gpu_count}: raise tensor_parallel_size or gpus), use a quantised model, "
        "raise gpu_memory_utilization, or configure cpu_offload (slow)",
    )


def check_max_model_len(
    length: int,
    kv_capacity: int,
    kv_bytes_per_token: float,
    caps: VllmCapabilities,
) -> None:
    """A context whose KV cache for one sequence exceeds what is left beside the weights: exit 4.

    vLLM itself stops with 'To serve at least one request with the model's max seq len (%d), (%s GiB
    KV cache is needed, which is larger than the available KV cache memory (%s GiB).'
    """
    need = length * kv_bytes_per_token
    if need <= kv_capacity:
        return
    fits = largest_context(kv_capacity, kv_bytes_per_token)
    auto = ' or max_model_len = "auto"' if caps.max_model_len_auto else ""
    raise InfeasiblePlan(
        f"max_model_len {length} needs {gib(need)} of KV cache per GPU but about {gib(max(0, kv_capacity))} is left "
        f"beside the weights; vLLM would stop with \"To serve at least one request with the model's max seq len "
        f"({length}), ({need / 2**30:.2f} GiB KV cache is needed, which is larger than the available KV cache "
        f'memory ...)"',
        fix=f"set max_model_len to {fits} or less{auto}, raise gpu_memory_utilization (beyond the recommended "
        "band, with less headroom), or use more GPUs / an fp8 KV cache",
    )


def check_max_model_len_auto(caps: VllmCapabilities, catalogue: Catalogue | None = None) -> None:
    """`max_model_len = "auto"` on a release whose --max-model-len takes only integers: exit 4."""
    if caps.max_model_len_auto:
        return
    first = None
    if catalogue is not None:
        first = next(
            (v for v in catalogue.releases if catalogue.entries[v]["facts"].get("max_model_len_auto", {}).get("value")),
            None,
        )
    raise InfeasiblePlan(
        f"vLLM {caps.version}'s --max-model-len takes no 'auto'" + (f" (it does from {first})" if first else ""),
        fix="set max_model_len to a number of tokens, or use a newer vLLM image",
    )


def check_flags_supported(
    flags: Iterable[tuple[str, str]], caps: VllmCapabilities, catalogue: Catalogue | None = None
) -> None:
    """Flags (with the setting that asked for them) that the target vLLM release lacks: exit 4."""
    missing = [(flag, cause) for flag, cause in flags if not caps.has(flag)]
    if not missing:
        return
    lines = []
    for flag, cause in missing:
        lines.append(f"{flag} for {cause}{_releases_with(flag, catalogue)}")
    raise InfeasiblePlan(
        f"vLLM {caps.version} lacks " + "; ".join(lines),
        fix="use an image of a vLLM release that has these flags, or remove the settings that need them",
    )


def _releases_with(flag: str, catalogue: Catalogue | None) -> str:
    if catalogue is None:
        return ""
    first, last = catalogue.first_with(flag), catalogue.last_with(flag)
    if first is None:
        return " (no catalogued vLLM release has it)"
    if last != catalogue.newest:
        return f" (vLLM {first} to {last} have it)"
    return f" (added in {first})"


@dataclass(frozen=True)
class SwapMembership:
    """A deployment's swap group (issue 16) and whether it is pinned (always awake)."""

    group: str
    pinned: bool = False


def check_gpu_sharing(
    plans: Sequence[Plan],
    swap: Mapping[str, SwapMembership] | None = None,
    involving: Collection[str] | None = None,
) -> None:
    """GPUs shared by deployments whose memory utilisations add up above 0.95: exit 4.

    Members of one swap group count as what is awake at once: its pinned members plus its
    largest other member (the rest sleep, holding almost nothing). With `involving`, only GPUs
    that one of those deployments uses are checked (`plan NAME` checks NAME against the others,
    not the others among themselves).
    """
    swap = swap or {}
    users: dict[int, list[Plan]] = {}
    for plan in plans:
        for index in plan.gpu_indices:
            users.setdefault(index, []).append(plan)
    for index, sharing in sorted(users.items()):
        if len(sharing) < 2:
            continue
        if involving is not None and not any(p.deployment in involving for p in sharing):
            continue
        awake = _awake_at_once(sharing, swap)
        total = sum(p.gpu_memory_utilization or 0.0 for p in awake)
        if total > MAX_SHARED_UTILISATION + 1e-9:
            parts = " + ".join(f"{p.deployment} {p.gpu_memory_utilization:.2f}" for p in awake)
            grouped = len(awake) < len(sharing)
            raise InfeasiblePlan(
                f"GPU {index} is shared by {', '.join(p.deployment for p in sharing)} whose memory utilisations "
                f"{'awake at once ' if grouped else ''}add up to {total:.2f} ({parts}), above {MAX_SHARED_UTILISATION}",
                fix="set gpu_memory_utilization in each of these deployments so they sum to 0.95 or less, "
                "give them different GPUs (gpus), or put them in one swap_group (only the awake ones must fit; "
                "pin fewer members)",
            )


def _awake_at_once(sharing: Sequence[Plan], swap: Mapping[str, SwapMembership]) -> list[Plan]:
    """The plans on one GPU that may be awake together: every plan outside a swap group, each
    group's pinned members, and each group's largest unpinned member."""
    out: list[Plan] = []
    largest: dict[str, Plan] = {}
    for plan in sharing:
        member = swap.get(plan.deployment)
        if member is None or member.pinned:
            out.append(plan)
            continue
        best = largest.get(member.group)
        if best is None or (plan.gpu_memory_utilization or 0.0) > (best.gpu_memory_utilization or 0.0):
            largest[member.group] = plan
    return [*out, *largest.values()]


def swap_memberships(deployments: Iterable[tuple[str, DeploymentSettings]]) -> dict[str, SwapMembership]:
    """The swap group of each deployment that has one."""
    return {name: SwapMembership(dep.swap_group, dep.pinned) for name, dep in deployments if dep.swap_group is not None}


def check_host_ram(plans: Sequence[Plan], host: Host) -> None:
    """CPU KV offload and offloaded weights of every deployment together above the host's RAM: exit 4."""
    users = [p for p in plans if p.host_ram_bytes > 0]
    total = sum(p.host_ram_bytes for p in users)
    limit = host_ram_limit(host.memory.total_bytes)
    if total <= limit:
        return
    parts = " + ".join(f"{p.deployment} {gib(p.host_ram_bytes)}" for p in users)
    raise InfeasiblePlan(
        f"CPU offload of the deployments needs {gib(total)} of host RAM ({parts}), more than the {gib(limit)} "
        f"this host can give ({gib(host.memory.total_bytes)} less a reserve for the system)",
        fix='set kv_offload (GiB, or "off") in the deployments so they add up to at most '
        f"{int(limit / 2**30)} GiB, or reduce cpu_offload",
    )


def check_fit_together(
    plans: Sequence[Plan],
    deployments: Iterable[tuple[str, DeploymentSettings]],
    host: Host,
    involving: Collection[str] | None = None,
) -> None:
    """The fit check of deployments that run together (the daemon's preflight and reloads, `dankserve plan`):
    their GPUs shared within 0.95, a swap group counting what may be awake at once (`deployments`: the
    enabled ones, for their groups), and CPU offload within the host's RAM. `involving`: only a conflict
    that one of these deployments takes part in is an error. Raises the user error."""
    enabled = [(name, dep) for name, dep in deployments if dep.enabled]
    check_gpu_sharing(plans, swap_memberships(enabled), involving=involving)
    if involving is None or any(p.deployment in involving for p in plans):
        check_host_ram(plans, host)
