"""Tests for dankserve.supervisor.observe.telemetry: boot kinds, histograms and the counts status shows."""

from __future__ import annotations

import pytest

from dankserve.supervisor.observe.telemetry import (
    BOOT_BUCKETS,
    BOOT_KINDS,
    FAILURE_CAUSES,
    Histogram,
    Telemetry,
    boot_kind,
)


@pytest.mark.parametrize(
    ("hit", "learned", "expected"),
    [(False, False, "cold"), (None, False, "cold"), (True, False, "warm"), (True, True, "learned_bytes")],
)
def test_boot_kind_names_what_the_boot_skipped(hit: bool | None, learned: bool, expected: str) -> None:
    """Learned bytes beat a compile-cache hit, which beats a cold boot."""
    assert boot_kind(compile_cache_hit=hit, learned_bytes_used=learned) == expected


def test_histogram_counts_are_cumulative() -> None:
    """An observation counts in its bucket and every larger one, like Prometheus's le buckets."""
    histogram = Histogram().observe(3.0).observe(100.0)
    counts = dict(zip(BOOT_BUCKETS, histogram.counts, strict=True))
    assert (counts[2], counts[5], counts[90], counts[120], counts[1800]) == (0, 1, 1, 2, 2)
    assert (histogram.count, histogram.total) == (2, 103.0)


def test_every_kind_and_cause_starts_at_zero() -> None:
    """A tracked deployment has every series at zero, so a first restart is an increase Prometheus sees."""
    telemetry = Telemetry()
    telemetry.track("a")
    counts = telemetry.of("a")
    assert set(counts.boots) == set(BOOT_KINDS) and set(counts.restarts) == set(FAILURE_CAUSES)
    assert not any(counts.restarts.values())


def test_records_show_in_the_status_json() -> None:
    """Boots, restarts, probes and preemption warnings are what status --json shows."""
    telemetry = Telemetry()
    telemetry.booted("a", "cold", 12.5, compile_cache_hit=False)
    telemetry.booted("a", "learned_bytes", 4.0, compile_cache_hit=True)
    telemetry.restarted("a", "crash")
    telemetry.probed("a", 100.0, "no answer within 30 s", 1)
    telemetry.preemption_warned("a", 101.0, "3 preemptions", 3)
    shown = telemetry.of("a").status_json()
    assert shown["boots_by_kind"] == {"cold": 1, "learned_bytes": 1}
    assert shown["restarts_by_cause"] == {"crash": 1}
    assert shown["last_boot"] == {"kind": "learned_bytes", "seconds": 4.0}
    assert (shown["compile_cache_hits"], shown["compile_cache_misses"]) == (1, 1)
    assert shown["liveness"]["last_probe_error"] == "no answer within 30 s"
    assert shown["preemption_warning"]["message"] == "3 preemptions"
