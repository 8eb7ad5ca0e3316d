"""Tests for dankserve.gateway.usage and usage_store: counters, hours, bounds, the file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from dankserve.gateway import usage as usage_module
from dankserve.gateway.usage import Usage
from dankserve.gateway.usage_store import load_usage, read_usage, write_usage

HOUR = 3600.0


def record(usage: Usage, key: str, model: str, code: int, now: float, *, prompt: int = 0, completion: int = 0) -> None:
    usage.record((key, model), code, prompt=prompt, completion=completion, estimated=False, now=now)


def test_totals_and_since() -> None:
    """Totals add up per key and model; since() takes the hours from the one holding the start."""
    usage = Usage()
    record(usage, "alice", "qwen", 200, 10 * HOUR, prompt=5, completion=7)
    record(usage, "alice", "qwen", 429, 12 * HOUR + 5)
    record(usage, "bob", "qwen", 200, 12 * HOUR + 9, prompt=1, completion=1)
    totals = usage.since(None)
    assert totals[("alice", "qwen")].requests == {200: 1, 429: 1}
    assert totals[("alice", "qwen")].prompt_tokens == 5 and totals[("alice", "qwen")].completion_tokens == 7
    recent = usage.since(12 * HOUR + 30)
    assert recent[("alice", "qwen")].requests == {429: 1} and recent[("bob", "qwen")].prompt_tokens == 1


def test_old_hours_and_too_many_rows_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hourly rows older than the retention go; beyond MAX_SERIES the oldest go and new labels share `-`."""
    monkeypatch.setattr(usage_module, "MAX_SERIES", 3)
    usage = Usage()
    for hour in range(5):
        record(usage, "k", "m", 200, hour * HOUR)
    assert sorted(h for h, _, _ in usage.hours) == [2, 3, 4]
    for name in "abcd":
        record(usage, name, "m", 200, 4 * HOUR)
    assert len(usage.totals) <= 4 and ("-", "-") in usage.totals
    assert sum(sum(c.requests.values()) for c in usage.totals.values()) == 9
    usage = Usage()
    record(usage, "k", "m", 200, 0.0)
    record(usage, "k", "m", 200, (usage_module.RETENTION_HOURS + 2) * HOUR)
    assert [h for h, _, _ in usage.hours] == [usage_module.RETENTION_HOURS + 2]


def test_the_file_round_trips_atomically_with_mode_0600(tmp_path: Path) -> None:
    """Written and read back the same; the file is 0600 and no temporary is left."""
    usage = Usage()
    record(usage, "alice", "qwen", 200, 100 * HOUR, prompt=3, completion=4)
    path = tmp_path / "gateway-usage.json"
    write_usage(path, usage.to_json())
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["gateway-usage.json"]
    again = read_usage(path)
    assert again.to_json() == usage.to_json()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'{"version": 2}',
        json.dumps({"version": 1, "totals": [{"key": "a", "model": "m", "requests": {"200": -1}}], "hours": []}),
        json.dumps({"version": 1, "totals": [{"key": 5, "model": "m", "requests": {}}], "hours": []}),
        json.dumps({"version": 1, "totals": [], "hours": [{"key": "a", "model": "m", "requests": {}}]}),
        b"[" * 100_000,
    ],
)
def test_a_corrupt_file_is_moved_aside_and_counting_starts_again(tmp_path: Path, content: bytes | str) -> None:
    """Anything not a usage document: kept as .corrupt, counters from zero, no exception."""
    path = tmp_path / "gateway-usage.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert load_usage(path).totals == {}
    assert (tmp_path / "gateway-usage.json.corrupt").exists() and not path.exists()
    assert load_usage(tmp_path / "absent.json").totals == {}


def test_hide_key_names_folds_every_named_key_into_one() -> None:
    """What a keyless /metrics shows (issue 38 item 10): per model, all named keys summed under `*`; `-` (no key)
    kept apart; the counters themselves untouched."""
    usage = Usage()
    for key, model, code in [("alice", "m", 200), ("bob", "m", 200), ("bob", "m", 429), ("-", "-", 401)]:
        usage.record((key, model), code, prompt=3, completion=2, estimated=False, now=0.0)
    shown = usage_module.hide_key_names(usage.since(None))
    assert set(shown) == {("*", "m"), ("-", "-")}
    assert shown[("*", "m")].requests == {200: 2, 429: 1} and shown[("*", "m")].prompt_tokens == 9
    assert usage.totals[("alice", "m")].requests == {200: 1}
