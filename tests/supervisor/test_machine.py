"""Tests for dankserve.supervisor.machine: the transition table, exhaustively and by hypothesis."""

from __future__ import annotations

import runpy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dankserve.bootlog.facts import BootFacts, FailureClass
from dankserve.state import LearnedKv
from dankserve.supervisor import machine as m
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.policy import FailureCause, RestartSettings

RESTART = RestartSettings(
    initial_seconds=1, max_seconds=30, multiplier=2, jitter_seconds=1, window_seconds=300, max_failures_in_window=3
)
CONFIG = m.MachineConfig(RESTART, boot_timeout_seconds=60, health_interval_seconds=5, gpu_memory_settle_seconds=10)
LEARNED = LearnedKv(10 * 2**30, (80 * 2**30,), 0.0)
READY_FACTS = BootFacts(ready=True, kv_cache_memory_bytes=5 * 2**30, kv_cache_memory_bytes_source="suggested")

SAMPLES: dict[type[Any], Any] = {
    m.Begin: m.Begin(),
    m.StopRequested: m.StopRequested(),
    m.Reconfigured: m.Reconfigured(CONFIG),
    m.Tick: m.Tick(),
    m.WeightsProgress: m.WeightsProgress(40),
    m.WeightsReady: m.WeightsReady(),
    m.WeightsFailed: m.WeightsFailed("connection reset", permanent=False),
    m.ImageReady: m.ImageReady("0.8.5", "sha256:x"),
    m.BootPlanned: m.BootPlanned(("GPU-0",), "kv1-x", LEARNED, "0.8.5"),
    m.GpusAcquired: m.GpusAcquired(),
    m.FreeMemoryRead: m.FreeMemoryRead((80 * 2**30,)),
    m.PortBusy: m.PortBusy(8000, "pid 7 (python3)"),
    m.PortFree: m.PortFree(),
    m.WorkloadStarted: m.WorkloadStarted("w2", 3),
    m.BootLog: m.BootLog(READY_FACTS, Phase.READY),
    m.LogEnded: m.LogEnded(),
    m.Exited: m.Exited(1),
    m.StillRunning: m.StillRunning(),
    m.HealthChecked: m.HealthChecked(200),
    m.WarmedUp: m.WarmedUp(None, 0.4),
    m.LivenessFailed: m.LivenessFailed(FailureCause.ENGINE_DEAD, "no token in 30 s"),
    m.MemberLost: m.MemberLost("10.0.0.2 did not answer 2 times"),
    m.GpuTenants: m.GpuTenants(False, 0.5),
    m.RuntimeUnreachable: m.RuntimeUnreachable("connection refused", "12:00:00"),
    m.Refused: m.Refused("bad config"),
    m.Crashed: m.Crashed("KeyError: 'x'"),
    m.LauncherLost: m.LauncherLost("connection refused"),
    # swap groups
    m.SleepRequested: m.SleepRequested("1", "make room for b"),
    m.FellAsleep: m.FellAsleep(0.22),
    m.SuspendFailed: m.SuspendFailed(0.3, "GPU checkpoint of pid 7 failed: CUDA_ERROR_NOT_SUPPORTED", lasting=True),
    m.SleepUnsupported: m.SleepUnsupported("/is_sleeping 404"),
    m.SleepKeptMemory: m.SleepKeptMemory(20 << 30, "asleep, yet its processes still hold 20.00 GiB"),
    m.WokeWrong: m.WokeWrong("the canary completion answered other tokens"),
    m.SleepFailed: m.SleepFailed("HTTP 500"),
    m.WakeRequested: m.WakeRequested(),
    m.WokeUp: m.WokeUp(0.2),
    m.WakeFailed: m.WakeFailed("HTTP 500"),
    m.SnapshotCaptured: m.SnapshotCaptured(0.5, 1 << 20),
    m.SnapshotCaptureFailed: m.SnapshotCaptureFailed("capture failed at gpu_checkpoint (pid 7): NOT_SUPPORTED"),
    m.Restored: m.Restored("w2", 2, 0.4),
    m.RestoreFailed: m.RestoreFailed("restore failed at criu_restore: pid 7 is taken by another process"),
}


def in_stage(stage: m.Stage) -> m.MachineState:
    """A plausible machine in `stage` (a running workload where one runs, a failure where one is pending)."""
    boot = m.Boot(started_at=0.0, uuids=("GPU-0",), boot_key="kv1-x", learned=LEARNED, deadline=100.0)
    if stage in m.RUNNING or stage in m.SLEEP_STAGES:
        boot = replace(boot, workload_id="w1")
    pending = (
        m.Failure(FailureCause.CRASH, "exit 1", None, False) if stage in (m.Stage.ENDING, m.Stage.DECIDING) else None
    )
    swap = m.SwapTimes(level="1", since=0.0) if stage in m.SLEEP_STAGES else m.SwapTimes()
    return m.MachineState(
        CONFIG, stage=stage, boot=boot if stage is not m.Stage.IDLE else None, pending=pending, swap=swap
    )


def with_boot(state: m.MachineState, **changes: Any) -> m.MachineState:
    """`state` with its boot's fields changed."""
    assert state.boot is not None
    return replace(state, boot=replace(state.boot, **changes))


def test_every_event_has_a_sample_and_every_pair_a_rule() -> None:
    """The table covers every stage x event type, and the tests have an event of every type."""
    assert set(SAMPLES) == set(m.EVENT_TYPES)
    assert len(m.TRANSITIONS) == len(m.Stage) * len(m.EVENT_TYPES)


@pytest.mark.parametrize("stage", list(m.Stage), ids=lambda s: s.value)
@pytest.mark.parametrize("kind", m.EVENT_TYPES, ids=lambda k: k.__name__)
def test_each_pair_is_allowed_refused_or_ignored_as_the_table_says(stage: m.Stage, kind: type[Any]) -> None:
    """Allowed events lead only to a declared stage; refused ones leave the state and warn; ignored ones do nothing."""
    state = in_stage(stage)
    rule_ = m.TRANSITIONS[stage, kind]
    after, commands = m.step(state, SAMPLES[kind], 10.0)
    if rule_.kind == "ignored":
        assert after == state and commands == ()
    elif rule_.kind == "refused":
        assert after == state
        assert commands == (m.note("event_refused", "warning", stage=stage.value, received=kind.__name__),)
    else:
        assert after.stage in rule_.to, f"{stage} --{kind.__name__}--> {after.stage}, declared {rule_.to}"
        after.phase, after.status  # noqa: B018  (derivable in every state)


def test_terminal_states_ignore_everything() -> None:
    """A failed or stopped machine drops every event: only `up` or a config change starts a new worker."""
    for stage in m.TERMINAL:
        for kind in m.EVENT_TYPES:
            assert m.TRANSITIONS[stage, kind].kind == "ignored"


def test_status_and_phase_derive_from_the_stage() -> None:
    """status' `state` and `phase` are functions of the machine's state, never set beside it."""
    assert in_stage(m.Stage.READY).status == "ready"
    assert in_stage(m.Stage.BACKOFF).phase is Phase.RESTARTING
    assert in_stage(m.Stage.DOWNLOADING).phase is Phase.DOWNLOADING
    booting = in_stage(m.Stage.BOOTING)
    assert booting.status == "starting"
    assert with_boot(booting, phase=Phase.COMPILING).phase is Phase.COMPILING


def test_unknown_free_memory_never_passes_the_learned_bytes_guard() -> None:
    """A GPU whose free memory could not be read makes the boot profile, and nothing is learned from it."""
    state = with_boot(in_stage(m.Stage.MEASURING), settle_until=0.0)
    after, commands = m.step(state, m.FreeMemoryRead((None,)), 10.0)
    assert after.stage is m.Stage.STARTING
    start = commands[-1]
    assert isinstance(start, m.StartWorkload) and start.overrides.kv_cache_memory_bytes is None
    assert after.boot is not None and after.boot.baseline is None
    assert "unknown" in dict(commands[0].fields)["reason"]  # type: ignore[union-attr]


def test_learned_bytes_are_reused_when_memory_is_back() -> None:
    """With the recorded free memory available again, the learned bytes are passed to the boot."""
    after, commands = m.step(in_stage(m.Stage.MEASURING), m.FreeMemoryRead((80 * 2**30,)), 10.0)
    start = commands[-1]
    assert isinstance(start, m.StartWorkload) and start.overrides.kv_cache_memory_bytes == LEARNED.kv_cache_memory_bytes
    assert after.kv_cache_learned_used


def test_short_memory_is_read_again_until_the_settle_time() -> None:
    """Less free memory than learned: read again every half second until gpu_memory_settle_seconds pass."""
    state = with_boot(in_stage(m.Stage.MEASURING), settle_until=20.0)
    after, commands = m.step(state, m.FreeMemoryRead((1,)), 10.0)
    assert after.stage is m.Stage.MEASURING and commands == () and after.wake_at == 10.5
    after, commands = m.step(after, m.Tick(), 10.5)
    assert commands == (m.ReadFreeMemory(("GPU-0",), settle_first=False),)
    after, commands = m.step(after, m.FreeMemoryRead((1,)), 21.0)
    assert after.stage is m.Stage.STARTING


def test_ready_needs_this_boots_log_line_as_well_as_health() -> None:
    """/health answering 200 before this boot's log said the server is up is another server's answer."""
    booting = in_stage(m.Stage.BOOTING)
    after, _ = m.step(booting, m.HealthChecked(200), 1.0)
    assert after.stage is m.Stage.BOOTING
    after, commands = m.step(booting, m.BootLog(READY_FACTS, Phase.READY), 1.0)
    assert commands[-1] == m.ProbeHealth(1.0)
    after, commands = m.step(after, m.HealthChecked(200), 1.1)
    assert after.stage is m.Stage.BOOTING and commands[-1] == m.WarmUp(m.WARM_UP_TIMEOUT_SECONDS)
    after, commands = m.step(after, m.WarmedUp(None, 0.7), 1.8)
    assert after.stage is m.Stage.READY and after.status == "ready"
    assert any(isinstance(c, m.RecordBoot) for c in commands)


def up_and_answered() -> m.MachineState:
    """A boot whose log said it is up and whose /health answered: the warm-up was sent at 1.1."""
    after, _ = m.step(in_stage(m.Stage.BOOTING), m.BootLog(READY_FACTS, Phase.READY), 1.0)
    after, _ = m.step(after, m.HealthChecked(200), 1.1)
    return after


def test_up_and_answered_sends_the_warm_up_before_ready_and_probes_no_more() -> None:
    """/health 200 with the log's startup line: the warm-up (bounded by the boot deadline) and phase warming;
    no health probe and no second warm-up while it runs."""
    warming = up_and_answered()
    assert warming.phase is Phase.WARMING and warming.status == "starting"
    near = with_boot(in_stage(m.Stage.BOOTING), deadline=21.0)
    near, _ = m.step(near, m.BootLog(READY_FACTS, Phase.READY), 1.0)
    _, commands = m.step(near, m.HealthChecked(200), 11.0)
    assert commands[-1] == m.WarmUp(10.0)
    assert m.step(warming, m.HealthChecked(200), 1.2) == (warming, ())
    _, commands = m.step(warming, m.Tick(), 5.0)
    assert not [c for c in commands if isinstance(c, m.ProbeHealth | m.WarmUp)]
    late, _ = m.step(warming, m.BootLog(READY_FACTS, Phase.CAPTURING), 1.3)
    assert late.phase is Phase.WARMING


def test_ready_follows_the_warm_up_with_its_seconds_in_the_ready_note() -> None:
    """READY comes after the warm-up came back; the `ready` note carries the warm-up's seconds and the whole boot's."""
    after, commands = m.step(up_and_answered(), m.WarmedUp(None, 0.72), 2.0)
    assert after.stage is m.Stage.READY and after.phase is Phase.READY
    ready = next(c for c in commands if isinstance(c, m.Note) and c.event == "ready")
    assert dict(ready.fields)["warm_up_seconds"] == 0.72 and dict(ready.fields)["boot_seconds"] == 2.0


def test_an_unwarmed_warm_up_is_said_and_ready_follows() -> None:
    """A warm-up answered with a 4xx fails nothing: READY follows, with a warning that names the answer."""
    after, commands = m.step(up_and_answered(), m.WarmedUp(None, 0.01, "completion: HTTP 404 for model 'x'"), 2.0)
    assert after.stage is m.Stage.READY
    (said,) = [c for c in commands if isinstance(c, m.Note) and c.event == "warm_up_unwarmed"]
    assert said.level == "warning" and "HTTP 404" in str(dict(said.fields)["answer"])


def test_a_failed_warm_up_fails_the_boot_by_the_policy() -> None:
    """A warm-up that failed is the boot's failure (a hung engine when the log names none): never ready, torn down."""
    after, commands = m.step(up_and_answered(), m.WarmedUp("HTTP 500: boom", 1.0), 2.0)
    assert after.stage is m.Stage.DECIDING and after.pending is not None
    assert after.pending.cause is FailureCause.ENGINE_HUNG and not after.pending.served
    assert "the warm-up request before ready failed: HTTP 500: boom" in (after.pending.message or "")
    assert any(isinstance(c, m.Note) and c.event == "warm_up_failed" for c in commands)
    assert not any(isinstance(c, m.Note) and c.event == "ready" for c in commands)


def test_a_warm_up_answer_nobody_asked_for_changes_nothing() -> None:
    """WarmedUp with no warm-up sent (a late answer of an earlier boot) is dropped."""
    booting = in_stage(m.Stage.BOOTING)
    assert m.step(booting, m.WarmedUp(None, 0.1), 1.0) == (booting, ())


def test_a_server_up_in_its_log_but_unanswered_on_its_port_is_said_once_then_cleared() -> None:
    """Startup line seen, /health silent for 30 s (a stale port forward on the H200): one warning and a message,
    still booting; the message goes once /health answers."""
    after, _ = m.step(in_stage(m.Stage.BOOTING), m.BootLog(READY_FACTS, Phase.READY), 1.0)
    after, _ = m.step(after, m.HealthChecked(None, "connection refused"), 1.1)
    after, commands = m.step(after, m.Tick(), 1.0 + m.UNANSWERED_HEALTH_SECONDS)
    warnings = [c for c in commands if isinstance(c, m.Note) and c.event == "health_unanswered"]
    assert len(warnings) == 1 and after.stage is m.Stage.BOOTING
    assert after.message is not None and "/health on its port has not answered" in after.message
    after, commands = m.step(after, m.Tick(), 2.0 + m.UNANSWERED_HEALTH_SECONDS)
    assert not [c for c in commands if isinstance(c, m.Note) and c.event == "health_unanswered"]
    after, _ = m.step(after, m.HealthChecked(200), 3.0 + m.UNANSWERED_HEALTH_SECONDS)
    after, _ = m.step(after, m.WarmedUp(None, 0.1), 3.1 + m.UNANSWERED_HEALTH_SECONDS)
    assert after.stage is m.Stage.READY and after.message is None


def test_a_port_held_by_another_process_is_waited_for_without_counting_a_failure() -> None:
    """PortBusy names the holder in the message and retries later; no failure, no restart is counted."""
    after, commands = m.step(in_stage(m.Stage.STARTING), m.PortBusy(8000, "pid 7 (python3)"), 1.0)
    assert after.stage is m.Stage.RETRY_WAIT and after.failures == () and after.restarts == 0
    assert after.message is not None and "port 8000 is in use by pid 7 (python3)" in after.message
    assert m.ReleaseGpus() in commands


def test_a_held_port_is_looked_at_every_second_and_the_boot_begins_once_it_is_free() -> None:
    """While the port is held the machine asks CheckPort every PORT_RECHECK_SECONDS (warning once per holder,
    no growing backoff); PortFree begins the boot at once."""
    after, commands = m.step(in_stage(m.Stage.STARTING), m.PortBusy(8000, "pid 7 (python3)"), 1.0)
    assert after.wake_at == 1.0 + m.PORT_RECHECK_SECONDS
    assert "fix: stop that process" in (after.message or "")
    for n in range(2, 6):
        after, commands = m.step(after, m.Tick(), after.wake_at or 0.0)
        assert commands == (m.CheckPort(),)
        after, commands = m.step(after, m.PortBusy(8000, "pid 7 (python3)"), float(n))
        assert after.stage is m.Stage.RETRY_WAIT and commands == () and after.wake_at == n + m.PORT_RECHECK_SECONDS
    after, _ = m.step(after, m.Tick(), after.wake_at or 0.0)
    after, commands = m.step(after, m.PortFree(), 9.0)
    assert after.stage is m.Stage.PULLING and after.port_holder is None and m.EnsureImage() in commands


def test_a_runtime_outage_while_serving_keeps_serving() -> None:
    """While ready, an unreachable runtime is noted and asked again later; the deployment stays ready."""
    ready = with_boot(in_stage(m.Stage.READY), log_ended=True)
    after, _ = m.step(ready, m.RuntimeUnreachable("refused", "12:00:00"), 5.0)
    assert after.stage is m.Stage.READY and after.message == "Podman unreachable since 12:00:00: refused"
    after, commands = m.step(after, m.StillRunning(), 7.0)
    assert after.message is None and commands[-1] == m.FollowLogs("w1", resume=True)


def test_a_liveness_failure_is_a_failure_with_its_cause() -> None:
    """LivenessFailed (issue 17's probe) stops the workload and asks the policy with the probe's cause."""
    after, commands = m.step(in_stage(m.Stage.READY), m.LivenessFailed(FailureCause.ENGINE_DEAD, "hung"), 5.0)
    assert after.stage is m.Stage.DECIDING and after.pending is not None and after.pending.served
    assert commands[:2] == (m.StopWorkload("w1"), m.RemoveWorkload("w1"))
    after, commands = m.step(after, m.GpuTenants(False, 0.0), 6.0)
    assert after.stage is m.Stage.BACKOFF and m.RecordFailure("engine_dead", "hung") in commands


def test_a_lost_group_member_reaches_the_last_failure() -> None:
    """MemberLost names the member in the failure the policy and `status` see."""
    after, _ = m.step(in_stage(m.Stage.READY), m.MemberLost("10.0.0.2 is gone"), 5.0)
    after, commands = m.step(after, m.GpuTenants(False), 6.0)
    record = next(c for c in commands if isinstance(c, m.RecordFailure))
    assert "10.0.0.2 is gone" in (record.message or "")


def test_downloading_comes_first_when_dankserve_fetches_weights() -> None:
    """With download_weights the boot starts in `downloading`, shows the percentage, then pulls the image."""
    state = m.initial_state(replace(CONFIG, download_weights=True))
    state, commands = m.step(state, m.Begin(), 0.0)
    assert state.stage is m.Stage.DOWNLOADING and commands == (m.EnsureWeights(),)
    state, _ = m.step(state, m.WeightsProgress(42), 1.0)
    assert state.weights_percent == 42 and state.phase is Phase.DOWNLOADING
    state, commands = m.step(state, m.WeightsReady(), 2.0)
    assert state.stage is m.Stage.PULLING and commands == (m.EnsureImage(),)
    failed, commands = m.step(replace(state, stage=m.Stage.DOWNLOADING), m.WeightsFailed("404", permanent=True), 3.0)
    assert failed.stage is m.Stage.FAILED and m.RecordFailure("model_not_found", "404") in commands
    retry, _ = m.step(replace(state, stage=m.Stage.DOWNLOADING), m.WeightsFailed("reset", permanent=False), 3.0)
    assert retry.stage is m.Stage.RETRY_WAIT and retry.failures == ()


def test_an_oom_again_after_the_relearn_is_a_configuration_error() -> None:
    """OOM with learned bytes drops them; the next OOM with no other process is a configuration error."""
    state = replace(in_stage(m.Stage.DECIDING), pending=m.Failure(FailureCause.OOM_LOAD, "oom", None, False))
    state = with_boot(state, learned_used=LEARNED.kv_cache_memory_bytes)
    after, commands = m.step(state, m.GpuTenants(False), 1.0)
    assert after.stage is m.Stage.BACKOFF and m.ForgetLearned("kv1-x") in commands and after.relearned
    again = replace(after, stage=m.Stage.DECIDING, pending=m.Failure(FailureCause.OOM_LOAD, "oom", None, False))
    final, _ = m.step(again, m.GpuTenants(False), 2.0)
    assert final.stage is m.Stage.FAILED
    waiting, _ = m.step(again, m.GpuTenants(None), 2.0)
    assert waiting.stage is m.Stage.BACKOFF, "unknown GPU tenants wait; they never count as none"


def test_an_oom_beside_a_neighbour_that_did_not_grow_drops_the_learned_bytes() -> None:
    """Other processes that hold no more than when the bytes were learned do not explain an OOM: relearn."""
    state = replace(in_stage(m.Stage.DECIDING), pending=m.Failure(FailureCause.OOM_LOAD, "oom", None, False))
    state = with_boot(state, learned_used=LEARNED.kv_cache_memory_bytes)
    asleep_neighbour = m.GpuTenants(True, 0.5, (LEARNED.baseline_free_bytes[0] - (1 << 30) // 2,))
    after, commands = m.step(state, asleep_neighbour, 1.0)
    assert m.ForgetLearned("kv1-x") in commands and after.relearned
    grown = m.GpuTenants(True, 0.5, (LEARNED.baseline_free_bytes[0] - (8 << 30),))
    waiting, commands = m.step(state, grown, 1.0)
    assert waiting.stage is m.Stage.BACKOFF and not any(isinstance(c, m.ForgetLearned) for c in commands)
    unread, _ = m.step(state, m.GpuTenants(True, 0.5, (None,)), 1.0)
    assert not unread.relearned, "an unread GPU never counts as room to spare"


def test_a_log_failure_waits_for_the_exit_then_decides() -> None:
    """A failure line while booting: wait for the exit, remove, then ask the policy (bad_argument: failed)."""
    facts = BootFacts(failure=FailureClass.BAD_ARGUMENT, failure_message="unrecognized arguments: --x")
    after, commands = m.step(in_stage(m.Stage.BOOTING), m.BootLog(facts), 1.0)
    assert after.stage is m.Stage.ENDING and commands[-1] == m.WaitExit("w1", m.EXIT_WAIT_SECONDS)
    after, commands = m.step(after, m.StillRunning(), 11.0)
    assert commands[:2] == (m.StopWorkload("w1"), m.RemoveWorkload("w1"))
    after, _ = m.step(after, m.GpuTenants(False), 12.0)
    assert after.stage is m.Stage.FAILED and after.message is not None and "bad_argument" in after.message


def test_the_architecture_doc_shows_the_current_state_table() -> None:
    """docs/ARCHITECTURE.md's state table is the one rendered from TRANSITIONS (`make docs`)."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "ARCHITECTURE.md").read_text()
    render_state_table = runpy.run_path(str(root / "scripts" / "gen_state_table.py"))["render_state_table"]
    assert render_state_table() in doc, "regenerate: make docs"


# --- hypothesis: any sequence of events keeps the machine within its table ------------------------------

FACTS = st.builds(
    BootFacts,
    ready=st.booleans(),
    failure=st.none() | st.sampled_from(list(FailureClass)),
    kv_cache_memory_bytes=st.none() | st.integers(1, 2**40),
    kv_cache_memory_bytes_source=st.sampled_from([None, "suggested", "given"]),
    estimated_max_model_len=st.none() | st.integers(1, 10**6),
)
EVENTS = st.one_of(
    st.just(m.StopRequested()),
    st.builds(m.Reconfigured, st.just(CONFIG), st.booleans()),
    st.just(m.Tick()),
    st.builds(m.WeightsProgress, st.integers(-5, 105)),
    st.just(m.WeightsReady()),
    st.builds(m.WeightsFailed, st.text(max_size=5), st.booleans()),
    st.builds(m.ImageReady, st.none() | st.just("0.8.5"), st.none() | st.just("sha256:x")),
    st.builds(
        m.BootPlanned,
        st.just(("GPU-0",)),
        st.just("kv1-x"),
        st.none() | st.just(LEARNED),
        st.just("0.8.5"),
        st.none() | st.floats(0.1, 0.99),
        st.none() | st.floats(0.1, 0.99),
        st.none() | st.builds(m.ExistingWorkload, st.just("old"), st.booleans(), st.booleans()),
        st.booleans(),
    ),
    st.just(m.GpusAcquired()),
    st.builds(m.FreeMemoryRead, st.tuples(st.none() | st.integers(0, 2**40))),
    st.builds(m.PortBusy, st.just(8000), st.just("pid 1")),
    st.just(m.PortFree()),
    st.builds(m.WorkloadStarted, st.just("w9"), st.integers(1, 100)),
    st.builds(m.BootLog, FACTS, st.none() | st.sampled_from(list(Phase))),
    st.just(m.LogEnded()),
    st.builds(m.Exited, st.none() | st.integers(-9, 255), st.booleans()),
    st.just(m.StillRunning()),
    st.builds(m.HealthChecked, st.sampled_from([None, 200, 503, 500])),
    st.builds(m.LivenessFailed, st.sampled_from(list(FailureCause)), st.just("hung")),
    st.builds(m.MemberLost, st.just("gone")),
    st.builds(m.GpuTenants, st.none() | st.booleans(), st.floats(0, 0.999)),
    st.builds(m.RuntimeUnreachable, st.just("refused"), st.just("12:00:00")),
    st.builds(m.Refused, st.just("bad")),
    st.builds(m.Crashed, st.just("bug")),
    st.builds(m.SleepRequested, st.sampled_from(["1", "2", "stop"]), st.just("room")),
    st.builds(m.FellAsleep, st.floats(0, 5)),
    st.builds(m.SleepUnsupported, st.just("404")),
    st.builds(m.SleepFailed, st.just("500")),
    st.just(m.WakeRequested()),
    st.builds(m.WokeUp, st.floats(0, 5)),
    st.builds(m.WakeFailed, st.just("500")),
)


class LifecycleMachine(RuleBasedStateMachine):
    """Random events at random times: every step stays within the table and keeps the invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.state, _ = m.step(m.initial_state(CONFIG), m.Begin(), 0.0)
        self.now = 0.0

    @rule(event=EVENTS, later=st.floats(0, 120))
    def feed(self, event: Any, later: float) -> None:
        self.now += later
        before = self.state
        rule_ = m.TRANSITIONS[before.stage, type(event)]
        after, commands = m.step(before, event, self.now)
        if rule_.kind == "allowed":
            assert after.stage in rule_.to
        else:
            assert after == before
        assert after.restarts >= before.restarts
        assert all(isinstance(c, m.Command.__args__) for c in commands)
        if before.stage in m.TERMINAL:
            assert after == before and commands == ()
        if before.stage is m.Stage.BOOTING and after.stage is m.Stage.READY:  # this boot's log and /health
            assert before.boot is not None and before.boot.facts.ready
            assert before.boot.warm_up_since is not None
            assert isinstance(event, m.WarmedUp) and event.error is None
        if isinstance(event, m.FreeMemoryRead) and None in event.free:  # unknown never passes the guard
            assert all(c.overrides.kv_cache_memory_bytes is None for c in commands if isinstance(c, m.StartWorkload))
        self.state = after

    @rule(data=st.data(), later=st.floats(0, 2))
    def boot_goes_on(self, data: st.DataObject, later: float) -> None:
        """The event a boot expects next in this stage (random walks alone rarely get far)."""
        onward = {
            m.Stage.DOWNLOADING: st.just(m.WeightsReady()),
            m.Stage.PULLING: st.just(SAMPLES[m.ImageReady]),
            m.Stage.PLANNING: st.sampled_from([SAMPLES[m.BootPlanned], m.BootPlanned(("GPU-0",), "k", None, None)]),
            m.Stage.WAITING_GPUS: st.just(m.GpusAcquired()),
            m.Stage.MEASURING: st.builds(m.FreeMemoryRead, st.tuples(st.none() | st.integers(0, 2**40))),
            m.Stage.STARTING: st.just(SAMPLES[m.WorkloadStarted]),
            m.Stage.BOOTING: st.sampled_from(
                [
                    m.BootLog(READY_FACTS, Phase.READY),
                    m.HealthChecked(200),
                    m.WarmedUp(None, 0.5),
                    m.BootLog(BootFacts(failure=FailureClass.OOM_LOAD, failure_message="CUDA out of memory")),
                ]
            ),
            m.Stage.READY: st.sampled_from(
                [m.HealthChecked(503), m.Tick(), m.LogEnded(), m.SleepRequested("1"), m.SleepRequested("stop")]
            ),
            m.Stage.FALLING_ASLEEP: st.sampled_from(
                [m.FellAsleep(0.2), m.SleepUnsupported("404"), m.WakeRequested(), m.SleepFailed("500")]
            ),
            m.Stage.ASLEEP: st.sampled_from([m.WakeRequested(), m.Exited(1), m.Reconfigured(CONFIG, swap_member=True)]),
            m.Stage.WAKING: st.sampled_from([m.WokeUp(0.2), m.WakeFailed("500")]),
            m.Stage.ENDING: st.just(m.Exited(1)),
            m.Stage.DECIDING: st.builds(m.GpuTenants, st.none() | st.booleans(), st.floats(0, 0.999)),
        }.get(self.state.stage)
        if onward is not None:
            self.feed(data.draw(onward), later)

    @precondition(lambda self: self.state.stage in (m.Stage.BACKOFF, m.Stage.RETRY_WAIT))
    @rule()
    def time_passes(self) -> None:
        assert self.state.wake_at is not None
        self.now = max(self.now, self.state.wake_at)
        self.state, commands = m.step(self.state, m.Tick(), self.now)
        if commands == (m.CheckPort(),):  # a held port is looked at again: it is free now
            self.state, commands = m.step(self.state, m.PortFree(), self.now)
        assert self.state.stage in (m.Stage.DOWNLOADING, m.Stage.PULLING) and commands

    @invariant()
    def running_stages_know_their_workload(self) -> None:
        if self.state.stage in m.RUNNING:
            assert self.state.workload_id is not None

    @invariant()
    def waiting_stages_have_a_wake_time(self) -> None:
        if self.state.stage in (m.Stage.BACKOFF, m.Stage.RETRY_WAIT, m.Stage.BOOTING, m.Stage.READY):
            assert self.state.wake_at is not None

    @invariant()
    def a_pending_failure_only_while_ending_or_deciding(self) -> None:
        if self.state.pending is not None:
            assert self.state.stage in (m.Stage.ENDING, m.Stage.DECIDING)

    @invariant()
    def sleeping_stages_know_their_workload_unless_stopped(self) -> None:
        if self.state.stage in (m.Stage.FALLING_ASLEEP, m.Stage.WAKING):
            assert self.state.workload_id is not None or self.state.swap.level == "stop"
        if self.state.stage is m.Stage.ASLEEP and self.state.swap.level == "stop":
            assert self.state.boot is None

    @invariant()
    def status_is_derivable(self) -> None:
        assert self.state.status in (
            *("starting", "ready", "restarting", "failed", "stopped"),
            *("falling_asleep", "asleep", "waking"),
        )
        assert isinstance(self.state.phase, Phase)


TestLifecycleMachine = LifecycleMachine.TestCase
TestLifecycleMachine.settings = hsettings(max_examples=300, stateful_step_count=40, deadline=None)


# --- swap groups (issue 16) ---------------------------------------------------------------------------


def test_a_wake_asked_while_falling_asleep_wakes_once_asleep() -> None:
    """WakeRequested during /sleep is kept; FellAsleep then goes straight to waking (and records the sleep)."""
    ready_ = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, commands = m.step(ready_, m.SleepRequested("1", "room"), 10.0)
    assert falling.stage is m.Stage.FALLING_ASLEEP and commands[-1] == m.SleepServer("w1", "1")
    kept, commands = m.step(falling, m.WakeRequested(), 10.1)
    assert kept.swap.wake_wanted and commands == ()
    waking, commands = m.step(kept, m.FellAsleep(0.25), 10.3)
    assert waking.stage is m.Stage.WAKING and commands[-1] == m.WakeServer("w1", "1")
    assert waking.swap.last_sleep_seconds == 0.25 and waking.status == "waking"
    awake, _ = m.step(waking, m.WokeUp(0.2), 10.5)
    assert awake.stage is m.Stage.READY and awake.wake_at == 10.5 and awake.swap.last_wake_seconds == 0.2


def test_a_member_stopped_to_sleep_shows_waking_while_it_boots() -> None:
    """Sleeping by stopping drops the workload; the wake is a boot that status calls waking until ready."""
    ready_ = with_boot(in_stage(m.Stage.READY), workload_id="w1")
    falling, _ = m.step(ready_, m.SleepRequested("1"), 1.0)
    stopping, commands = m.step(falling, m.SleepUnsupported("/is_sleeping 404"), 1.1)
    assert commands[-1] == m.SleepServer("w1", "stop") and stopping.swap.level == "stop"
    asleep, commands = m.step(stopping, m.FellAsleep(2.0), 3.0)
    assert asleep.stage is m.Stage.ASLEEP and asleep.boot is None and m.ReleaseGpus() in commands
    booting, commands = m.step(asleep, m.WakeRequested(), 5.0)
    assert booting.stage is m.Stage.PULLING and booting.status == "waking" and m.EnsureImage() in commands


def test_a_server_that_dies_asleep_is_a_failure() -> None:
    """The server exits while asleep: the policy decides, as for a server that died serving."""
    asleep = in_stage(m.Stage.ASLEEP)
    after, _ = m.step(asleep, m.Exited(137), 5.0)
    assert after.stage is m.Stage.DECIDING and after.pending is not None and after.pending.served
    # Recorded as a failure, but nobody waits for it: it stays asleep (by stop) instead of taking the GPU back.
    asleep_again, commands = m.step(after, m.GpuTenants(False, 0.0), 6.0)
    assert asleep_again.stage is m.Stage.ASLEEP and asleep_again.boot is None and asleep_again.swap.level == "stop"
    assert asleep_again.last_failure is not None and asleep_again.last_failure.cause == "engine_dead"
    assert any(isinstance(c, m.RecordFailure) for c in commands) and m.RecordRestart() not in commands
    booting, _ = m.step(asleep_again, m.WakeRequested(), 7.0)
    assert booting.status == "waking"


def test_a_reload_of_a_sleeping_member_stops_its_server_and_keeps_it_asleep_until_asked() -> None:
    """Its plan changed: the server is removed and the GPUs' slot goes back, it stays asleep by stop with the
    new config (no boot, which would put the awake members to sleep), and its next wake boots afresh."""
    changed = replace(CONFIG, max_model_len_setting=4096)
    remediated = frozenset({FailureCause.NO_KV_MEMORY})
    asleep = with_boot(replace(in_stage(m.Stage.ASLEEP), remediated=remediated), server=None)
    after, commands = m.step(asleep, m.Reconfigured(changed, swap_member=True), 5.0)
    assert after.stage is m.Stage.ASLEEP and after.status == "asleep" and after.boot is None
    assert after.swap.level == "stop" and after.sleep_record == m.SleepRecord("stop") and after.config == changed
    assert after.remediated == frozenset() and after.wake_at is None
    assert m.StopWorkload("w1") in commands and m.RemoveWorkload("w1") in commands and m.ReleaseGpus() in commands
    assert not any(isinstance(c, m.EnsureImage | m.EnsureWeights) for c in commands)
    kept = next(c for c in commands if isinstance(c, m.Note) and c.event == "reload_kept_asleep")
    assert dict(kept.fields)["sleep_level_was"] == "1"
    booting, commands = m.step(after, m.WakeRequested(), 9.0)
    assert booting.stage is m.Stage.PULLING and booting.status == "waking" and m.EnsureImage() in commands
    # Asleep by stop already: nothing runs to stop.
    again, commands = m.step(after, m.Reconfigured(CONFIG, swap_member=True), 10.0)
    assert again.stage is m.Stage.ASLEEP and again.swap.level == "stop" and again.config == CONFIG
    assert not any(isinstance(c, m.StopWorkload | m.RemoveWorkload) for c in commands)


def test_a_reload_boots_an_awake_member_and_one_that_left_its_group() -> None:
    """Awake (or out of any swap group now, with nothing to wake it): the reload restarts it as before."""
    for state, member in ((in_stage(m.Stage.READY), True), (in_stage(m.Stage.ASLEEP), False)):
        after, commands = m.step(state, m.Reconfigured(CONFIG, swap_member=member), 5.0)
        assert after.stage is m.Stage.PULLING and m.StopWorkload("w1") in commands and m.EnsureImage() in commands


def test_a_member_added_by_a_reload_to_a_running_group_joins_asleep_by_stop() -> None:
    """Begin(asleep): no boot, asleep at stop; its first wake is its first boot."""
    joined, commands = m.step(m.initial_state(CONFIG), m.Begin(asleep=True), 0.0)
    assert joined.stage is m.Stage.ASLEEP and joined.swap.level == "stop" and joined.boot is None
    assert [c.event for c in commands if isinstance(c, m.Note)] == ["joined_asleep"]
    booting, commands = m.step(joined, m.WakeRequested(), 3.0)
    assert booting.stage is m.Stage.PULLING and booting.status == "waking" and m.EnsureImage() in commands


# A daemon killed with -9 while a swap group runs: the next one adopts its members as they were.


def _found(
    sleeping: bool | None, remembered: m.SleepLevel | None, moving: m.SwapMove | None = None, **launcher: Any
) -> m.BootPlanned:
    found = m.LauncherFound(True, **launcher) if launcher else None
    existing = m.ExistingWorkload("w9", running=True, same_plan=True, launcher=found)
    return m.BootPlanned(
        ("GPU-0",),
        "kv1-x",
        LEARNED,
        "0.8.5",
        existing=existing,
        sleeping=sleeping,
        remembered_asleep=remembered,
        remembered_moving=moving,
    )


def test_a_sleeping_server_left_by_a_killed_daemon_is_adopted_asleep_at_its_remembered_level() -> None:
    """/is_sleeping says asleep: adopted asleep (level from the state file), followed, its GPUs' slot given back."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), _found(True, "1", server=3, server_running=True), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "1" and after.sleep_record == m.SleepRecord("1")
    assert after.boot is not None and after.boot.adopted and after.boot.workload_id == "w9" and after.boot.server == 3
    assert m.FollowLogs("w9", server=3) in commands and m.ReleaseGpus() in commands
    waking, commands = m.step(after, m.WakeRequested(), 2.0)
    assert waking.stage is m.Stage.WAKING and commands[-1] == m.WakeServer("w9", "1")


def test_a_sleeping_server_of_unknown_level_wakes_by_the_staged_wake() -> None:
    """Asleep, level not remembered: level 2, whose staged wake (reload_weights) serves either level."""
    after, _ = m.step(in_stage(m.Stage.PLANNING), _found(True, None), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "2"


def test_an_awake_server_is_adopted_as_booting_whatever_the_state_file_says() -> None:
    """/is_sleeping says awake (a wake the killed daemon began): adopted as a boot; no answer and nothing
    remembered: the same."""
    for event in (_found(False, "1"), _found(None, None)):
        after, commands = m.step(in_stage(m.Stage.PLANNING), event, 1.0)
        assert after.stage is m.Stage.BOOTING and after.boot is not None and after.boot.adopted
        assert not any(isinstance(c, m.ReleaseGpus) for c in commands)


def test_a_member_asleep_by_stop_stays_asleep_and_its_wake_reuses_the_launcher() -> None:
    """Remembered asleep by stop, its launcher runs without a server (or nothing runs): asleep, no boot; the
    wake plans afresh and asks the kept launcher for a server."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), _found(None, "stop", server=3, server_running=False), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "stop" and after.boot is None
    assert m.ReleaseGpus() in commands and not any(isinstance(c, m.AcquireGpus) for c in commands)
    nothing = m.BootPlanned(("GPU-0",), "kv1-x", LEARNED, "0.8.5", remembered_asleep="stop")
    assert m.step(in_stage(m.Stage.PLANNING), nothing, 1.0)[0].stage is m.Stage.ASLEEP
    planning, _ = m.step(after, m.WakeRequested(), 2.0)
    planning = replace(planning, stage=m.Stage.PLANNING)
    woken, _ = m.step(planning, _found(None, "stop", server=3, server_running=False), 3.0)
    assert woken.stage is m.Stage.WAITING_GPUS and woken.boot is not None and woken.boot.launcher_id == "w9"


# Killed mid-swap: the state file says which sleep or wake was under way; the next daemon sends it again.


def test_the_state_file_records_a_sleep_or_wake_before_it_is_sent() -> None:
    """Falling asleep, asleep and waking each have their record (level and move) when the command goes out."""
    falling, commands = m.step(in_stage(m.Stage.READY), m.SleepRequested("2", "make room"), 1.0)
    assert falling.sleep_record == m.SleepRecord("2", "falling_asleep") and isinstance(commands[-1], m.SleepServer)
    asleep, _ = m.step(falling, m.FellAsleep(0.5), 1.5)
    assert asleep.sleep_record == m.SleepRecord("2")
    waking, commands = m.step(asleep, m.WakeRequested(), 2.0)
    assert waking.sleep_record == m.SleepRecord("2", "waking") and isinstance(commands[-1], m.WakeServer)
    assert m.step(waking, m.WokeUp(0.7), 3.0)[0].sleep_record is None


@pytest.mark.parametrize("sleeping", [False, None])
def test_a_server_left_falling_asleep_is_put_to_sleep_again_not_adopted_awake(sleeping: bool | None) -> None:
    """Killed after /sleep was recorded (sent or not): /is_sleeping still says awake (or nothing), so the sleep
    is sent again and the member counts as holding its GPU meanwhile; never `ready` with a sleeping engine."""
    event = _found(sleeping, "2", "falling_asleep", server=3, server_running=True)
    after, commands = m.step(in_stage(m.Stage.PLANNING), event, 1.0)
    assert after.stage is m.Stage.FALLING_ASLEEP and after.status == "falling_asleep"
    assert after.boot is not None and after.boot.adopted and after.boot.server == 3
    assert commands[-1] == m.SleepServer("w9", "2", server=3) and m.FollowLogs("w9", server=3) in commands
    assert after.sleep_record == m.SleepRecord("2", "falling_asleep")
    asleep, _ = m.step(after, m.FellAsleep(0.2), 2.0)
    assert asleep.stage is m.Stage.ASLEEP and asleep.sleep_record == m.SleepRecord("2")


def test_a_server_that_fell_asleep_after_the_kill_is_adopted_asleep() -> None:
    """Remembered falling asleep and /is_sleeping says asleep: the sleep is over; adopted asleep at its level."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), _found(True, "1", "falling_asleep"), 1.0)
    assert after.stage is m.Stage.ASLEEP and after.swap.level == "1"
    assert not any(isinstance(c, m.SleepServer) for c in commands)


def test_a_member_left_stopping_to_sleep_is_stopped_again_or_adopted_asleep_by_stop() -> None:
    """Killed while stopping its server to sleep: a server still running is stopped again; none: asleep by stop."""
    event = _found(None, "stop", "falling_asleep", server=3, server_running=True)
    after, commands = m.step(in_stage(m.Stage.PLANNING), event, 1.0)
    assert after.stage is m.Stage.FALLING_ASLEEP and commands[-1] == m.SleepServer("w9", "stop", server=3)
    gone = m.BootPlanned(
        ("GPU-0",), "kv1-x", LEARNED, "0.8.5", remembered_asleep="stop", remembered_moving="falling_asleep"
    )
    assert m.step(in_stage(m.Stage.PLANNING), gone, 1.0)[0].stage is m.Stage.ASLEEP


@pytest.mark.parametrize("moving", ["falling_asleep", None])
@pytest.mark.parametrize("launcher", [None, m.LauncherFound(reusable=False, server=3, server_running=True)])
def test_a_workload_left_not_running_by_a_stop_is_stopped_and_removed_before_the_member_is_asleep(
    moving: m.SwapMove | None, launcher: m.LauncherFound | None
) -> None:
    """Podman calls a container still stopping (its server tearing down, holding GPU memory) not running: the stop
    is done again on the whole workload (it waits), unfollowed, and the member holds its GPU until it fell asleep."""
    event = m.BootPlanned(
        ("GPU-0",),
        "kv1-x",
        LEARNED,
        "0.8.5",
        existing=m.ExistingWorkload("w9", running=False, same_plan=True, launcher=launcher),
        remembered_asleep="stop",
        remembered_moving=moving,
    )
    after, commands = m.step(in_stage(m.Stage.PLANNING), event, 1.0)
    assert after.stage is m.Stage.FALLING_ASLEEP and commands[-1] == m.SleepServer("w9", "stop", server=None)
    assert not any(isinstance(c, m.FollowLogs) for c in commands)
    asleep, commands = m.step(after, m.FellAsleep(4.0), 5.0)
    assert asleep.stage is m.Stage.ASLEEP and asleep.boot is None and m.ReleaseGpus() in commands


@pytest.mark.parametrize("level", ["1", "2"])
@pytest.mark.parametrize("sleeping", [True, False, None])
def test_a_server_left_waking_is_woken_again_whatever_it_answers(level: m.SleepLevel, sleeping: bool | None) -> None:
    """Killed mid-wake (level 2: at any step of the staged wake): the whole wake is sent again, reload_weights
    included, so no weights woken without a reload are served; it holds its GPU meanwhile, then is ready."""
    after, commands = m.step(in_stage(m.Stage.PLANNING), _found(sleeping, level, "waking"), 1.0)
    assert after.stage is m.Stage.WAKING and after.status == "waking" and commands[-1] == m.WakeServer("w9", level)
    assert after.boot is not None and after.boot.adopted and m.ReleaseGpus() in commands
    ready, _ = m.step(after, m.WokeUp(0.8), 2.0)
    assert ready.stage is m.Stage.READY and ready.sleep_record is None and ready.swap.last_wake_seconds == 0.8


def test_a_swap_left_unfinished_by_a_server_that_is_gone_boots_as_usual() -> None:
    """Remembered mid-swap but no server runs (or another plan): nothing to finish; a wake boots afresh."""
    for moving in ("falling_asleep", "waking"):
        nothing = m.BootPlanned(("GPU-0",), "kv1-x", LEARNED, "0.8.5", remembered_asleep="2", remembered_moving=moving)
        assert m.step(in_stage(m.Stage.PLANNING), nothing, 1.0)[0].stage is m.Stage.WAITING_GPUS


@pytest.mark.parametrize("level", ["1", "2"])
def test_a_failed_wake_marks_its_level_unsafe_and_restarts(level: m.SleepLevel) -> None:
    """A wake that failed marks the level unsafe (as a wrong canary does), then the failure policy restarts."""
    waking = replace(in_stage(m.Stage.WAKING), swap=m.SwapTimes(level=level, since=0.0))
    after, commands = m.step(waking, m.WakeFailed("HTTP 500: CUDA Error: out of memory"), 1.0)
    marks = [c for c in commands if isinstance(c, m.MarkSleepUnsafe)]
    assert marks == [m.MarkSleepUnsafe(level, "the wake failed: HTTP 500: CUDA Error: out of memory", "wake")]
    assert after.stage is m.Stage.DECIDING and after.swap.level is None


def test_a_failed_sleep_marks_nothing() -> None:
    """A sleep that failed is the server failing; it says nothing about the wake of that level."""
    falling = replace(in_stage(m.Stage.FALLING_ASLEEP), swap=m.SwapTimes(level="1", since=0.0))
    _, commands = m.step(falling, m.SleepFailed("HTTP 500"), 1.0)
    assert not any(isinstance(c, m.MarkSleepUnsafe) for c in commands)
