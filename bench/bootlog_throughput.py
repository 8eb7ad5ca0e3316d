"""Boot-log reader throughput: lines per second over large synthetic logs (median of runs).

Two logs, both built from the fixture logs in tests/bootlog/fixtures (every vLLM era, ANSI,
`\\r` progress bars, journald and CRI wrappers, failures):

- `boot-heavy`: the fixtures concatenated and repeated (every line is a boot or failure line);
- `serving`: one boot, then hours of steady state: a stats line every 10 s per engine and
  access-log lines between them, as a long-running server's log is.

Baseline, measured in the same run (the machines are shared and noisy): the same patterns
without the token pre-filter, every regex tried on every line (on a tenth of the lines).

Usage: python bench/bootlog_throughput.py [--lines N] [--repeat R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from dankserve.bootlog import BootLogReader
from dankserve.bootlog.patterns import ALL_PATTERNS

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "bootlog" / "fixtures"
TARGET_LINES_PER_SECOND = 200_000


def fixture_lines() -> list[str]:
    """Every fixture log's lines, in name order."""
    lines: list[str] = []
    for path in sorted(FIXTURES.glob("*.log")):
        lines.extend(path.read_text(encoding="utf-8").split("\n"))
    return lines


def boot_heavy_log(count: int) -> list[str]:
    """The fixture lines repeated up to `count` lines."""
    base = fixture_lines()
    return (base * (count // len(base) + 1))[:count]


def serving_log(count: int) -> list[str]:
    """One boot, then stats lines every 10 s and access-log lines between them."""
    boot = (FIXTURES / "v033_cold.log").read_text(encoding="utf-8").split("\n")
    lines = list(boot)
    tick = 0
    while len(lines) < count:
        tick += 1
        usage = (tick * 7) % 1000 / 10
        preempt = f"Preemptions: {tick % 5}, " if tick % 17 == 0 else ""
        lines.append(
            f"(APIServer pid=1) INFO 11-29 18:{tick // 60 % 60:02d}:{tick % 60:02d} [loggers.py:336] Engine 000: "
            f"Avg prompt throughput: {tick % 97 * 13.1:.1f} tokens/s, Avg generation throughput: {tick % 89 * 9.7:.1f} "
            f"tokens/s, Running: {tick % 31} reqs, Waiting: {tick % 3} reqs, {preempt}GPU KV cache usage: "
            f"{usage:.1f}%, Prefix cache hit rate: {tick % 100:.1f}%"
        )
        for request in range(20):
            lines.append(
                f'(APIServer pid=1) INFO:     127.0.0.1:{40000 + request} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
            )
    return lines[:count]


def lines_per_second(lines: list[str], repeat: int) -> tuple[float, list[float]]:
    """Median lines/s of feeding all lines to a fresh reader, over `repeat` runs."""
    rates = []
    for _ in range(repeat):
        reader = BootLogReader()
        feed = reader.feed
        start = time.perf_counter()
        for line in lines:
            feed(line)
        rates.append(len(lines) / (time.perf_counter() - start))
    return statistics.median(rates), rates


def naive_lines_per_second(lines: list[str], repeat: int) -> float:
    """Median lines/s of trying every pattern's regex on every line (no pre-filter, no handling)."""
    searches = [pattern.regex.search for pattern in ALL_PATTERNS]
    rates = []
    for _ in range(repeat):
        start = time.perf_counter()
        for line in lines:
            for search in searches:
                search(line)
        rates.append(len(lines) / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=500_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for name, lines in (("boot-heavy", boot_heavy_log(args.lines)), ("serving", serving_log(args.lines))):
        median, rates = lines_per_second(lines, args.repeat)
        naive = naive_lines_per_second(lines[: len(lines) // 10], max(3, args.repeat // 2))
        rows.append(
            {
                "log": name,
                "lines": len(lines),
                "runs": args.repeat,
                "median_lines_per_s": int(median),
                "min_lines_per_s": int(min(rates)),
                "no_prefilter_lines_per_s": int(naive),
                "speedup": round(median / naive, 1),
                "target_lines_per_s": TARGET_LINES_PER_SECOND,
                "meets_target": median >= TARGET_LINES_PER_SECOND,
            }
        )
    report("bootlog_throughput", rows)


if __name__ == "__main__":
    main()
