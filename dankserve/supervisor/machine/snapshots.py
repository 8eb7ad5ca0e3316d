"""Handlers of snapshots (issue 41, docs/snapshots.md): the capture of a ready server that had no valid
snapshot, and the restore that takes a boot's place when it has one.

Capture: a boot planned with an `absent` snapshot becomes READY as any boot (recorded, counted, its GPUs'
slot released), marked `capture_due`; the next look around (`watch`) moves it to SNAPSHOTTING, where the
gateway holds its requests, and asks for `CaptureSnapshot`. The capture dumps the server's tree (it ends)
and restores it at once from the image: captured, the restored tree is the deployment's workload (its id
in `SnapshotCaptured`: logs followed, status, stop), READY again. A capture that failed before the tree
ended leaves the server serving and says why; one that lost the server (the restore from the image failed)
boots it normally at once, no failure counted, and is not tried again by this daemon.

Restore: a boot planned with a `ready` snapshot and its GPUs' slot held asks for `RestoreSnapshot`
instead of measuring memory and starting a workload. Restored: READY at once (boot kind `restore`).
Failed: the snapshot is discarded (the worker deleted it) with its reason, and the same boot goes on as
a normal one (free memory read, a workload started); no failure is counted.
"""

from __future__ import annotations

from dataclasses import replace

from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.machine.commands import (
    CaptureSnapshot,
    FollowLogs,
    ReadFreeMemory,
    RecordBoot,
    ReleaseGpus,
    RemoveWorkload,
    note,
)
from dankserve.supervisor.machine.events import (
    Restored,
    RestoreFailed,
    SnapshotCaptured,
    SnapshotCaptureFailed,
)
from dankserve.supervisor.machine.outcomes import Step, begin_boot
from dankserve.supervisor.machine.stages import Stage
from dankserve.supervisor.machine.state import Boot, MachineState, SnapshotPlan, SnapshotTimes
from dankserve.supervisor.machine.swapping import swap_done, woke_by_boot
from dankserve.supervisor.machine.timing import MAX_IDLE_SECONDS

RESUMED = "restored from it (a restore a stopped daemon left, taken over; the canary answered the captured ids)"


def wants_capture(boot: Boot) -> bool:
    """A ready boot captures when planning found no valid snapshot (and snapshots are on), unless it is
    itself a restore or runs under a launcher (the launcher's server is its child: not captured yet)."""
    plan = boot.snapshot
    if plan is None or plan.state != "absent" or boot.restored:
        return False
    return boot.server is None or plan.whole


def restores(boot: Boot) -> bool:
    """The boot restores its snapshot instead of starting a workload (not through a kept launcher, unless the
    snapshot is of the whole container: Podman's, launcher included, which the restore replaces)."""
    plan = boot.snapshot
    return plan is not None and plan.state == "ready" and (boot.launcher_id is None or plan.whole)


def _whole(state: MachineState) -> bool:
    boot = state.boot
    return boot is not None and boot.snapshot is not None and boot.snapshot.whole


def start_capture(state: MachineState, now: float) -> Step:
    """READY with a capture due: SNAPSHOTTING (the gateway holds requests) and the capture."""
    boot = state.boot
    assert boot is not None
    boot = replace(boot, capture_due=False)
    after = replace(state, stage=Stage.SNAPSHOTTING, boot=boot, wake_at=None)
    return after, (note("snapshot_capturing"), CaptureSnapshot(boot.workload_id or ""))


def _ready_again(state: MachineState, now: float, snapshot: SnapshotTimes) -> MachineState:
    boot = state.boot
    assert boot is not None
    interval = state.config.health_interval_seconds
    boot = replace(boot, snapshot=snapshot.plan, next_health=now + interval, unhealthy=0)
    return replace(
        state, stage=Stage.READY, boot=boot, snapshot=snapshot, wake_at=min(now + interval, now + MAX_IDLE_SECONDS)
    )


def planned(state: MachineState, plan: SnapshotPlan) -> SnapshotPlan:
    """Planning's verdict, unless a capture lost the server (no loop of lost servers) or its image would not fit
    (no outage at every boot for the same refusal): not captured again by this daemon."""
    lost, too_big = state.snapshot.capture_lost, state.snapshot.capture_too_big
    if plan.state != "absent" or (lost is None and too_big is None):
        return plan
    if lost is not None:
        return replace(plan, state="off", reason=f"not captured again since a capture lost the server: {lost}")
    why = f"not captured again by this daemon: {too_big} (free the disk or raise snapshot_max_bytes, then restart it)"
    return replace(plan, state="off", reason=why)


def _serving(state: MachineState, workload_id: str | None) -> tuple[MachineState, tuple[FollowLogs, ...]]:
    """The restored tree the capture left serving becomes the boot's workload, its log followed anew: the dump
    ended the tree and with it the follower of its log, whose end (read after the capture) would be taken
    for the server's exit, and each look would then wait 10 s for an exit that never comes (a stop after a
    capture took the whole stop timeout). The same id too (a process tree restored with its pids, a container
    restored in place): the new follower resumes after the lines already read, the old one's are dropped."""
    boot = state.boot
    if boot is None or workload_id is None:
        return state, ()
    resume = workload_id == boot.workload_id
    return replace(state, boot=replace(boot, workload_id=workload_id, log_ended=False)), (
        FollowLogs(workload_id, resume=resume, server=boot.server),  # a launcher's server: its lines, to its exit
    )


def on_snapshot_captured(state: MachineState, event: SnapshotCaptured, now: float) -> Step:
    plan = SnapshotPlan("ready", "captured from this plan's ready server: restarts restore it", whole=_whole(state))
    outage = round(event.outage_seconds, 3)
    state, follow = _serving(state, event.workload_id)
    after = _ready_again(state, now, replace(state.snapshot, plan=plan, last_capture_outage_seconds=outage))
    noted = note("snapshot_captured", outage_seconds=outage, bytes=event.bytes, container_id=event.workload_id)
    return after, (noted, *follow)


MAX_CAPTURE_RETRIES = 3
"""Captures tried again after a passing failure (clients' connections), per daemon; then the next boot's."""


def on_capture_failed(state: MachineState, event: SnapshotCaptureFailed, now: float) -> Step:
    if event.server_lost:
        return _capture_lost(state, event, now)
    retries = state.snapshot.capture_retries
    again = event.retry_in is not None and retries < MAX_CAPTURE_RETRIES
    when = f"tried again in {event.retry_in:.0f} s" if again else "captured at the next boot"
    plan = SnapshotPlan("absent", f"the last capture failed ({when}): {event.reason}", whole=_whole(state))
    state, follow = _serving(state, event.workload_id)
    if event.too_big:
        when = "not captured again by this daemon"
        plan = SnapshotPlan("off", f"the last capture failed ({when}): {event.reason}", whole=_whole(state))
    times = replace(state.snapshot, plan=plan, last_failure=event.reason, capture_retries=retries + int(again))
    if event.too_big:
        times = replace(times, capture_too_big=event.reason)
    after = _ready_again(state, now, times)
    if again and after.boot is not None:
        boot = replace(after.boot, capture_due=True, capture_after=now + (event.retry_in or 0.0))
        after = replace(after, boot=boot, wake_at=min(after.wake_at or boot.capture_after, boot.capture_after))
    failed = note("snapshot_capture_failed", "warning", reason=event.reason, then=when)
    return after, (failed, *follow)


def _capture_lost(state: MachineState, event: SnapshotCaptureFailed, now: float) -> Step:
    """The dump ended the server and the restore from the image failed: the snapshot is gone with its reason
    and the same deployment boots normally at once (not a failure of the deployment: not counted)."""
    plan = SnapshotPlan("absent", f"discarded: {event.reason}")
    snapshot = replace(state.snapshot, plan=plan, last_failure=event.reason, capture_lost=event.reason)
    gone = state.workload_id
    after, commands = begin_boot(replace(state, snapshot=snapshot), now)
    removed = (RemoveWorkload(gone, best_effort=True),) if gone is not None else ()
    lost = note("snapshot_capture_lost", "warning", reason=event.reason, then="a normal boot")
    return after, (lost, *removed, *commands)


def on_restored(state: MachineState, event: Restored, now: float) -> Step:
    """Restored: READY at once (the canary answered the captured ids), a boot of kind `restore`."""
    config = state.config
    whole = _whole(state)
    boot = replace(
        state.boot or Boot(started_at=now),
        workload_id=event.workload_id,
        restored=True,
        ready_at=now,
        deadline=now + config.boot_timeout_seconds,
        next_health=now + config.health_interval_seconds,
        phase=Phase.READY,
        server=None,
        # A whole container restored in place of the launcher's: the restored container is the workload.
        launcher_id=None if whole else (state.boot.launcher_id if state.boot is not None else None),
    )
    plan = SnapshotPlan("ready", RESUMED if event.resumed else "restored from it", whole=whole)
    snapshot = replace(state.snapshot, plan=plan, last_restore_seconds=round(event.seconds, 3))
    # A swap member asleep by stop woken by this boot: the wake ends here, as on_warmed_up ends it.
    swap = swap_done(state.swap, "wake", now) if state.swap.since is not None else state.swap
    after = replace(
        state,
        stage=Stage.READY,
        boot=replace(boot, snapshot=plan),
        boots=event.boot,
        message=None,
        snapshot=snapshot,
        swap=swap,
        wake_at=min(boot.next_health, now + MAX_IDLE_SECONDS),
    )
    return after, (
        *woke_by_boot(state, now),
        RecordBoot(boot.facts, state.kv_cache_memory_bytes, False, boot.boot_key, None, restored=True),
        note(
            "ready",
            boot_seconds=round(now - boot.started_at, 3),
            restored=True,
            restore_seconds=round(event.seconds, 3),
            container_id=event.workload_id,
        ),
        FollowLogs(event.workload_id),
        ReleaseGpus(),
    )


def on_restore_failed(state: MachineState, event: RestoreFailed, now: float) -> Step:
    """The snapshot is gone with its reason; the same boot goes on normally (free memory, then a start)."""
    boot = state.boot or Boot(started_at=now)
    plan = SnapshotPlan("absent", f"discarded at restore: {event.reason}", whole=_whole(state))
    # A whole container's restore replaced the kept launcher's container: the normal boot starts a new one
    # (through the launcher where it is used), the old one removed should the restore have left it.
    gone = boot.launcher_id if plan.whole else None
    launcher_id = None if plan.whole else boot.launcher_id
    boot = replace(boot, snapshot=plan, settle_until=now + state.config.gpu_memory_settle_seconds)
    boot = replace(boot, launcher_id=launcher_id, server=None if plan.whole else boot.server)
    snapshot = replace(state.snapshot, plan=plan, last_failure=event.reason)
    after = replace(state, stage=Stage.MEASURING, boot=boot, snapshot=snapshot)
    removed = (RemoveWorkload(gone, best_effort=True),) if gone is not None else ()
    return after, (
        note("snapshot_restore_failed", "warning", reason=event.reason, then="a normal boot"),
        *removed,
        ReadFreeMemory(boot.uuids, settle_first=True),
    )
