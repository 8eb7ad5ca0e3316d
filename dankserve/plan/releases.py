"""What changes with the vLLM release: removed flags and variables, KV sizing, admission, kernels (pure).

Each rule reads the catalogue's facts of the target release (`VllmCapabilities`, read from the wheels by
scripts/gen_vllm_catalogue.py), never a version number compared by hand: a release that has the flag, the
subcommand or the route gets the rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dankserve.errors import ConfigError
from dankserve.plan.catalogue import Catalogue, VllmCapabilities
from dankserve.plan.serve_args import split_options

QUEUED_REQS_FLAG = "--max-num-queued-reqs"
EXTENSIBLE_KV_FLAG = "--enable-extensible-kv-cache"
KERNELS_SUBCOMMAND = "download-kernels"
KERNELS_DIR = "kernels"
"""Under the kept vLLM cache dir: where `vllm download-kernels` installs FlashInfer's kernel wheels."""


def check_removed(
    name: str, extra_args: Sequence[str], env: Mapping[str, str], caps: VllmCapabilities, catalogue: Catalogue | None
) -> None:
    """A flag in extra_args or a variable in env that an earlier catalogued release had and the target release
    removed: exit 2, naming the release that removed it and what replaces it."""
    if catalogue is None:
        return
    problems: list[str] = []
    fixes: list[str] = []
    _, options = split_options(tuple(extra_args))
    for option in options:
        flag = option.name
        if not flag.startswith("--") or caps.has(flag):
            continue
        removed_in = catalogue.removed_by(flag, caps.version)
        if removed_in is None:
            continue
        replacement = catalogue.flag_replacement(flag)
        problems.append(f"extra_args {flag}: vLLM {removed_in} removed it (the image runs {caps.version})")
        fixes.append(f"use {replacement} instead of {flag}" if replacement else f"remove {flag} (no successor)")
    for variable in sorted(env):
        hint = caps.removed_env.get(variable)
        removed_in = None
        if variable.startswith("VLLM_") and caps.env and variable not in caps.env:  # others are not vLLM's alone
            removed_in = catalogue.removed_by(variable, caps.version, env=True)
        if hint is None and removed_in is None:
            continue
        when = f"vLLM {removed_in} removed it" if removed_in else f"vLLM {caps.version} refuses it"
        problems.append(f"env {variable}: {when} (the image runs {caps.version})")
        successor = catalogue.env_successor(variable)
        if hint is None and successor is not None:
            hint = f"use {successor} (in extra_args; dankserve's own setting where it has one) instead of {variable}"
        fixes.append(hint if hint else f"remove {variable} from env (vLLM names no successor)")
    if problems:
        raise ConfigError(
            f"deployments.{name}: " + "; ".join(problems),
            fix="; ".join(fixes) + " (docs/planner.md, vLLM releases)",
        )


def kv_sizing_reason(caps: VllmCapabilities) -> str:
    """Why the learned bytes are passed on a release with extensible KV sizing: what it turns off, and why."""
    if not caps.has(EXTENSIBLE_KV_FLAG):
        return ""
    return (
        f"; vLLM {caps.version} then turns off its extensible KV cache (on by default: sized from the memory free "
        "after CUDA-graph capture). dankserve's default until the H200 measures both: the learned bytes come from "
        "that same sizing on the first boot, so they give the same KV while the boot skips the profiling run"
    )


def kv_sizing_note(caps: VllmCapabilities, learned: int | None) -> str | None:
    """The first boot of a release with extensible KV sizing: vLLM sizes the cache, dankserve learns it."""
    if learned is not None or not caps.has(EXTENSIBLE_KV_FLAG):
        return None
    return (
        f"KV cache: vLLM {caps.version} sizes it itself on this boot (extensible KV cache, on by default: the memory "
        "free after CUDA-graph capture); dankserve learns the size from the log and passes it as "
        "--kv-cache-memory-bytes on later boots, which skips profiling (and turns the extensible sizing off)"
    )


@dataclass(frozen=True)
class GatewayQueue:
    """The gateway's admission for one deployment: requests passed at once and requests it holds waiting."""

    max_in_flight: int | None
    """The gateway's cap (None: the deployment's --max-num-seqs)."""
    queue_size: int


def queued_reqs(
    caps: VllmCapabilities, gateway: GatewayQueue | None, max_num_seqs: int | None
) -> tuple[int, str] | None:
    """`--max-num-queued-reqs` from the gateway's queue (None: no gateway, or the release lacks the flag).

    vLLM counts every unfinished request (waiting and running) against the limit and answers 503 beyond it.
    The gateway passes at most its cap at once and holds `queue_size` more; vLLM admits as many as the
    gateway holds in all, so its 503 never meets the gateway's own traffic: what the gateway passes always
    fits, and clients that reach the server directly are bounded by the same total."""
    if gateway is None or not caps.has(QUEUED_REQS_FLAG):
        return None
    cap = gateway.max_in_flight if gateway.max_in_flight is not None else max_num_seqs
    if cap is None:
        return None
    total = cap + gateway.queue_size
    source = "gateway max_in_flight" if gateway.max_in_flight is not None else "--max-num-seqs, the gateway's cap"
    return total, (
        f"the gateway passes at most {cap} requests at once ({source}) and holds {gateway.queue_size} more "
        f"(queue_size): vLLM admits the same {total} (it answers 503 beyond), so the gateway's own requests always "
        "fit and a 503 from vLLM's admission becomes the gateway's queued wait, never a raw answer"
    )


@dataclass(frozen=True)
class KernelDownload:
    """The kept kernels of a release with `vllm download-kernels`: fetched before the first boot into the kept
    cache dir (so later boots, also on an offline host, fetch none), then put first on PYTHONPATH."""

    argv: tuple[str, ...]
    """After the `vllm` executable."""
    env: Mapping[str, str]
    target: str
    """Inside the container: under VLLM_CACHE_ROOT (kept between boots), one directory per vLLM release."""
    download: bool
    """This boot runs the download where the directory is missing (a first boot)."""

    def describe(self) -> str:
        return (
            f"first boot: `vllm {' '.join(self.argv)}` runs before the server, installing FlashInfer's precompiled "
            f"kernels (flashinfer-cubin, flashinfer-jit-cache) into {self.target} in the kept cache dir, so later "
            "boots (also on an offline host) download and compile none at start; a failed download only warns"
        )


def kernel_download(
    caps: VllmCapabilities, cache_root: str, *, first_boot: bool, container: bool
) -> KernelDownload | None:
    """The kept kernels where the release has `vllm download-kernels` (0.32+) and the server runs in a container
    (a process runs in the user's own Python environment, where `vllm download-kernels` installs them for good)."""
    if not container or KERNELS_SUBCOMMAND not in caps.subcommands:
        return None
    # Per release: FlashInfer refuses kernels of another FlashInfer version (vllm/entrypoints/cli/download_kernels.py).
    target = f"{cache_root.rstrip('/')}/{KERNELS_DIR}/{caps.version}"
    # vLLM's subcommand runs `python -m flashinfer download-kernels`, which pip-installs the wheels;
    # PIP_TARGET sends them to the kept dir instead of the image's site-packages (gone with the container).
    return KernelDownload((KERNELS_SUBCOMMAND,), {"PIP_TARGET": target}, target, download=first_boot)
