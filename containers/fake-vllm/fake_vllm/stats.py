"""The periodic stats line of vllm/v1/metrics/loggers.py LoggingStatLogger.log (pure).

`Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s,
Running: %d reqs, Waiting: %d reqs, [Preemptions: %d, ]GPU KV cache usage: %.1f%%[, Prefix cache
hit rate: %.1f%%]`. The preemption count is per logging interval (reset every interval) and shown
only when above zero; the line is logged at INFO only while the engine is not idle (throughput
in this or the previous interval), otherwise at DEBUG, which the default level hides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class IntervalStats:
    prompt_throughput: float
    generation_throughput: float
    running: int
    waiting: int
    preemptions: int
    kv_usage_percent: float
    prefix_cache_hit_rate: float | None


def stats_message(stats: IntervalStats) -> str:
    parts = [
        f"Avg prompt throughput: {stats.prompt_throughput:.1f} tokens/s",
        f"Avg generation throughput: {stats.generation_throughput:.1f} tokens/s",
        f"Running: {stats.running:d} reqs",
        f"Waiting: {stats.waiting:d} reqs",
    ]
    if stats.preemptions > 0:
        parts.append(f"Preemptions: {stats.preemptions:d}")
    parts.append(f"GPU KV cache usage: {stats.kv_usage_percent:.1f}%")
    if stats.prefix_cache_hit_rate is not None:
        parts.append(f"Prefix cache hit rate: {stats.prefix_cache_hit_rate:.1f}%")
    return "Engine 000: " + ", ".join(parts)


def engine_is_idle(prompt: float, generation: float, last_prompt: float, last_generation: float) -> bool:
    return not any((prompt, generation, last_prompt, last_generation))
