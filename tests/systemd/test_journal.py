"""Tests for dankserve.systemd.journal: the native protocol, checked against a real journald."""

from __future__ import annotations

import io
import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from dankserve.logging_setup import configure_logging
from dankserve.systemd.journal import JournalSender, encode_entry, field_name, field_value, journal_fields
from tests.harness.journald import read_journal


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """Each test configures structlog process-wide; put the defaults back afterwards."""
    yield
    structlog.reset_defaults()


def test_plain_fields_encoding() -> None:
    """Single-line values are KEY=value lines."""
    assert encode_entry({"MESSAGE": "hi", "PRIORITY": "6"}) == b"MESSAGE=hi\nPRIORITY=6\n"


def test_multiline_value_encoding() -> None:
    """A value with a newline is KEY, its 64-bit little-endian length, the bytes, a newline."""
    value = "line one\nline two"
    assert encode_entry({"MESSAGE": value}) == b"MESSAGE\n" + struct.pack("<Q", len(value)) + value.encode() + b"\n"


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("deployment", "DEPLOYMENT"),
        ("container_id", "CONTAINER_ID"),
        ("weights-%", "WEIGHTS__"),
        ("_pid", "PID"),
        ("2x", "X"),
        ("___", None),
    ],
)
def test_field_names(key: str, name: str | None) -> None:
    """Event keys become valid journal field names (never trusted `_` fields)."""
    assert field_name(key) == name


def test_processor_builds_fields() -> None:
    """The last processor maps event, level and keys to MESSAGE, PRIORITY and upper-cased fields."""
    fields = journal_fields(
        None,
        "warning",
        {
            "event": "boot failed",
            "level": "warning",
            "deployment": "chat",
            "gpus": [0, 1],
            "timestamp": "x",
            "skipped": None,
        },
    )
    assert fields == {
        "MESSAGE": "boot failed",
        "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": "dankserve",
        "DEPLOYMENT": "chat",
        "GPUS": "[0, 1]",
    }
    assert field_value(3.5) == "3.5"


def test_unreachable_journal_falls_back(tmp_path: Path) -> None:
    """With no journald listening the entry goes to the fallback stream, and nothing raises."""
    stream = io.StringIO()
    sender = JournalSender(str(tmp_path / "no-journal"), fallback=stream)
    assert not sender.send({"MESSAGE": "ready", "PRIORITY": "6", "DEPLOYMENT": "chat"})
    assert "ready" in stream.getvalue() and "deployment=chat" in stream.getvalue()


@pytest.mark.journald
def test_structlog_fields_reach_journald(journald: str) -> None:
    """Through structlog, an entry carries MESSAGE, PRIORITY, SYSLOG_IDENTIFIER and custom fields."""
    run = uuid.uuid4().hex
    assert configure_logging("journald", journal_socket=journald) == "journald"
    log = structlog.get_logger().bind(deployment="chat", test_run=run)
    log.warning("loading weights", phase="loading", container_id="3f2a9c", weights_percent=42)
    (entry,) = read_journal("DEPLOYMENT=chat", f"TEST_RUN={run}")
    assert entry["MESSAGE"] == "loading weights"
    assert entry["PRIORITY"] == "4"
    assert entry["SYSLOG_IDENTIFIER"] == "dankserve"
    assert (entry["PHASE"], entry["CONTAINER_ID"], entry["WEIGHTS_PERCENT"]) == ("loading", "3f2a9c", "42")


@pytest.mark.journald
def test_multiline_and_exception_reach_journald(journald: str) -> None:
    """A multi-line message and an exception's traceback arrive whole."""
    run = uuid.uuid4().hex
    configure_logging("journald", journal_socket=journald)
    log = structlog.get_logger().bind(test_run=run)
    try:
        raise ValueError("no KV memory")
    except ValueError:
        log.exception("boot failed\nsecond line", deployment="chat")
    (entry,) = read_journal(f"TEST_RUN={run}")
    message = str(entry["MESSAGE"])
    assert message.startswith("boot failed\nsecond line\nTraceback")
    assert "ValueError: no KV memory" in message
    assert entry["PRIORITY"] == "3"


@pytest.mark.journald
def test_large_entry_goes_through_a_memfd(journald: str) -> None:
    """An entry larger than a datagram can hold is sent as a sealed memfd and stored whole."""
    run = uuid.uuid4().hex
    big = "x" * 300_000 + "\nend"
    assert JournalSender(journald).send({"MESSAGE": big, "TEST_RUN": run, "SYSLOG_IDENTIFIER": "dankserve"})
    (entry,) = read_journal(f"TEST_RUN={run}")
    assert entry["MESSAGE"] == big
