"""Tests for dankserve.supervisor.records: the daemon's write-through view of the state file."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from dankserve.state import StateStore
from dankserve.supervisor.records import StateBook


def test_each_spell_of_an_unwritable_state_dir_is_warned_about_once(tmp_path: Path) -> None:
    """Saves that fail warn once per spell, keep the counts in memory, and save them all once the dir is back."""
    state_dir = tmp_path / "state"
    book = StateBook(state_dir)
    book.next_boot("chat")
    parked = tmp_path / "parked"
    with capture_logs() as logs:
        state_dir.rename(parked)
        state_dir.write_text("")  # a file where the dir was: every save fails
        book.next_boot("chat")
        book.next_boot("chat")
        state_dir.unlink()
        parked.rename(state_dir)
        book.record_restart("chat")
        state_dir.rename(parked)
        state_dir.write_text("")
        book.next_boot("chat")
    events = [entry["event"] for entry in logs]
    assert events == ["state_not_saved", "state_saved_again", "state_not_saved"]
    state_dir.unlink()
    parked.rename(state_dir)
    saved = StateStore(state_dir).load().state.deployment("chat")
    assert (saved.boots, saved.restarts) == (3, 1)
    book.flush()
    assert StateStore(state_dir).load().state.deployment("chat").boots == 4
