"""Tests for dankserve.bootlog.patterns: every pattern's sample passes its cheap filter and matches."""

from __future__ import annotations

import pytest

from dankserve.bootlog import BootLogReader
from dankserve.bootlog.patterns import ALL_PATTERNS, ERAS, LinePattern


def _id(pattern: LinePattern) -> str:
    return f"{pattern.kind.value}:{pattern.token}"


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=_id)
def test_sample_carries_the_token(pattern: LinePattern) -> None:
    """The token (the pre-filter) is a whitespace-separated word of the pattern's sample line."""
    assert pattern.token in pattern.sample.split()


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=_id)
def test_sample_matches(pattern: LinePattern) -> None:
    """The pattern's regex matches its sample, rendered from vLLM's format string."""
    assert pattern.regex.search(pattern.sample) is not None


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=_id)
def test_sample_is_read(pattern: LinePattern) -> None:
    """Fed to a reader, each sample changes the facts or emits an event (none is ignored)."""
    reader = BootLogReader()
    before = reader.facts
    events = reader.feed(pattern.sample)
    assert events or reader.facts != before


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=_id)
def test_pattern_cites_its_source(pattern: LinePattern) -> None:
    """Each pattern names the vLLM (or other) source file it was built from."""
    assert ".py" in pattern.source or ".cpp" in pattern.source or "pydantic" in pattern.source


def test_one_table_per_era() -> None:
    """The eras' tables together are the reader's patterns."""
    assert sum(len(table) for table in ERAS.values()) == len(ALL_PATTERNS)
