"""Tests for dankserve.supervisor.fleet.swap_checks: the verdicts on sleeps and wakes, and the safe level."""

from __future__ import annotations

import pytest

from dankserve.state import UnsafeSleep
from dankserve.supervisor.fleet.swap import LevelChoice, SleepLevel
from dankserve.supervisor.fleet.swap_checks import (
    CUDA_CONTEXT_BYTES,
    canary_key,
    check_sleep,
    check_wake,
    safe_level,
    sleep_tolerance_bytes,
    unsafe_levels,
)

GIB = 1 << 30
TOLERANCE = sleep_tolerance_bytes(512 << 20)


@pytest.mark.parametrize(
    ("held", "released"),
    [
        ({"GPU-0": 400 << 20}, True),  # the CUDA context and graphs: freed
        ({"GPU-0": TOLERANCE}, True),  # at the tolerance
        ({"GPU-0": TOLERANCE + 1}, False),
        ({"GPU-0": 300 << 20, "GPU-1": 20 * GIB}, False),  # one rank kept its weights
        ({"GPU-0": 0}, True),
        (None, True),  # nothing readable: not verified, nothing says otherwise
    ],
)
def test_a_sleep_is_released_only_within_the_tolerance_on_every_gpu(
    held: dict[str, int] | None, released: bool
) -> None:
    """NVML's per-process bytes above the CUDA context plus the margin on any GPU: not released."""
    verdict = check_sleep(held, TOLERANCE)
    assert verdict.released is released
    if not released:
        assert "GiB" in verdict.message and "sleep_check_margin_bytes" in verdict.message


def test_the_tolerance_is_the_cuda_context_and_the_margin() -> None:
    """The margin adds to the CUDA context; a negative one counts as none."""
    assert sleep_tolerance_bytes(0) == CUDA_CONTEXT_BYTES
    assert sleep_tolerance_bytes(GIB) == CUDA_CONTEXT_BYTES + GIB
    assert sleep_tolerance_bytes(-5) == CUDA_CONTEXT_BYTES


@pytest.mark.parametrize(
    ("fingerprint", "answered", "ok", "said"),
    [
        ((1, 2, 3), (1, 2, 3), True, None),
        ((1, 2, 3), (1, 2, 4), False, "from token 2"),
        ((1, 2, 3), (1, 2), False, "from token 2"),
        ((1, 2, 3), (), False, "from token 0"),
        ((1, 2, 3), "HTTP 503: sleeping", False, "canary completion failed: HTTP 503"),
    ],
)
def test_a_wake_matches_only_the_same_ids(
    fingerprint: tuple[int, ...], answered: tuple[int, ...] | str, ok: bool, said: str | None
) -> None:
    """Other ids, fewer ids or a failed canary are a mismatch, named with where it begins."""
    problem = check_wake(fingerprint, answered)
    assert (problem is None) is ok
    if said is not None:
        assert problem is not None and said in problem


CHOICE_1 = LevelChoice(SleepLevel.LEVEL_1, "RAM holds the weights")
CHOICE_2 = LevelChoice(SleepLevel.LEVEL_2, "RAM does not")
CHOICE_STOP = LevelChoice(SleepLevel.STOP, "no sleep mode")


@pytest.mark.parametrize(
    ("choice", "unsafe", "level"),
    [
        (CHOICE_1, set(), "1"),
        (CHOICE_1, {"1"}, "2"),
        (CHOICE_1, {"1", "2"}, "stop"),
        (CHOICE_1, {"2"}, "1"),
        (CHOICE_2, {"1"}, "2"),
        (CHOICE_2, {"2"}, "stop"),
        (CHOICE_STOP, {"1", "2"}, "stop"),
    ],
)
def test_an_unsafe_level_gives_way_to_the_next_safe_one(choice: LevelChoice, unsafe: set[str], level: str) -> None:
    """Level 1, then 2, then stop (stop is always safe); an untouched choice is returned as it was."""
    got = safe_level(choice, unsafe)
    assert got.level.value == level
    assert (got is choice) is (level == choice.level.value)
    if got is not choice:
        assert "marked unsafe" in got.reason


def test_unsafe_levels_hold_for_their_vllm_version_and_model_only() -> None:
    """A record of another release or model leaves the levels open."""
    records = (
        UnsafeSleep("1", "0.26.0", "m", "kept memory", 0.0),
        UnsafeSleep("2", "0.27.0", "m", "other tokens", 0.0),
        UnsafeSleep("2", "0.26.0", "other", "other tokens", 0.0),
    )
    assert unsafe_levels(records, "0.26.0", "m") == {"1"}
    assert unsafe_levels(records, "0.28.0", "m") == set()


def test_a_fingerprint_belongs_to_the_boot_key_or_else_the_release_and_model() -> None:
    """The boot key names the configuration; without one the release and model do."""
    assert canary_key("kv1-abc", "0.26.0", "m") == "kv1-abc"
    assert canary_key(None, "0.26.0", "m") == "0.26.0|m"
    assert canary_key(None, None, "m") == "unknown|m"
