"""An upgrade to a new vLLM image as one pure state machine, tried beside the old server.

`advance(state, event) -> (state, actions)` decides; nothing here pulls, boots or reads a clock.
The vocabulary is apart from the decisions, as in `supervisor.machine`: `steps` (the steps and the
upgrade's state), `events` (what the driver saw), `actions` (what it is asked to do), `judging`
(the pure checks: flags gone from the new release, KV capacity, decode throughput, greedy ids),
`transitions` (`begin`, `advance`, `recover` after a daemon killed mid-way), and `driver` (the edge:
runs actions through an `UpgradeEdge` and records each step before it is taken).

Order: pull, read the new image's vLLM version, re-plan against that release, make room (the old
server asleep at level 1 when host RAM holds it, else stopped), boot the new server, check it
(answers, KV capacity, decode throughput, greedy ids), then switch (stop the old, keep its image
for `rollback`) or roll back (stop the new, wake or restart the old)."""

from dankserve.supervisor.upgrade.actions import (
    Action,
    BootNew,
    MakeRoom,
    Measure,
    MeasureOld,
    Pull,
    ReadVersion,
    Replan,
    RestoreOld,
    StopNew,
    StopOld,
)
from dankserve.supervisor.upgrade.events import (
    Event,
    Measured,
    NewBooted,
    NewFailed,
    NewStopped,
    OldMeasured,
    OldRestored,
    OldStopped,
    Pulled,
    PullFailed,
    PullProgressed,
    Replanned,
    RoomMade,
    VersionRead,
)
from dankserve.supervisor.upgrade.judging import Limits, Measurement, Verdict, flags_gone, judge, plan_changes
from dankserve.supervisor.upgrade.steps import TERMINAL, Room, Step, UpgradeState
from dankserve.supervisor.upgrade.transitions import advance, begin, recover

__all__ = [
    "TERMINAL",
    "Action",
    "BootNew",
    "Event",
    "Limits",
    "MakeRoom",
    "Measure",
    "MeasureOld",
    "Measured",
    "Measurement",
    "NewBooted",
    "NewFailed",
    "NewStopped",
    "OldMeasured",
    "OldRestored",
    "OldStopped",
    "Pull",
    "PullFailed",
    "PullProgressed",
    "Pulled",
    "ReadVersion",
    "Replan",
    "Replanned",
    "RestoreOld",
    "Room",
    "RoomMade",
    "Step",
    "StopNew",
    "StopOld",
    "UpgradeState",
    "Verdict",
    "VersionRead",
    "advance",
    "begin",
    "flags_gone",
    "judge",
    "plan_changes",
    "recover",
]
