"""A command run on a pseudo-terminal, as a person at a terminal runs it: its output as the screen got it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TerminalRun:
    returncode: int
    output: str
    """Everything written to the terminal (stdout and stderr), control sequences included."""


def run_in_terminal(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120, columns: int = 160
) -> TerminalRun:
    """Run `argv` with a pseudo-terminal as stdin, stdout and stderr; its exit code and output."""
    leader, follower = pty.openpty()
    os.set_blocking(leader, False)
    full_env = {**os.environ, **(env or {}), "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen(list(argv), stdin=follower, stdout=follower, stderr=follower, env=full_env)
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: every holder of the terminal closed it
                    data = b""
                if data:
                    chunks.append(data)
                    continue
                if proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{argv} did not end in {timeout}s; so far:\n{b''.join(chunks).decode()}")
        proc.wait(10)
    finally:
        os.close(leader)
    return TerminalRun(proc.returncode, b"".join(chunks).decode(errors="replace"))
