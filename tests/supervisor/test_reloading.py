"""Tests for dankserve.supervisor.reloading: a reload's answer as data."""

from __future__ import annotations

from dankserve.supervisor.reloading import AdaptersInPlace, ReloadOutcome


def test_adapters_in_place_split_a_re_pointed_name_from_the_loaded_and_unloaded_ones() -> None:
    """A name both unloaded and loaded (a new source) is reported as replaced, the others as loaded or unloaded."""
    change = AdaptersInPlace.of(("a2", "a3"), ("a1", "a2"))
    assert change == AdaptersInPlace(loaded=("a3",), unloaded=("a1",), replaced=("a2",))


def test_an_accepted_reload_answers_its_in_place_adapter_changes_per_deployment() -> None:
    """The JSON answer has one entry per deployment whose adapters changed in place, and none otherwise."""
    outcome = ReloadOutcome(1.0, keep=("chat", "code"), adapters={"chat": AdaptersInPlace.of(("a2",), ("a1",))})
    assert outcome.to_json()["adapters"] == {"chat": {"loaded": ["a2"], "unloaded": ["a1"], "replaced": []}}
    assert ReloadOutcome(1.0).to_json()["adapters"] == {}
