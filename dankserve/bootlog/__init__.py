"""Boot-log reader: vLLM's log lines to the facts of a boot (pure; see `reader.py`)."""

from dankserve.bootlog.facts import (
    BootEvent,
    BootFacts,
    BootPhase,
    BootStarted,
    FailureClass,
    FailureDetected,
    PhaseChanged,
    StatsUpdated,
)
from dankserve.bootlog.reader import BootLogReader, read_boot_facts

__all__ = [
    "BootEvent",
    "BootFacts",
    "BootLogReader",
    "BootPhase",
    "BootStarted",
    "FailureClass",
    "FailureDetected",
    "PhaseChanged",
    "StatsUpdated",
    "read_boot_facts",
]
