"""Tests for dankserve.logview: --since, the time of each kind of line, merging."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dankserve.errors import InvalidInput
from dankserve.logview import TimedLine, daemon_file_line, journal_entry, merged, parse_since, server_lines, vllm_time

NOW = datetime(2026, 12, 1, 13, 30, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", NOW - timedelta(minutes=10)),
        ("-2h", NOW - timedelta(hours=2)),
        ("1 day ago", NOW - timedelta(days=1)),
        ("30 sec", NOW - timedelta(seconds=30)),
        ("now", NOW),
        ("today", NOW.replace(hour=0, minute=0)),
        ("yesterday", NOW.replace(day=30, month=11, hour=0, minute=0)),
        ("2026-12-01T12:00:00+00:00", datetime(2026, 12, 1, 12, tzinfo=UTC)),
    ],
)
def test_since_reads_like_journalctl(text: str, expected: datetime) -> None:
    """Spans back from now, today/yesterday and ISO times are understood."""
    assert parse_since(text, NOW) == expected


def test_since_without_zone_is_local_time() -> None:
    """A time without a zone is this machine's local time, as journalctl reads it."""
    assert parse_since("2026-12-01 13:00", NOW) == datetime(2026, 12, 1, 13, 0).astimezone()


def test_unreadable_since_is_invalid_input() -> None:
    """Anything else is an input error naming the value."""
    with pytest.raises(InvalidInput, match="fortnight"):
        parse_since("a fortnight", NOW)


def test_vllm_prefix_gives_the_time_and_a_future_date_is_last_year() -> None:
    """vLLM's MM-DD HH:MM:SS prefix is this year's unless that lies ahead."""
    assert vllm_time("(APIServer pid=1) INFO 12-01 13:03:06 [api_server.py:1] up", NOW) == NOW.replace(
        minute=3, second=6
    )
    assert vllm_time("INFO 12-24 10:00:00 [x.py:1] old", NOW) == NOW.replace(
        year=2025, month=12, day=24, hour=10, minute=0
    )
    assert vllm_time("INFO:     127.0.0.1 - GET /v1/models", NOW) is None


def test_server_lines_without_a_time_take_their_neighbours() -> None:
    """Lines without vLLM's prefix take the time before them; leading ones the first known time."""
    lines = ["Loading shards 10%", "INFO 12-01 13:00:01 [a.py:1] one", "INFO:     Application startup complete."]
    timed = server_lines("dankserve-chat", lines, NOW)
    first = NOW.replace(minute=0, second=1)
    assert [line.at for line in timed] == [first, first, first]


def test_daemon_json_and_console_lines_are_read() -> None:
    """The daemon's JSON lines render as level, event and fields; console lines keep their text."""
    entry = daemon_file_line(
        '{"deployment": "chat", "event": "ready", "level": "info", "timestamp": "2026-12-01T13:00:00Z"}'
    )
    assert entry is not None
    assert entry.at == datetime(2026, 12, 1, 13, tzinfo=UTC)
    assert entry.text == "[info] ready deployment=chat"
    console = daemon_file_line("2026-12-01 13:00:00 [info     ] ready   deployment=chat")
    assert console is not None and console.text.startswith("[info")
    assert daemon_file_line("no time here") is None


def test_journal_entries_are_read() -> None:
    """journalctl -o json entries give their realtime timestamp, level, event and own fields (not journald's)."""
    entry = journal_entry(
        '{"__REALTIME_TIMESTAMP": "1796130000000000", "MESSAGE": "ready", "PRIORITY": "4", "DEPLOYMENT": "chat",'
        ' "SYSLOG_IDENTIFIER": "dankserve", "_PID": "1"}'
    )
    assert entry is not None and entry.text == "[warning] ready deployment=chat"
    assert entry.at.timestamp() == 1796130000


def test_merge_orders_filters_and_keeps_the_last() -> None:
    """Groups merge in time order; --since drops older lines; -n keeps the newest."""
    a = [TimedLine(NOW + timedelta(seconds=s), "a", str(s)) for s in (0, 2, 4)]
    b = [TimedLine(NOW + timedelta(seconds=s), "b", str(s)) for s in (1, 3)]
    assert [line.text for line in merged([a, b], None, 10)] == ["0", "1", "2", "3", "4"]
    assert [line.text for line in merged([a, b], NOW + timedelta(seconds=2), 2)] == ["3", "4"]


def test_followed_lines_of_several_sources_come_out_in_time_order() -> None:
    """Issue 39 (low): `logs -f`'s sources print as their lines arrive; a daemon line read 0.25 s late (daemon.log
    is polled) came after a later server line of the same second. Held for `hold` after arriving, they come out
    in time order; nothing comes out before its hold passed, and everything comes out."""
    from dankserve.logview import Reorder

    base = datetime(2026, 12, 1, 13, 0, 0).astimezone()
    server = TimedLine(base + timedelta(milliseconds=600), "dankserve-chat", "Application startup complete.")
    daemon = TimedLine(base + timedelta(milliseconds=100), "dankserve", "[info] phase phase=starting")
    later = TimedLine(base + timedelta(seconds=3), "dankserve", "[info] ready")
    reorder = Reorder(hold=0.5)
    reorder.push(server, now=10.0)
    assert reorder.due(10.2) == []
    reorder.push(daemon, now=10.25)  # earlier line, arrived later
    assert reorder.due(10.6) == []  # the daemon line (oldest) is still held: the server line waits behind it
    assert reorder.due(10.75) == [daemon, server]
    reorder.push(later, now=11.0)
    assert reorder.rest() == [later] and reorder.due(99.0) == []
