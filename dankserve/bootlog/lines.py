"""Line shapes around vLLM's messages: colours, carriage returns, prefixes and wrappers.

vLLM's prefix (vllm/logger.py, 0.33): ``(NAME pid=N) LEVEL MM-DD HH:MM:SS [file.py:LINE] message``;
older versions drop ``(NAME pid=N)`` and sometimes the brackets (``INFO 01-30 03:18:12
gpu_model_runner.py:848] ...``). `vllm/logging_utils/formatter.py` repeats the prefix after
``\\r\\n`` for every further line of a message and, with colour on, wraps level, time and file
in ANSI codes. Other tools put their own prefix in front:

- CRI / Podman k8s-file: ``2026-11-29T18:00:00.123Z stdout F message`` (``P`` = partial line)
- journald short output: ``Nov 29 18:00:00 host conmon[123]: message``
- timestamps (``podman logs -t``): ``2026-11-29T18:00:00.123456789+00:00 message``
- torch.distributed: ``[rank0]: message``
"""

from __future__ import annotations

import re

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# The vLLM prefix, as `vllm/logger.py` _FORMAT renders it in each era (search, not match:
# wrappers may stand in front of it).
VLLM_PREFIX_RE = re.compile(
    r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+:\d+\]\s?"
)
PROCESS_RE = re.compile(r"\((\w[\w-]*)(?:\s+rank=\d+)?\s+pid=\d+\)")

_WRAPPERS = (
    re.compile(r"^\d{4}-\d\d-\d\dT\S+\s+(?:stdout|stderr)\s+[FP]\s"),  # CRI / k8s-file
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: "),  # journald short
    re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),  # timestamps
    re.compile(r"^\(\w[\w-]*(?:\s+rank=\d+)?\s+pid=\d+\)\s"),  # vLLM/Ray process prefix
    re.compile(r"^\[rank\d+\]:\s?"),  # torch.distributed
)
_CRI_PARTIAL_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\S+\s+(?:stdout|stderr))\s+([FP])\s(.*)$", re.DOTALL)


def strip_ansi(line: str) -> str:
    """The line without ANSI escape sequences."""
    return ANSI_RE.sub("", line) if "\x1b" in line else line


def message_of(line: str) -> str:
    """The message part of a line: after vLLM's prefix, else after any known wrappers."""
    match = VLLM_PREFIX_RE.search(line)
    if match is not None:
        return line[match.end() :]
    for _ in range(4):  # wrappers stack (journald around CRI around a process prefix)
        for wrapper in _WRAPPERS:
            found = wrapper.match(line)
            if found is not None:
                line = line[found.end() :]
                break
        else:
            break
    if line.startswith("INFO:") or line.startswith("ERROR:") or line.startswith("WARNING:"):
        line = line.split(":", 1)[1].lstrip()  # uvicorn's own prefix
    return line


def process_of(line: str) -> str:
    """The `(NAME pid=N)` process of a line, or '' when it has none."""
    match = PROCESS_RE.search(line)
    return "" if match is None else match.group(0)


def split_cri(line: str) -> tuple[str, bool, str] | None:
    """A CRI-format line as (stream key, partial?, content), or None when it is not one."""
    match = _CRI_PARTIAL_RE.match(line)
    if match is None:
        return None
    stream = match.group(1).split()[-1]
    return stream, match.group(2) == "P", match.group(3)
