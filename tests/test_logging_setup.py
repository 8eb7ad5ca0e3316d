"""Tests for dankserve.logging_setup: which output each log format means, and what it writes."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from dankserve.logging_setup import configure_logging, resolve_log_format, stderr_is_journal
from tests.harness.journald import journald

__all__ = ["journald"]


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """Each test configures structlog process-wide; put the defaults back afterwards."""
    yield
    structlog.reset_defaults()


def test_console_lines(tmp_path: Path) -> None:
    """Console format writes readable lines with the event and its keys."""
    stream = io.StringIO()
    assert configure_logging("console", stream=stream) == "console"
    structlog.get_logger().info("ready", deployment="chat", endpoint="http://127.0.0.1:8000")
    line = stream.getvalue()
    assert "ready" in line and "deployment" in line and "chat" in line and "\x1b[" not in line


def test_json_lines() -> None:
    """JSON format writes one object per line with event, level, timestamp and keys."""
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    structlog.get_logger().warning("restarting", deployment="chat", delay_seconds=2.0)
    entry = json.loads(stream.getvalue())
    assert entry["event"] == "restarting" and entry["level"] == "warning" and entry["deployment"] == "chat"
    assert "timestamp" in entry


def test_level_filters() -> None:
    """Events below the configured level are dropped."""
    stream = io.StringIO()
    configure_logging("json", stream=stream, level="warning")
    structlog.get_logger().info("chatter")
    assert stream.getvalue() == ""


def test_no_journald_means_console(tmp_path: Path) -> None:
    """Without a listening journald, auto and even journald fall back to console lines."""
    missing = str(tmp_path / "socket")
    assert resolve_log_format("auto", journal_socket=missing) == "console"
    assert resolve_log_format("journald", journal_socket=missing) == "console"
    assert resolve_log_format("json", journal_socket=missing) == "json"


def test_stderr_is_journal(tmp_path: Path) -> None:
    """$JOURNAL_STREAM names stderr by device and inode; anything else is not the journal."""
    with open(tmp_path / "stderr", "w") as stream:
        status = os.fstat(stream.fileno())
        assert stderr_is_journal({"JOURNAL_STREAM": f"{status.st_dev}:{status.st_ino}"}, stream)
        assert not stderr_is_journal({"JOURNAL_STREAM": f"{status.st_dev}:{status.st_ino + 1}"}, stream)
        assert not stderr_is_journal({"JOURNAL_STREAM": "junk"}, stream)
        assert not stderr_is_journal({}, stream)


@pytest.mark.journald
def test_auto_uses_journald_under_systemd_only(journald: str, tmp_path: Path) -> None:
    """With journald listening, auto picks journald only when stderr is the journal stream."""
    with open(tmp_path / "stderr", "w") as stream:
        status = os.fstat(stream.fileno())
        under_systemd = {"JOURNAL_STREAM": f"{status.st_dev}:{status.st_ino}"}
        assert resolve_log_format("auto", journal_socket=journald, environ=under_systemd, stream=stream) == "journald"
        assert resolve_log_format("auto", journal_socket=journald, environ={}, stream=stream) == "console"
        assert resolve_log_format("journald", journal_socket=journald, environ={}, stream=stream) == "journald"
