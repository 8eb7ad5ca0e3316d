"""Which `vllm --version` probe containers were abandoned (pure).

A probe is removed by the process that started it once it has read the answer. A process killed in between
(kill -9 of the daemon while an upgrade reads the new image's version, a CLI's `plan` killed the same way)
leaves it behind for good: an exited container with a random name in `podman ps -a`. Each probe therefore
names its owner in a label (this boot, the owner's pid and start time), and the next probe or the next
daemon removes the ones whose owner is gone. A probe from another boot, another host (a remote Podman
service) or one without a readable owner label is only taken for abandoned once it is older than any
probe can last (its owner removes it when the wait times out); a live owner's probe is never touched,
so two dankserve processes on one Podman service leave each other's probes alone.

Labels and times come from the Podman service (anyone who may create containers there may write them):
a label that does not parse is no owner, a time that does not parse is no age.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dankserve.runtime.podman.parsing import LABEL_PROBE, parse_podman_time

LABEL_PROBE_OWNER = "io.dankserve.probe-owner"
"""`BOOT_ID PID START_TIME` of the process that started the probe."""
PROBE_GRACE_SECONDS = 60.0
"""Beyond the probe's own timeout, how long an ownerless probe may still be in its owner's hands."""
_MAX_LABEL = 128


@dataclass(frozen=True)
class ProbeOwner:
    """The process that started a probe: its boot, pid and start time (Unix time)."""

    boot_id: str
    pid: int
    start_time: float

    def label(self) -> str:
        return f"{self.boot_id} {self.pid} {self.start_time:.3f}"

    @classmethod
    def parse(cls, text: object) -> ProbeOwner | None:
        if not isinstance(text, str) or len(text) > _MAX_LABEL:
            return None
        parts = text.split()
        if len(parts) != 3 or not parts[1].isdigit():
            return None
        try:
            start = float(parts[2])
        except ValueError:
            return None
        pid = int(parts[1])
        return cls(parts[0], pid, start) if 0 < pid < 1 << 31 and math.isfinite(start) else None


def abandoned_probes(
    listed: Iterable[Mapping[str, Any]],
    *,
    now: float,
    timeout: float,
    this_boot: str | None,
    alive: Callable[[int, float], bool],
) -> list[str]:
    """The ids among `listed` (entries of Podman's container list) that are probes nobody will remove:
    owned on this boot by a process that is gone, or (owner unknown or elsewhere) older than `timeout` and
    the grace. `alive(pid, start_time)`: that process still runs."""
    out = []
    for attrs in listed:
        labels = attrs.get("Labels")
        container_id = attrs.get("Id")
        if not isinstance(labels, Mapping) or LABEL_PROBE not in labels or not isinstance(container_id, str):
            continue
        owner = ProbeOwner.parse(labels.get(LABEL_PROBE_OWNER))
        if owner is not None and this_boot is not None and owner.boot_id == this_boot:
            if not alive(owner.pid, owner.start_time):
                out.append(container_id)
            continue
        at = _created(attrs.get("Created"))
        if at is not None and now - at > timeout + PROBE_GRACE_SECONDS:
            out.append(container_id)
    return out


def _created(value: object) -> float | None:
    """Unix time of a list entry's `Created`: libpod writes a Go timestamp, Docker's API an integer."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return parse_podman_time(value) if isinstance(value, str) else None
