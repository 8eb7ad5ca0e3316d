"""The machine's snapshot rules (issue 41), pure: a ready boot without a valid snapshot captures once (the
gateway holds requests meanwhile: `snapshotting`), a failed capture leaves it ready with the reason; a boot
with a valid snapshot restores instead of starting a workload (boot kind `restore`), and a failed restore
goes on as the normal boot in the same restart, no failure counted."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dankserve.bootlog.facts import BootFacts
from dankserve.supervisor import machine as m
from tests.supervisor.test_machine import CONFIG

ABSENT = m.SnapshotPlan("absent", "none captured yet")
READY = m.SnapshotPlan("ready", "valid for this plan")


def _warming(snapshot: m.SnapshotPlan | None, **boot: Any) -> m.MachineState:
    facts = BootFacts(ready=True)
    b = m.Boot(started_at=0.0, uuids=("GPU-0",), workload_id="w1", warm_up_since=5.0, facts=facts, deadline=999.0)
    return m.MachineState(CONFIG, stage=m.Stage.BOOTING, boot=replace(b, snapshot=snapshot, **boot))


def test_a_ready_boot_without_a_snapshot_captures_at_the_next_look_and_holds_requests() -> None:
    ready, _ = m.step(_warming(ABSENT), m.WarmedUp(None, 0.1), 10.0)
    assert ready.stage is m.Stage.READY and ready.wake_at == 10.0, "ready first (recorded, counted), then captured"
    capturing, commands = m.step(ready, m.Tick(), 10.0)
    assert capturing.stage is m.Stage.SNAPSHOTTING and capturing.status == "snapshotting"
    assert m.CaptureSnapshot("w1") in commands
    again, _ = m.step(capturing, m.SnapshotCaptured(0.7, 100), 11.0)
    assert again.stage is m.Stage.READY and again.snapshot.last_capture_outage_seconds == 0.7
    assert again.snapshot.plan is not None and again.snapshot.plan.state == "ready"
    assert not any(isinstance(c, m.CaptureSnapshot) for c in m.step(again, m.Tick(), 20.0)[1]), "captured once"


def test_a_failed_capture_leaves_the_server_ready_with_the_reason() -> None:
    ready, _ = m.step(_warming(ABSENT), m.WarmedUp(None, 0.1), 10.0)
    capturing, _ = m.step(ready, m.Tick(), 10.0)
    after, _ = m.step(capturing, m.SnapshotCaptureFailed("capture failed at gpu_lock: timeout"), 11.0)
    assert after.stage is m.Stage.READY and after.failures == () and after.restarts == 0
    assert after.snapshot.last_failure == "capture failed at gpu_lock: timeout"
    assert after.snapshot.plan is not None and "the last capture failed" in after.snapshot.plan.reason


def test_a_capture_failed_on_clients_connections_is_tried_again_later_a_bounded_number_of_times() -> None:
    """Clients' connections open at the dump pass (snapshot/tcp.py): the same boot captures again `retry_in`
    later, up to MAX_CAPTURE_RETRIES times per daemon; then, and for any other failure, the next boot does."""
    ready, _ = m.step(_warming(ABSENT), m.WarmedUp(None, 0.1), 10.0)
    state, _ = m.step(ready, m.Tick(), 10.0)
    now = 11.0
    for tries in range(1, m.snapshots.MAX_CAPTURE_RETRIES + 1):
        state, _ = m.step(state, m.SnapshotCaptureFailed("capture failed at quiet: 1 client", retry_in=30.0), now)
        assert state.stage is m.Stage.READY and state.boot is not None and state.boot.capture_due
        assert state.snapshot.capture_retries == tries and state.wake_at is not None and state.wake_at <= now + 30
        assert state.snapshot.plan is not None and "tried again in 30 s" in state.snapshot.plan.reason
        early, commands = m.step(state, m.Tick(), now + 29)
        assert early.stage is m.Stage.READY and not any(isinstance(c, m.CaptureSnapshot) for c in commands)
        state, commands = m.step(early, m.Tick(), now + 30)
        assert state.stage is m.Stage.SNAPSHOTTING and any(isinstance(c, m.CaptureSnapshot) for c in commands)
        now += 31
    last, _ = m.step(state, m.SnapshotCaptureFailed("capture failed at quiet: 1 client", retry_in=30.0), now)
    assert last.boot is not None and not last.boot.capture_due and last.failures == ()
    assert last.snapshot.plan is not None and "captured at the next boot" in last.snapshot.plan.reason
    other, _ = m.step(ready, m.Tick(), 10.0)
    other, _ = m.step(other, m.SnapshotCaptureFailed("capture failed at gpu_lock: timeout"), 11.0)
    assert other.boot is not None and not other.boot.capture_due, "no retry for a failure that does not pass"


def test_no_capture_when_snapshots_are_off_a_restore_or_a_launcher_server() -> None:
    for state in (
        _warming(None),
        _warming(m.SnapshotPlan("off", 'snapshot = "off"')),
        _warming(ABSENT, restored=True),
        _warming(ABSENT, server=1),
    ):
        ready, _ = m.step(state, m.WarmedUp(None, 0.1), 10.0)
        assert ready.boot is not None and not ready.boot.capture_due


def _acquiring(snapshot: m.SnapshotPlan, launcher_id: str | None = None) -> m.MachineState:
    boot = m.Boot(started_at=0.0, uuids=("GPU-0",), snapshot=snapshot, launcher_id=launcher_id)
    return m.MachineState(CONFIG, stage=m.Stage.WAITING_GPUS, boot=boot, restarts=1)


def test_a_valid_snapshot_is_restored_instead_of_a_boot() -> None:
    starting, commands = m.step(_acquiring(READY), m.GpusAcquired(), 1.0)
    assert starting.stage is m.Stage.STARTING and m.RestoreSnapshot() in commands
    ready, commands = m.step(starting, m.Restored("w2", 3, 0.4), 1.5)
    assert ready.stage is m.Stage.READY and ready.boots == 3 and ready.workload_id == "w2"
    assert ready.boot is not None and ready.boot.restored and not ready.boot.capture_due
    (record,) = [c for c in commands if isinstance(c, m.RecordBoot)]
    assert record.restored and record.baseline is None, "a restore teaches nothing of KV sizes"
    assert m.FollowLogs("w2") in commands and ready.snapshot.last_restore_seconds == 0.4


def test_a_failed_restore_is_the_normal_boot_of_the_same_restart_not_a_failure() -> None:
    starting, _ = m.step(_acquiring(READY), m.GpusAcquired(), 1.0)
    measuring, commands = m.step(starting, m.RestoreFailed("restore failed at canary: ids differ"), 2.0)
    assert measuring.stage is m.Stage.MEASURING and measuring.restarts == 1 and measuring.failures == ()
    assert m.ReadFreeMemory(("GPU-0",), settle_first=True) in commands
    assert measuring.snapshot.last_failure == "restore failed at canary: ids differ"
    assert measuring.boot is not None and measuring.boot.snapshot is not None
    assert measuring.boot.snapshot.state == "absent", "the normal boot captures again once ready"


def test_a_kept_launcher_boots_rather_than_restores() -> None:
    after, commands = m.step(_acquiring(READY, launcher_id="l1"), m.GpusAcquired(), 1.0)
    assert after.stage is m.Stage.MEASURING and m.RestoreSnapshot() not in commands


def test_a_swap_member_woken_by_a_restore_ends_its_wake() -> None:
    """A member asleep by stop boots to wake; restored instead, its wake ends with the restore (timed, logged)."""
    state = replace(_acquiring(READY), swap=m.SwapTimes(level="stop", since=0.5))
    starting, _ = m.step(state, m.GpusAcquired(), 1.0)
    ready, commands = m.step(starting, m.Restored("w2", 3, 0.4), 1.5)
    assert ready.status == "ready" and ready.swap.since is None and ready.swap.last_wake_seconds == 1.0
    assert any(isinstance(c, m.Note) and c.event == "woke_up" for c in commands)


def _capturing() -> m.MachineState:
    ready, _ = m.step(_warming(ABSENT), m.WarmedUp(None, 0.1), 10.0)
    capturing, _ = m.step(ready, m.Tick(), 10.0)
    return capturing


def test_a_capture_s_restored_tree_becomes_the_workload_its_log_followed() -> None:
    """The dump ends the server's tree; the tree restored from the image at once is the deployment's server."""
    after, commands = m.step(_capturing(), m.SnapshotCaptured(0.7, 100, workload_id="w9"), 11.0)
    assert after.stage is m.Stage.READY and after.workload_id == "w9"
    assert m.FollowLogs("w9") in commands
    untouched, commands = m.step(_capturing(), m.SnapshotCaptured(0.7, 100), 11.0)
    assert untouched.workload_id == "w1" and not any(isinstance(c, m.FollowLogs) for c in commands)
    kept, commands = m.step(_capturing(), m.SnapshotCaptureFailed("over snapshot_max_bytes", workload_id="w9"), 11.0)
    assert kept.stage is m.Stage.READY and kept.workload_id == "w9", "restored, then the snapshot not kept"
    assert m.FollowLogs("w9") in commands


def test_a_capture_that_lost_the_server_boots_it_at_once_not_counted_and_not_again() -> None:
    """The dump ended the tree and the restore from the image failed: the snapshot goes with its reason, the
    same deployment boots normally at once (no failure, no restart counted), and is not captured again."""
    reason = "capture failed at canary: greedy ids differ"
    after, commands = m.step(_capturing(), m.SnapshotCaptureFailed(reason, server_lost=True), 11.0)
    assert after.stage in (m.Stage.PULLING, m.Stage.DOWNLOADING) and after.boot is not None
    assert after.failures == () and after.restarts == 0 and after.last_failure is None
    assert m.RemoveWorkload("w1", best_effort=True) in commands
    assert any(isinstance(c, m.Note) and c.event == "snapshot_capture_lost" for c in commands)
    assert after.snapshot.last_failure == reason and after.snapshot.capture_lost == reason
    _next_boot_not_captured_but_restores(after, "not captured again since a capture lost the server")


def test_an_image_too_big_is_not_captured_again_by_this_daemon() -> None:
    """Refused at `room` (the disk budget or the free disk): the server serves on, and no later boot pays the
    capture's outage (a GPU checkpoint of its whole memory) for the same refusal; a valid snapshot still restores."""
    reason = "capture failed at room: the image would take about 74.0 GiB ..., over snapshot_max_bytes (64.0 GiB)"
    after, commands = m.step(_capturing(), m.SnapshotCaptureFailed(reason, too_big=True), 11.0)
    assert after.stage is m.Stage.READY and after.workload_id == "w1" and after.boot is not None
    assert after.boot.snapshot is not None and after.boot.snapshot.state == "off"
    assert "not captured again by this daemon" in after.boot.snapshot.reason
    assert after.snapshot.capture_too_big == reason and after.snapshot.capture_lost is None
    assert any(isinstance(c, m.Note) and c.event == "snapshot_capture_failed" for c in commands)
    _next_boot_not_captured_but_restores(after, "raise snapshot_max_bytes")


def _next_boot_not_captured_but_restores(after: m.MachineState, why: str) -> None:
    planning = replace(after, stage=m.Stage.PLANNING)
    planned, _ = m.step(planning, m.BootPlanned(("GPU-0",), "k", None, None, snapshot=ABSENT), 12.0)
    assert planned.boot is not None and planned.boot.snapshot is not None
    assert planned.boot.snapshot.state == "off" and why in planned.boot.snapshot.reason
    assert not m.snapshots.wants_capture(planned.boot)
    valid, _ = m.step(planning, m.BootPlanned(("GPU-0",), "k", None, None, snapshot=READY), 12.0)
    assert valid.boot is not None and valid.boot.snapshot == READY, "a valid snapshot (captured elsewhere) restores"


def test_a_restore_taken_over_from_a_stopped_daemon_says_so_in_status() -> None:
    """Restored with `resumed`: the snapshot's reason says the restore was taken over and judged by the canary."""
    from dankserve.supervisor.machine.snapshots import RESUMED

    starting, _ = m.step(_acquiring(READY), m.GpusAcquired(), 1.0)
    ready, _ = m.step(starting, m.Restored("w2", 3, 0.4, resumed=True), 1.5)
    assert ready.stage is m.Stage.READY and ready.snapshot.plan is not None
    assert ready.snapshot.plan.reason == RESUMED and "the canary answered the captured ids" in RESUMED
    plain, _ = m.step(starting, m.Restored("w2", 3, 0.4), 1.5)
    assert plain.snapshot.plan is not None and plain.snapshot.plan.reason == "restored from it"


WHOLE_READY = replace(READY, whole=True)
"""A Podman container's snapshot: of the whole container, a launcher's with it."""


def test_a_whole_containers_launcher_boot_captures_and_its_kept_launcher_restores() -> None:
    """Podman (`whole`): a ready launcher boot is captured (its container whole); a restart through the kept
    launcher restores the container's snapshot instead of asking the launcher for a server, and the restored
    container is the workload (the kept launcher's container was replaced)."""
    ready, _ = m.step(_warming(replace(ABSENT, whole=True), server=1, launcher_id="l1"), m.WarmedUp(None, 0.1), 10.0)
    capturing, commands = m.step(ready, m.Tick(), 10.0)
    assert capturing.stage is m.Stage.SNAPSHOTTING and m.CaptureSnapshot("w1") in commands
    captured, commands = m.step(capturing, m.SnapshotCaptured(0.5, 100, workload_id="w1"), 10.5)
    assert captured.boot is not None and captured.boot.snapshot is not None and captured.boot.snapshot.whole
    # restored in place: followed anew, still only the launcher's server's lines (its exit ends them)
    assert m.FollowLogs("w1", resume=True, server=1) in commands
    starting, commands = m.step(_acquiring(WHOLE_READY, launcher_id="l1"), m.GpusAcquired(), 1.0)
    assert starting.stage is m.Stage.STARTING and m.RestoreSnapshot() in commands
    restored, _ = m.step(starting, m.Restored("c2", 3, 0.3), 1.3)
    assert restored.boot is not None and restored.boot.launcher_id is None and restored.workload_id == "c2"


def test_a_whole_containers_failed_restore_boots_a_new_launcher_container() -> None:
    """The restore replaced the kept launcher's container, then failed: the normal boot starts a new container
    (through the launcher where used), the old one removed should it still be there; not counted."""
    starting, _ = m.step(_acquiring(WHOLE_READY, launcher_id="l1"), m.GpusAcquired(), 1.0)
    measuring, commands = m.step(starting, m.RestoreFailed("restore failed at criu_restore: truncated"), 2.0)
    assert measuring.stage is m.Stage.MEASURING and measuring.failures == ()
    assert measuring.boot is not None and measuring.boot.launcher_id is None and measuring.boot.server is None
    assert m.RemoveWorkload("l1", best_effort=True) in commands
    assert measuring.boot.snapshot is not None and measuring.boot.snapshot.whole, "captured again, whole"


def test_a_tree_restored_under_its_own_id_is_followed_anew() -> None:
    """Found timing stops: a process tree restored with its pids (a container restored in place) keeps its
    id, so its log was not followed again; the old follower's end, read after the capture, made each look wait
    10 s for an exit that never came (a stop after any capture took the whole stop timeout). Now it is followed
    anew, resuming after the lines read (the worker drops what the old follower still sends), the stream open."""
    after, commands = m.step(_capturing(), m.SnapshotCaptured(0.7, 100, workload_id="w1"), 11.0)
    assert after.workload_id == "w1" and after.boot is not None and not after.boot.log_ended
    assert m.FollowLogs("w1", resume=True) in commands
    _, commands = m.step(after, m.Tick(), 12.0)
    assert not any(isinstance(c, m.WaitExit) for c in commands), commands
    kept, commands = m.step(_capturing(), m.SnapshotCaptureFailed("over snapshot_max_bytes", workload_id="w1"), 11.0)
    assert m.FollowLogs("w1", resume=True) in commands and kept.boot is not None and not kept.boot.log_ended
