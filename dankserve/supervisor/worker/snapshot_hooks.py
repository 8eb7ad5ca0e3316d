"""The server's routes a snapshot's capture and restore call (issue 41, docs/snapshots.md): `steps.Hooks` bound to
one server's address and key, over the world's `ServerEdges`.

Before the GPU checkpoint the server gives back what a checkpoint should not hold: vLLM 0.34's
`/checkpoint/prepare` where the release has it (its KV cache and communicator state released, the weights kept;
served again by `/checkpoint/restore`), else a level-2 sleep (weights dropped, KV freed; the staged wake after).
Without sleep mode both are skipped (the GPU checkpoint then copies the weights too: a bigger snapshot). The
canary is the greedy ids of the swap canary prompt. A failed route is a `StepFailed` with the server's words.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dankserve.backend_address import BackendAddress
from dankserve.snapshot.steps import Hooks, StepFailed
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import canary_ids


def _unless(answer: m.Event, wanted: type[m.Event]) -> str | None:
    """The problem a sleep-mode route answered (None: the event wanted)."""
    return None if isinstance(answer, wanted) else str(getattr(answer, "message", answer))


def _done(problem: str | None) -> None:
    if problem is not None:
        raise StepFailed(problem)


def server_hooks(
    edges: Any,
    address: BackendAddress,
    key: str | None,
    model: str,
    *,
    sleeps: bool,
    prepares: bool,
    after_sleep: Callable[[], None] = lambda: None,
) -> Hooks:
    """The hooks of the server at `address` (`edges`: the world's ServerEdges)."""

    def sleep() -> None:
        if prepares:
            _done(edges.checkpoint_prepare(address, key))
        elif sleeps:
            _done(_unless(edges.sleep_server(address, key, "2"), m.FellAsleep))
        after_sleep()

    def wake() -> None:
        if prepares:
            _done(edges.checkpoint_restore(address, key))
        elif sleeps:
            _done(_unless(edges.wake_server(address, key, "2"), m.WokeUp))

    def canary() -> tuple[int, ...]:
        ids = canary_ids(address, key, model)
        if isinstance(ids, str):
            raise StepFailed(ids)
        return ids

    return Hooks(sleep=sleep, wake=wake, canary=canary)


def serve_again(edges: Any, address: BackendAddress, key: str | None) -> str | None:
    """A server a stopped capture (a daemon killed midway) left prepared (0.34) or asleep, served again: what
    was done (None: nothing to do). A failed checkpoint restore raises OSError with the server's words."""
    if edges.checkpoint_prepared(address, key):
        problem = edges.checkpoint_restore(address, key)
        if problem is not None:
            raise OSError(problem)
        return "checkpoint restore"
    if edges.is_sleeping(address, key):
        edges.wake_server(address, key, "2")
        return "wake"
    return None
