"""Writes log lines to stdout/stderr from any thread, each record whole and flushed."""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TextIO

from .logfmt import render, uvicorn_record, vllm_record
from .messages import Message


class Output:
    """The process's two streams; vLLM logs to stdout, tqdm bars and uvicorn's own lines to stderr."""

    def __init__(self, stdout: TextIO, stderr: TextIO, colour: bool, api_pid: int, tensor_parallel_size: int) -> None:
        self._stdout = stdout
        self._stderr = stderr
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
