"""Tests for dankserve.supervisor.policy: the failure table, decisions, restart timing, the docs page."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tenacity import RetryCallState, wait_exponential_jitter

from dankserve.bootlog import FailureClass
from dankserve.supervisor.policy import (
    FAILURE_POLICY,
    BootFailed,
    FailureCause,
    FailureContext,
    PolicyAction,
    Refusal,
    RestartSettings,
    Unavailable,
    backoff_delay,
    decide,
    next_restart,
    outage_retry_delay,
    render_policy_markdown,
    restart_or_give_up,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "failure-policy.md"
SETTINGS = RestartSettings(
    initial_seconds=2.0,
    max_seconds=300.0,
    multiplier=2.0,
    jitter_seconds=1.0,
    window_seconds=900.0,
    max_failures_in_window=5,
)


def no_jitter(low: float, high: float) -> float:
    return low


def full_jitter(low: float, high: float) -> float:
    return high


def test_every_cause_has_one_row() -> None:
    """The table has exactly one row per failure cause, every log failure class included."""
    causes = [rule.cause for rule in FAILURE_POLICY]
    assert sorted(causes) == sorted(FailureCause)
    assert {FailureCause.from_log(failure) for failure in FailureClass} <= set(causes)


TABLE: list[tuple[FailureCause, PolicyAction]] = [
    (FailureCause.BAD_ARGUMENT, PolicyAction.CONFIG_ERROR),
    (FailureCause.MODEL_NOT_FOUND, PolicyAction.CONFIG_ERROR),
    (FailureCause.MAX_LEN_TOO_LARGE, PolicyAction.REMEDIATE_ONCE),
    (FailureCause.NO_KV_MEMORY, PolicyAction.REMEDIATE_ONCE),
    (FailureCause.OOM_LOAD, PolicyAction.RELEARN),
    (FailureCause.ENGINE_DEAD, PolicyAction.RESTART_WITH_BACKOFF),
    (FailureCause.CRASH, PolicyAction.RESTART_WITH_BACKOFF),
    (FailureCause.BOOT_TIMEOUT, PolicyAction.RESTART_WITH_BACKOFF),
    (FailureCause.OTHER, PolicyAction.RESTART_WITH_BACKOFF),
]


@pytest.mark.parametrize(("cause", "action"), TABLE)
def test_table_actions(cause: FailureCause, action: PolicyAction) -> None:
    """Each cause maps to the action issue 4 names for it."""
    assert decide(cause, FailureContext()).action is action


def test_crash_without_failure_in_log() -> None:
    """An exit whose log names no failure is a crash."""
    assert FailureCause.from_log(None) is FailureCause.CRASH
    assert FailureCause.from_log(FailureClass.OOM_LOAD) is FailureCause.OOM_LOAD


@pytest.mark.parametrize("cause", [FailureCause.BAD_ARGUMENT, FailureCause.MODEL_NOT_FOUND])
def test_config_errors_are_not_restarted_and_carry_the_message(cause: FailureCause) -> None:
    """A rejected configuration stops the deployment and reports vLLM's message."""
    decision = decide(cause, FailureContext(message="vllm serve: error: unrecognized arguments: --swap-space 4"))
    assert decision.outcome == "config_error"
    assert "--swap-space 4" in decision.reason


DECISIONS: list[tuple[str, FailureCause, FailureContext, dict[str, object]]] = [
    (
        "max_len: unset -> vLLM's estimate, at once",
        FailureCause.MAX_LEN_TOO_LARGE,
        FailureContext(estimated_max_model_len=34480),
        {"outcome": "restart", "backoff": False, "overrides": {"max_model_len": 34480}},
    ),
    (
        "max_len: unset, no estimate -> auto",
        FailureCause.MAX_LEN_TOO_LARGE,
        FailureContext(),
        {"outcome": "restart", "overrides": {"max_model_len": "auto"}},
    ),
    (
        "max_len: set by hand -> config error",
        FailureCause.MAX_LEN_TOO_LARGE,
        FailureContext(max_model_len_setting=131072, estimated_max_model_len=34480),
        {"outcome": "config_error", "overrides": {}},
    ),
    (
        "max_len: second time -> config error",
        FailureCause.MAX_LEN_TOO_LARGE,
        FailureContext(estimated_max_model_len=30000, remediated=frozenset({FailureCause.MAX_LEN_TOO_LARGE})),
        {"outcome": "config_error"},
    ),
    (
        "no_kv: planned utilisation -> top of band",
        FailureCause.NO_KV_MEMORY,
        FailureContext(gpu_memory_utilization_planned=0.9, utilization_band_top=0.95),
        {"outcome": "restart", "backoff": False, "overrides": {"gpu_memory_utilization": 0.95}},
    ),
    (
        "no_kv: set by hand -> config error",
        FailureCause.NO_KV_MEMORY,
        FailureContext(gpu_memory_utilization_setting=0.5, utilization_band_top=0.95),
        {"outcome": "config_error"},
    ),
    (
        "no_kv: already at the top -> config error",
        FailureCause.NO_KV_MEMORY,
        FailureContext(gpu_memory_utilization_planned=0.95, utilization_band_top=0.95),
        {"outcome": "config_error"},
    ),
    (
        "no_kv: second time -> config error",
        FailureCause.NO_KV_MEMORY,
        FailureContext(
            gpu_memory_utilization_planned=0.9,
            utilization_band_top=0.95,
            remediated=frozenset({FailureCause.NO_KV_MEMORY}),
        ),
        {"outcome": "config_error"},
    ),
    (
        "oom: learned bytes -> drop them, profile at once",
        FailureCause.OOM_LOAD,
        FailureContext(learned_kv_in_use=True),
        {"outcome": "restart", "backoff": False, "drop_learned_kv": True},
    ),
    (
        "oom: others hold the GPU -> wait with backoff, keep the bytes",
        FailureCause.OOM_LOAD,
        FailureContext(learned_kv_in_use=True, other_gpu_processes=True),
        {"outcome": "restart", "backoff": True, "drop_learned_kv": False},
    ),
    (
        "oom: again after the relearn, no other process -> config error (the weights do not fit)",
        FailureCause.OOM_LOAD,
        FailureContext(learned_kv_in_use=True, relearned=True),
        {"outcome": "config_error"},
    ),
    (
        "oom: again after the relearn while others hold the GPU -> wait with backoff",
        FailureCause.OOM_LOAD,
        FailureContext(learned_kv_in_use=True, relearned=True, other_gpu_processes=True),
        {"outcome": "restart", "backoff": True, "drop_learned_kv": False},
    ),
    (
        "oom: no learned bytes, no relearn -> backoff",
        FailureCause.OOM_LOAD,
        FailureContext(),
        {"outcome": "restart", "backoff": True, "drop_learned_kv": False},
    ),
    (
        "engine dead -> backoff",
        FailureCause.ENGINE_DEAD,
        FailureContext(),
        {"outcome": "restart", "backoff": True},
    ),
    (
        "boot timeout -> backoff",
        FailureCause.BOOT_TIMEOUT,
        FailureContext(),
        {"outcome": "restart", "backoff": True},
    ),
]


@pytest.mark.parametrize(("_name", "cause", "context", "expected"), DECISIONS, ids=[d[0] for d in DECISIONS])
def test_decisions(_name: str, cause: FailureCause, context: FailureContext, expected: dict[str, object]) -> None:
    """Each failure in each configuration gets the remedy (or refusal) the table describes."""
    decision = decide(cause, context)
    assert {key: getattr(decision, key) for key in expected} == expected


def test_remediation_says_what_changed() -> None:
    """A remediation names the value it changed and marks the cause as remediated."""
    decision = decide(FailureCause.MAX_LEN_TOO_LARGE, FailureContext(estimated_max_model_len=34480))
    assert "34480" in decision.reason
    assert decision.remediation is FailureCause.MAX_LEN_TOO_LARGE


def test_first_retry_is_immediate() -> None:
    """The first failure in the window restarts at once, whatever the jitter."""
    decision = next_restart([100.0], 100.0, SETTINGS, full_jitter)
    assert (decision.kind, decision.delay_seconds, decision.attempt) == ("restart", 0.0, 1)


def test_backoff_sequence() -> None:
    """Later retries wait initial, initial*multiplier, ... up to the maximum."""
    delays = [backoff_delay(attempt, SETTINGS, no_jitter) for attempt in range(1, 12)]
    assert delays == [0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0]


def test_runtime_outage_retries_back_off_to_at_most_30_seconds() -> None:
    """An unreachable runtime is asked again soon, then less often, never more than 30 s apart, never at once."""
    delays = [outage_retry_delay(attempt, SETTINGS, no_jitter) for attempt in range(1, 8)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    quick = RestartSettings(0.1, 1.0, 2.0, 0.0, 900.0, 5)
    assert [outage_retry_delay(a, quick, no_jitter) for a in (1, 5)] == [0.2, 1.0]


def test_more_than_max_failures_in_window_is_failed() -> None:
    """The sixth failure within the window (max 5) ends the retries: failed."""
    history = [0.0, 10.0, 20.0, 30.0, 40.0]
    assert next_restart(history, 40.0, SETTINGS, no_jitter).kind == "restart"
    assert next_restart([*history, 50.0], 50.0, SETTINGS, no_jitter).kind == "failed"


def test_old_failures_leave_the_window() -> None:
    """Failures older than the window no longer count: the retry is immediate again."""
    history = [0.0, 10.0, 20.0, 30.0, 40.0, 2000.0]
    decision = next_restart(history, 2000.0, SETTINGS, full_jitter)
    assert (decision.kind, decision.delay_seconds, decision.failures_in_window) == ("restart", 0.0, 1)


def test_immediate_restart_still_counts() -> None:
    """A remediation restarts at once but a full window still fails the deployment."""
    assert next_restart([1.0, 2.0], 2.0, SETTINGS, full_jitter, immediate=True).delay_seconds == 0.0
    full = [float(i) for i in range(6)]
    assert next_restart(full, 5.0, SETTINGS, no_jitter, immediate=True).kind == "failed"


def test_one_function_decides_restart_retry_or_give_up() -> None:
    """restart_or_give_up: a boot failure by the table then the window, an unavailable service waited out
    uncounted, a refusal given up; a configuration error gives up before the window is asked."""
    crash = BootFailed(FailureCause.CRASH, FailureContext(message="x"), [100.0])
    assert restart_or_give_up(crash, 100.0, SETTINGS, full_jitter).kind == "restart"
    window = BootFailed(FailureCause.CRASH, FailureContext(), [float(i) for i in range(6)])
    given_up = restart_or_give_up(window, 5.0, SETTINGS, no_jitter)
    assert given_up.kind == "give_up" and given_up.restart is not None and "failures within" in given_up.reason
    config = restart_or_give_up(BootFailed(FailureCause.BAD_ARGUMENT, FailureContext(), [1.0]), 1.0, SETTINGS)
    assert config.kind == "give_up" and config.restart is None
    retry = restart_or_give_up(Unavailable(2), 0.0, SETTINGS, no_jitter)
    assert (retry.kind, retry.delay_seconds) == ("retry", outage_retry_delay(2, SETTINGS, no_jitter))
    assert restart_or_give_up(Refusal("port in use"), 0.0, SETTINGS) == restart_or_give_up(
        Refusal("port in use"), 9.0, SETTINGS
    )
    assert restart_or_give_up(Refusal("port in use"), 0.0, SETTINGS).kind == "give_up"


def test_settings_keys() -> None:
    """RestartSettings reads the restart keys of dankserve's settings."""
    from dankserve.settings import Settings

    restart = RestartSettings.from_settings(Settings(deployments={}, restart_backoff_initial_seconds=3))
    assert restart.initial_seconds == 3
    assert restart.max_failures_in_window == Settings.model_fields["max_failures_in_window"].default


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=60), st.integers(min_value=0, max_value=2**32 - 1))
def test_same_formula_as_tenacity(attempt: int, seed: int) -> None:
    """The delay equals tenacity's wait_exponential_jitter at attempt-1 with the same random draw."""
    wait = wait_exponential_jitter(multiplier=2.0, max=300.0, exp_base=2.0, jitter=1.0)
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    random.seed(seed)
    ours = backoff_delay(attempt, SETTINGS, random.uniform)
    if attempt == 1:
        assert ours == 0.0
        return
    state.attempt_number = attempt - 1
    random.seed(seed)
    assert ours == pytest.approx(wait(state))


restart_settings = st.builds(
    RestartSettings,
    initial_seconds=st.floats(min_value=0, max_value=60),
    max_seconds=st.floats(min_value=0.1, max_value=3600),
    multiplier=st.floats(min_value=1, max_value=10),
    jitter_seconds=st.floats(min_value=0, max_value=30),
    window_seconds=st.floats(min_value=1, max_value=10_000),
    max_failures_in_window=st.integers(min_value=1, max_value=20),
)


@settings(max_examples=300, deadline=None)
@given(restart_settings, st.integers(min_value=1, max_value=200))
def test_backoff_is_monotonic_and_bounded(restart: RestartSettings, attempts: int) -> None:
    """Without jitter delays never shrink as failures grow; with any jitter they stay within [0, max]."""
    plain = [backoff_delay(a, restart, no_jitter) for a in range(1, attempts + 1)]
    assert plain == sorted(plain)
    for attempt in range(1, attempts + 1):
        for source in (no_jitter, full_jitter):
            delay = backoff_delay(attempt, restart, source)
            assert 0.0 <= delay <= restart.max_seconds
        assert backoff_delay(attempt, restart, full_jitter) - plain[attempt - 1] <= restart.jitter_seconds + 1e-9


@settings(max_examples=300, deadline=None)
@given(restart_settings, st.lists(st.floats(min_value=0, max_value=20_000), max_size=40), st.floats(0, 20_000))
def test_window_rule(restart: RestartSettings, history: list[float], now: float) -> None:
    """Failed exactly when more than max_failures_in_window failures lie in the window ending now."""
    past = [at for at in history if at <= now] + [now]
    in_window = sum(1 for at in past if now - restart.window_seconds < at)
    decision = next_restart(past, now, restart, full_jitter)
    assert (decision.kind == "failed") == (in_window > restart.max_failures_in_window)
    assert decision.failures_in_window == in_window
    if decision.kind == "restart" and in_window == 1:
        assert decision.delay_seconds == 0.0


def test_docs_page_is_current() -> None:
    """docs/failure-policy.md is the rendering of the table in code (regenerate it when this fails)."""
    assert DOCS.read_text(encoding="utf-8") == render_policy_markdown(), (
        "docs/failure-policy.md is stale: python -m dankserve.supervisor.policy --write docs/failure-policy.md"
    )
