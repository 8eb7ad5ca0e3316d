"""The disk budget: which snapshots go so that the rest and a new one fit (least recently used).

Pure over the entries' sizes and last-use times; the store's edge deletes what this names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One snapshot as the budget sees it: whose, how big, when last captured or restored."""

    deployment: str
    bytes: int
    last_used: float


def to_evict(
    entries: tuple[StoredSnapshot, ...], *, max_bytes: int, incoming_bytes: int = 0, keep: str | None = None
) -> tuple[str, ...]:
    """The deployments whose snapshots to delete, least recently used first, until the others
    plus `incoming_bytes` fit in `max_bytes`. `keep` (the deployment being captured or restored)
    is never chosen. When even deleting all the others is not enough, all the others are named:
    the caller then sees the total still over budget and skips the capture."""
    total = sum(e.bytes for e in entries) + incoming_bytes
    chosen: list[str] = []
    for entry in sorted(entries, key=lambda e: (e.last_used, e.deployment)):
        if total <= max_bytes:
            break
        if entry.deployment == keep:
            continue
        chosen.append(entry.deployment)
        total -= entry.bytes
    return tuple(chosen)


def fits(entries: tuple[StoredSnapshot, ...], *, max_bytes: int, incoming_bytes: int, evicted: tuple[str, ...]) -> bool:
    """Whether `incoming_bytes` fits once `evicted` are gone."""
    left = sum(e.bytes for e in entries if e.deployment not in evicted)
    return left + incoming_bytes <= max_bytes
