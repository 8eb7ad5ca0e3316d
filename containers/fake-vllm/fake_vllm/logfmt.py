"""vLLM 0.33's and uvicorn's log line shapes (pure).

vllm/logger.py: `(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
[%(fileinfo)s:%(lineno)d] %(message)s` with datefmt `%m-%d %H:%M:%S`.
vllm/logging_utils/formatter.py NewLineFormatter: every further line of a multi-line message
(tracebacks included) repeats the whole prefix and is joined with `\\r\\n`; ColoredFormatter
colours the process prefix cyan, the level by severity, time and file grey.
uvicorn's default formatter: `INFO:     message` (level name and colon padded to 9, then a space).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

CYAN: Final = "\033[0;36m"
CYAN_RESET: Final = "\033[0;0m"
GREY: Final = "\033[90m"
RESET: Final = "\033[0m"
LEVEL_COLOURS: Final = {
    "DEBUG": "\033[37m",
    "INFO": "\033[32m",
    "WARNING": "\033[33m",
    "ERROR": "\033[31m",
    "CRITICAL": "\033[35m",
}
DATE_FORMAT: Final = "%m-%d %H:%M:%S"


@dataclass(frozen=True)
class Origin:
    """Where in vLLM 0.33's source a message is logged from (file name and line of the call)."""

    file: str
    line: int


def use_colour(no_color: str | None, force_color: str | None, vllm_logging_color: str | None, is_tty: bool) -> bool:
    """vllm/logger.py _use_color: NO_COLOR or VLLM_LOGGING_COLOR=0 win, then FORCE_COLOR, then a TTY."""
    if (no_color or "0") != "0" or vllm_logging_color == "0":
        return False
    if vllm_logging_color == "1" or (force_color or "0") != "0":
        return True
    return is_tty


def render(message_format: str, args: tuple[object, ...]) -> str:
    """%-formatting as logging.LogRecord.getMessage does it."""
    return message_format % args if args else message_format


def vllm_record(
    process_name: str,
    pid: int,
    level: str,
    *,
    when: datetime,
    origin: Origin,
    message: str,
    colour: bool,
) -> str:
    """One formatted record, continuation lines prefixed and joined with CRLF like NewLineFormatter."""
    stamp = when.strftime(DATE_FORMAT)
    if colour:
        prefix = (
            f"{CYAN}({process_name} pid={pid}){CYAN_RESET} {LEVEL_COLOURS.get(level, '')}{level}{RESET} "
            f"{GREY}{stamp}{RESET} {GREY}[{origin.file}:{origin.line}]{RESET} "
        )
    else:
        prefix = f"({process_name} pid={pid}) {level} {stamp} [{origin.file}:{origin.line}] "
    if message == "":
        return prefix
    return prefix + message.replace("\n", "\r\n" + prefix)


def uvicorn_record(level: str, message: str) -> str:
    """uvicorn.logging.DefaultFormatter / AccessFormatter without colours."""
    return f"{(level + ':').ljust(9)} {message}"


def access_message(client: str, method: str, path: str, status: int, phrase: str) -> str:
    """uvicorn's access line: `127.0.0.1:5555 - "GET /health HTTP/1.1" 200 OK`."""
    return f'{client} - "{method} {path} HTTP/1.1" {status} {phrase}'


def progress_line(description: str, done: int, total: int, elapsed: float, rate: float) -> str:
    """The weights bar of vllm/model_executor/model_loader/weight_utils.py (_BAR_FORMAT)."""
    percentage = 100.0 * done / total if total else 100.0
    remaining = (total - done) / rate if rate > 0 else None
    rate_text = f"{rate:5.2f}it/s" if rate > 0 else "?it/s"
    remaining_text = _clock(remaining) if remaining is not None else "?"
    return (
        f"{description}: {percentage:3.0f}% Completed | {done}/{total} "
        f"[{_clock(elapsed)}<{remaining_text}, {rate_text}]"
    )


def tqdm_bar(description: str, done: int, total: int, elapsed: float) -> str:
    """tqdm's default bar, as the CUDA-graph capture bar of gpu_model_runner.py prints it."""
    fraction = done / total if total else 1.0
    filled = int(fraction * 10)
    bar = "█" * filled + ("" if filled == 10 else " " * (10 - filled))
    rate = done / elapsed if elapsed > 0 else 0.0
    remaining_text = _clock((total - done) / rate) if rate > 0 else "?"
    rate_text = f"{rate:.2f}it/s" if rate > 0 else "?it/s"
    return (
        f"{description}: {fraction * 100:3.0f}%|{bar}| {done}/{total} [{_clock(elapsed)}<{remaining_text}, {rate_text}]"
    )


def _clock(seconds: float) -> str:
    whole = int(seconds)
    minutes, secs = divmod(whole, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
