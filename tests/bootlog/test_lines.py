"""Tests for dankserve.bootlog.lines: prefixes and wrappers around vLLM's messages."""

from __future__ import annotations

import pytest

from dankserve.bootlog.lines import message_of, process_of, split_cri, strip_ansi


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("(APIServer pid=1) INFO 11-29 18:00:00 [entry.py:139] Starting vLLM server", "Starting vLLM server"),
        ("INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading", "Loading"),
        ("(EngineCore pid=3) ERROR 11-29 18:00:41 [core.py:1584] ValueError: x", "ValueError: x"),
        ("2026-11-29T18:00:00.123Z stderr F ValueError: x", "ValueError: x"),
        ("Nov 29 18:00:00 gpu1 conmon[123]: ValueError: x", "ValueError: x"),
        ("Nov 29 18:00:00 gpu1 conmon[123]: 2026-11-29T18:00:00.1Z stdout F ValueError: x", "ValueError: x"),
        ("[rank0]: RuntimeError: NCCL error", "RuntimeError: NCCL error"),
        ("(APIServer pid=1) INFO:     Application startup complete.", "Application startup complete."),
        ("ValueError: x", "ValueError: x"),
    ],
)
def test_message_of(line: str, message: str) -> None:
    """The message is found behind vLLM's prefix and behind stacked wrappers."""
    assert message_of(line) == message


def test_strip_ansi() -> None:
    """ANSI colour codes are removed, text kept."""
    line = "\x1b[0;36m(APIServer pid=1)\x1b[0;0m \x1b[32mINFO\x1b[0m \x1b[90m11-29 18:00:00\x1b[0m"
    assert strip_ansi(line) == "(APIServer pid=1) INFO 11-29 18:00:00"


def test_process_of() -> None:
    """The `(NAME pid=N)` prefix is the process; none gives ''."""
    assert process_of("(Worker_TP1 pid=302) INFO x") == "(Worker_TP1 pid=302)"
    assert process_of("(VllmWorker rank=1 pid=12) INFO x") == "(VllmWorker rank=1 pid=12)"
    assert process_of("INFO 01-30 03:18:12 x.py:1] y") == ""


def test_split_cri() -> None:
    """A CRI line splits into its stream, partial flag and content; other lines do not."""
    assert split_cri("2026-11-29T18:00:00.123Z stdout P abc") == ("stdout", True, "abc")
    assert split_cri("2026-11-29T18:00:00.123Z stderr F x y") == ("stderr", False, "x y")
    assert split_cri("INFO 01-30 03:18:12 x.py:1] y") is None
