"""Tests for dankserve.supervisor.probes.liveness: stall detection and the token-probe verdicts."""

from __future__ import annotations

from dankserve.supervisor.observe.serving import ServingSample
from dankserve.supervisor.probes.liveness import Liveness, LivenessSettings, observe, probed

SETTINGS = LivenessSettings(stall_seconds=10, probe_interval_seconds=60)


def sample(at: float, waiting: float = 0, running: float = 0, tokens: float = 0) -> ServingSample:
    return ServingSample(at=at, running=running, waiting=waiting, prompt_tokens_total=tokens, generation_tokens_total=0)


def test_pending_requests_without_tokens_for_stall_seconds_is_hung() -> None:
    """Requests waiting while the token counters stand still for stall_seconds is a hang, with numbers."""
    state = Liveness.ready_at(0)
    state, verdict = observe(state, sample(1, waiting=3, tokens=50), 1, SETTINGS)
    assert verdict.action == "ok"
    state, verdict = observe(state, sample(6, waiting=3, tokens=50), 6, SETTINGS)
    assert verdict.action == "ok"
    state, verdict = observe(state, sample(11, waiting=3, tokens=50), 11, SETTINGS)
    assert verdict.action == "hung"
    assert verdict.evidence is not None and "3 requests waiting" in verdict.evidence and "10 s" in verdict.evidence


def test_moving_tokens_reset_the_stall_clock() -> None:
    """Tokens that move while requests wait are progress: no hang."""
    state = Liveness.ready_at(0)
    for t in range(1, 40):
        state, verdict = observe(state, sample(t, waiting=5, running=2, tokens=t * 10), t, SETTINGS)
        assert verdict.action == "ok"


def test_idle_server_is_never_stalled() -> None:
    """Nothing pending and no tokens is idleness, not a stall."""
    state = Liveness.ready_at(0)
    state, verdict = observe(state, sample(30, tokens=5), 30, SETTINGS)
    assert verdict.action == "ok"


def test_probe_is_due_one_interval_after_ready_and_only_when_idle() -> None:
    """The first probe waits an interval; a busy server is not probed."""
    state = Liveness.ready_at(0)
    assert observe(state, sample(30), 30, SETTINGS)[1].action == "ok"
    assert observe(state, sample(60, running=1, tokens=1), 60, SETTINGS)[1].action == "ok"
    assert observe(state, sample(60), 60, SETTINGS)[1].action == "probe"
    assert observe(state, None, 60, SETTINGS)[1].action == "probe"


def test_two_failed_probes_in_a_row_are_hung_with_the_error() -> None:
    """One failure is retried an interval later even when requests show; the second failure is a hang."""
    state = Liveness.ready_at(0)
    state, verdict = probed(state, "no answer within 30 s", 90)
    assert verdict.action == "ok" and state.probe_failures == 1
    assert observe(state, sample(100, waiting=1), 100, SETTINGS)[1].action == "ok"
    assert observe(state, sample(150, waiting=1, tokens=0), 150, SETTINGS)[1].action == "probe"
    state, verdict = probed(state, "no answer within 30 s", 180)
    assert verdict.action == "hung"
    assert verdict.evidence is not None and "2 times" in verdict.evidence and "no answer" in verdict.evidence


def test_a_good_probe_clears_the_failures() -> None:
    """A probe that answers between two failures resets the count."""
    state = Liveness.ready_at(0)
    state, _ = probed(state, "HTTP 500: boom", 60)
    state, _ = probed(state, None, 120)
    state, verdict = probed(state, "HTTP 500: boom", 180)
    assert verdict.action == "ok" and state.probe_failures == 1


def test_zero_settings_turn_the_checks_off() -> None:
    """stall_seconds = 0 and liveness_interval_seconds = 0 switch each check off."""
    off = LivenessSettings(stall_seconds=0, probe_interval_seconds=0)
    state = Liveness.ready_at(0)
    assert observe(state, sample(1000, waiting=9, tokens=1), 1000, off)[1].action == "ok"
    assert observe(state, sample(5000), 5000, off)[1].action == "ok"


def test_served_name_is_the_name_the_server_answers_to() -> None:
    """The probes ask for the name vLLM serves: extra_args' --served-model-name (X or =X, theirs last in the
    argv), else the served_model_name setting, else the model."""
    from dankserve.plan.serve_args import served_name

    assert served_name(None, ("--served-model-name", "chat"), "org/m") == "chat"
    assert served_name("set", ("--served-model-name=chat",), "org/m") == "chat"
    assert served_name("set", ("--max-model-len", "8"), "org/m") == "set"
    assert served_name(None, ("--max-model-len", "8"), "org/m") == "org/m"
