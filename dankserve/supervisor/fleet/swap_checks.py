"""Checks of every sleep and wake (issue 29), pure: did the sleep free the memory, does the woken server
answer as it did before its first sleep, and which sleep level is still safe to use.

vLLM's sleep mode has regressed more than once (a sleep freeing ~6 GB of 20+, vllm issue 32714; an
HBM leak that makes the next wake OOM, 47654; level 2 waking to gibberish, 29341), and `/sleep`
answering 200 proves none of it. So after `/is_sleeping` says asleep, NVML's per-process used
memory of the server's processes must be down to the CUDA context and a margin; and after a wake,
a greedy completion of a fixed prompt must give the token ids recorded before the first sleep. A
level that fails is remembered as unsafe for that vLLM version and model (state.json); the next
sleep of the member takes the next safe way: level 1, then level 2, then stop.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dankserve.state import UnsafeSleep
from dankserve.supervisor.fleet.swap import LevelChoice, SleepLevel

if TYPE_CHECKING:
    from dankserve.settings import Settings
    from dankserve.supervisor.machine import MachineState
    from dankserve.supervisor.records import StateBook

CANARY_PROMPT = "The capital of France is"
"""The fixed prompt of the canary completion (any short prompt does: the ids are compared, not read)."""
CANARY_MAX_TOKENS = 8
"""Greedy tokens asked for: few enough to cost one short decode (the H200 target is 50 ms in all)."""
SUSPENDED_BYTES = 0
"""What a suspended member's processes may hold (issue 41 item 7): its GPU checkpoint released everything."""
CUDA_CONTEXT_BYTES = 1 << 30
"""What a sleeping vLLM process keeps: the CUDA context, NCCL and graph pools (1.25 GB measured on the
H200 with vLLM 0.26 asleep, FACTS "Sleep mode"); the configured margin comes on top."""


def sleep_tolerance_bytes(margin_bytes: int) -> int:
    """The most a sleeping member's processes may hold per GPU: the CUDA context and the margin."""
    return CUDA_CONTEXT_BYTES + max(0, margin_bytes)


@dataclass(frozen=True)
class SleepVerdict:
    """What NVML's reading says of a sleep: released (within the tolerance) or not, with the figures."""

    released: bool
    held_bytes: int
    """The most the member's processes hold on one of its GPUs now."""
    message: str


def check_sleep(held_per_gpu: Mapping[str, int] | None, tolerance_bytes: int) -> SleepVerdict:
    """Whether the sleeping member's own memory (per GPU, its processes only) is within the tolerance.

    None (no NVML here, nothing readable): the sleep is taken as released, since nothing says
    otherwise (the log line `sleep_unverified` says so)."""
    if held_per_gpu is None:
        return SleepVerdict(True, 0, "no per-process GPU memory readable here: the sleep is not verified")
    over = {gpu: held for gpu, held in held_per_gpu.items() if held > tolerance_bytes}
    held = max(held_per_gpu.values(), default=0)
    suspended = tolerance_bytes == SUSPENDED_BYTES
    if not over:
        if suspended:
            return SleepVerdict(True, held, "0 bytes held suspended (its GPU checkpoint released everything)")
        return SleepVerdict(True, held, f"{_gib(held)} held asleep, within {_gib(tolerance_bytes)}")
    worst = max(over, key=lambda gpu: over[gpu])
    if suspended:
        return SleepVerdict(
            False,
            held,
            f"suspended, yet its processes still hold {_gib(over[worst])} on GPU {worst} (0 bytes expected after "
            "the GPU checkpoint)",
        )
    return SleepVerdict(
        False,
        held,
        f"asleep, yet its processes still hold {_gib(over[worst])} on GPU {worst} "
        f"(at most {_gib(tolerance_bytes)} expected: the CUDA context and sleep_check_margin_bytes)",
    )


def check_wake(fingerprint: Sequence[int], answered: Sequence[int] | str) -> str | None:
    """None when the woken server's canary ids are the fingerprint's; else why not (an error text passes through)."""
    if isinstance(answered, str):
        return f"the canary completion failed: {answered}"
    if list(answered) == list(fingerprint):
        return None
    first = next(
        (i for i, (a, b) in enumerate(zip(fingerprint, answered, strict=False)) if a != b),
        min(len(fingerprint), len(answered)),
    )
    return (
        f"the canary completion answered other tokens than before the first sleep "
        f"(from token {first}: {list(answered)[first : first + 4]} instead of {list(fingerprint)[first : first + 4]})"
    )


_NEXT: Mapping[SleepLevel, SleepLevel] = {
    SleepLevel.SUSPEND: SleepLevel.LEVEL_1,
    SleepLevel.LEVEL_1: SleepLevel.LEVEL_2,
    SleepLevel.LEVEL_2: SleepLevel.STOP,
}


def safe_level(choice: LevelChoice, unsafe: Collection[str]) -> LevelChoice:
    """The chosen level, or the next safe one when it is marked unsafe: suspend, then 1, then 2, then stop
    (always safe)."""
    level = choice.level
    skipped: list[str] = []
    while level is not SleepLevel.STOP and level.value in unsafe:
        skipped.append(level.value)
        level = _NEXT[level]
    if not skipped:
        return choice
    return LevelChoice(level, f"level {', '.join(skipped)} marked unsafe for this vLLM and model: {level.value}")


def unsafe_levels(records: Sequence[UnsafeSleep], vllm_version: str | None, model: str) -> frozenset[str]:
    """The levels unsafe for this vLLM version and model (another release or model tries them afresh)."""
    return frozenset(r.level for r in records if r.model == model and r.vllm_version == vllm_version)


class _Fleet(Protocol):
    @property
    def settings(self) -> Settings: ...

    @property
    def state(self) -> StateBook: ...


def safe_choice(fleet: _Fleet, name: str, machine: MachineState, choice: LevelChoice) -> LevelChoice:
    """`choice`, or the next safe level where the state file marks it unsafe for the member's vLLM and model."""
    dep = fleet.settings.deployments.get(name)
    if dep is None:
        return choice
    return safe_level(choice, unsafe_levels(fleet.state.deployment(name).unsafe_sleep, machine.vllm_version, dep.model))


def canary_key(boot_key: str | None, vllm_version: str | None, model: str) -> str:
    """What a fingerprint belongs to: the configuration's boot key (flags, version, GPUs) where known."""
    return boot_key or f"{vllm_version or 'unknown'}|{model}"


def _gib(value: int) -> str:
    return f"{value / (1 << 30):.2f} GiB"
