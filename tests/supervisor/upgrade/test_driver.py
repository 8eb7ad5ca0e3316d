"""The upgrade's driver: actions through an edge, every step recorded before its action runs."""

from __future__ import annotations

from collections.abc import Callable

from dankserve.supervisor.upgrade import (
    Measured,
    Measurement,
    NewBooted,
    NewFailed,
    NewStopped,
    OldMeasured,
    OldRestored,
    OldStopped,
    Pulled,
    PullFailed,
    Replanned,
    RoomMade,
    Step,
    UpgradeState,
    VersionRead,
    begin,
)
from dankserve.supervisor.upgrade.driver import drive

GOOD = Measurement(100_000, 50.0, (1, 2, 3))


class ScriptedEdge:
    """An edge answering from a script, noting each call (the daemon's edge is tested on Podman)."""

    def __init__(self, new: Measurement = GOOD, boots: bool = True) -> None:
        self.calls: list[str] = []
        self.new = new
        self.boots = boots

    def pull(self, image: str, progress: Callable[[float], None]) -> Pulled | PullFailed:
        self.calls.append("pull")
        progress(50.0)
        return Pulled("sha256:n")

    def read_version(self, image: str) -> VersionRead:
        self.calls.append("read_version")
        return VersionRead("0.27.0")

    def replan(self, image: str, version: str | None) -> Replanned:
        self.calls.append("replan")
        return Replanned(())

    def measure_old(self) -> OldMeasured:
        self.calls.append("measure_old")
        return OldMeasured(GOOD)

    def make_room(self) -> RoomMade:
        self.calls.append("make_room")
        return RoomMade("1", "fits")

    def boot_new(self, image: str, version: str | None) -> NewBooted | NewFailed:
        self.calls.append("boot_new")
        return NewBooted("w-new") if self.boots else NewFailed("exited with 1", "w-new")

    def measure_new(self, workload: str) -> Measured | NewFailed:
        self.calls.append("measure_new")
        return Measured(self.new)

    def stop_old(self) -> OldStopped:
        self.calls.append("stop_old")
        return OldStopped()

    def stop_new(self, workload: str | None) -> NewStopped:
        self.calls.append(f"stop_new {workload}")
        return NewStopped()

    def restore_old(self, room: str | None) -> OldRestored:
        self.calls.append(f"restore_old {room}")
        return OldRestored()


def run(edge: ScriptedEdge) -> tuple[UpgradeState, list[UpgradeState]]:
    recorded: list[UpgradeState] = []
    state, actions = begin("chat", "img:old", "img:new", 0.0)
    return drive(state, actions, edge, recorded.append), recorded


def test_a_good_upgrade_runs_every_step_and_switches() -> None:
    """The edge sees the steps in order; the end is switched."""
    edge = ScriptedEdge()
    state, recorded = run(edge)
    assert state.step is Step.SWITCHED
    assert edge.calls == [
        "pull",
        "read_version",
        "replan",
        "measure_old",
        "make_room",
        "boot_new",
        "measure_new",
        "stop_old",
    ]
    assert [s.pull_percent for s in recorded if s.pull_percent is not None] == [50.0]
    assert [s.to_record().report.get("pull_percent") for s in recorded[:2]] == [None, 50.0], "status shows it"


def test_each_step_is_recorded_before_its_action_runs() -> None:
    """The step booting is on record before boot_new is called: a kill -9 there finds it."""
    edge = ScriptedEdge()
    _, recorded = run(edge)
    steps = [s.step for s in recorded]
    assert steps.index(Step.BOOTING) < steps.index(Step.CHECKING)
    assert steps[0] is Step.PULLING and steps[-1] is Step.SWITCHED


def test_a_failed_boot_stops_the_new_server_and_wakes_the_old() -> None:
    """The failed workload is removed before the old server is restored at its level."""
    edge = ScriptedEdge(boots=False)
    state, _ = run(edge)
    assert state.step is Step.ROLLED_BACK
    assert edge.calls[-2:] == ["stop_new w-new", "restore_old 1"]


def test_a_slower_server_rolls_back() -> None:
    """Decode 40 % slower: rolled back, the reason kept."""
    state, _ = run(ScriptedEdge(new=Measurement(100_000, 30.0, (1, 2, 3))))
    assert state.step is Step.ROLLED_BACK and "slower" in (state.reason or "")
