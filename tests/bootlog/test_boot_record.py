"""Tests for dankserve.bootlog.boot_record: what each kind of line means for one boot."""

from __future__ import annotations

from dankserve.bootlog.boot_record import RECORDERS, BootRecord, on_kv_suggestion
from dankserve.bootlog.facts import BootPhase, PhaseChanged
from dankserve.bootlog.patterns import ALL_PATTERNS, Kind

BOUNDARIES = {Kind.VERSION, Kind.ENGINE_VERSION, Kind.ARGS}
"""The kinds the reader keeps: they may begin a new boot in the stream."""


def test_every_kind_of_line_has_a_recorder_or_begins_a_boot() -> None:
    """Each pattern kind is recorded here or handled by the reader as a boot boundary, never both or neither."""
    kinds = {pattern.kind for pattern in ALL_PATTERNS}
    assert kinds - BOUNDARIES == set(RECORDERS)
    assert not BOUNDARIES & set(RECORDERS)


def test_a_phase_only_moves_forward_and_loading_reports_its_percent() -> None:
    """Loading at 40 %, then 60 %, then profiling: three events; loading again after that: none."""
    boot = BootRecord()
    assert boot.advance(BootPhase.LOADING, 40) == [PhaseChanged(BootPhase.LOADING, 40)]
    assert boot.advance(BootPhase.LOADING, 60) == [PhaseChanged(BootPhase.LOADING, 60)]
    assert boot.advance(BootPhase.PROFILING) == [PhaseChanged(BootPhase.PROFILING, None)]
    assert boot.advance(BootPhase.LOADING, 80) == []
    assert boot.freeze().phase is BootPhase.PROFILING


def test_the_smallest_kv_suggestion_of_the_ranks_is_kept() -> None:
    """Two ranks suggest KV bytes: the smaller one is the boot's, marked as suggested."""
    boot = BootRecord()
    pattern = next(p for p in ALL_PATTERNS if p.kind is Kind.KV_SUGGESTION)
    on_kv_suggestion(boot, pattern, "", ("2000",))
    on_kv_suggestion(boot, pattern, "", ("1000",))
    facts = boot.freeze()
    assert (facts.kv_cache_memory_bytes, facts.kv_cache_memory_bytes_source) == (1000, "suggested")
