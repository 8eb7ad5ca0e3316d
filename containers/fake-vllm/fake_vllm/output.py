"""Writes log lines to stdout/stderr from any thread, each record whole and flushed.

With a trace file (FAKE_VLLM_TRACE_FILE) each record's write is also noted there, with the
clocks read just after the flush returned: `MONOTONIC WALL STREAM FIRST-LINE`. A benchmark
compares them with when a reader saw the line, without the noise of watching the log itself.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import TextIO

from .logfmt import render, uvicorn_record, vllm_record
from .messages import Message


class Output:
    """The process's two streams; vLLM logs to stdout, tqdm bars and uvicorn's own lines to stderr."""

    def __init__(
        self,
        stdout: TextIO,
        stderr: TextIO,
        colour: bool,
        api_pid: int,
        tensor_parallel_size: int,
        *,
        trace: TextIO | None = None,
    ) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._trace = trace
        self._lock = threading.Lock()
        self.colour = colour
        self.api_pid = api_pid
        # One process as the stand-in, but vLLM's own process names and distinct pids in the log.
        self.engine_pid = api_pid + 97
        self._tensor_parallel_size = tensor_parallel_size

    def _process(self, message: Message, rank: int) -> tuple[str, int]:
        if message.process == "api":
            return "APIServer", self.api_pid
        if message.process == "main":
            return "MainProcess", self.api_pid
        if message.process == "worker" and self._tensor_parallel_size > 1:
            return f"Worker_TP{rank}", self.engine_pid + 1 + rank
        return "EngineCore", self.engine_pid

    def log(self, message: Message, args: tuple[object, ...] = (), rank: int = 0, suffix: str = "") -> None:
        name, pid = self._process(message, rank)
        text = render(message.format, args) + suffix
        record = vllm_record(
            name, pid, message.level, when=datetime.now(), origin=message.origin, message=text, colour=self.colour
        )
        self.write("stdout", record + "\n")

    def uvicorn(self, message: str, level: str = "INFO", stream: str = "stderr") -> None:
        self.write(stream, uvicorn_record(level, message) + "\n")

    def write(self, stream: str, text: str) -> None:
        target = self._stdout if stream == "stdout" else self._stderr
        with self._lock:
            try:
                target.write(text)
                target.flush()
            except (BrokenPipeError, ValueError):
                pass  # the reader went away; the server keeps its behaviour regardless
            if self._trace is not None:
                monotonic, wall = time.monotonic(), time.time()
                self._trace.write(f"{monotonic:.6f} {wall:.6f} {stream} {trace_line(text)}\n")
                self._trace.flush()


def trace_line(text: str) -> str:
    """The record's first non-empty line as the trace names it (progress bars: the last \\r frame)."""
    for line in text.split("\n"):
        shown = line.rsplit("\r", 1)[-1].strip()
        if shown:
            return shown
    return ""
