"""A worker's zero-residual sleep (issue 41 item 7): the GPU half of sleep level `suspend`, run through the
world's GPU checkpoint edge (the driver's in its helper process, or the stand-in's records).

The sleep is vLLM's level 1 (the worker's swap commands send it), then this: every process of the server's
tree holding a CUDA context is locked and checkpointed (`snapshot/suspend.py`), so it holds 0 bytes on the
GPU. The wake is this first (restore and unlock), then vLLM's level-1 wake. A failed suspend is undone: the
server's processes run unlocked again and it sleeps at plain level 1, with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dankserve.errors import DankserveError
from dankserve.snapshot import suspend as gpu_suspend
from dankserve.snapshot.gpu import GpuCheckpoint
from dankserve.snapshot.steps import Outcome

LASTING = frozenset({"host", "deployment"})
"""Remedies of a failed GPU step that will fail the same way next time (gpu.py): suspend is marked unsafe."""


@dataclass(frozen=True)
class SuspendProblem:
    """Why a suspend or its resume failed; `lasting`: it will fail the same way next time."""

    reason: str
    lasting: bool = False


class SuspendEdge:
    """One deployment's GPU suspend and resume (one GPU checkpoint edge kept: its helper process lives on)."""

    def __init__(self, gpu: Callable[[], GpuCheckpoint], logger: Any) -> None:
        self._factory = gpu
        self._gpu: GpuCheckpoint | None = None
        self._log = logger

    def _edge(self) -> GpuCheckpoint:
        if self._gpu is None:
            self._gpu = self._factory()
        return self._gpu

    def suspend(self, pids: Sequence[int]) -> SuspendProblem | None:
        """Checkpoint the CUDA processes among `pids` (the server's tree); None when they hold 0 bytes now."""
        done = self._run("suspend", pids)
        if not isinstance(done, tuple):
            return done
        holders, outcome = done
        if outcome.ok:
            return None
        problem = SuspendProblem(outcome.reason or "the GPU checkpoint failed", outcome.remedy in LASTING)
        again = self.resume(holders)  # whatever the undo left locked (a process locked before this began)
        if again is not None:
            problem = SuspendProblem(f"{problem.reason}; then {again.reason}", problem.lasting)
        return problem

    def resume(self, pids: Sequence[int]) -> SuspendProblem | None:
        """Restore and unlock the CUDA processes among `pids` (those running need nothing); None when done."""
        done = self._run("resume", pids)
        if not isinstance(done, tuple):
            return done
        _, outcome = done
        if not outcome.ok:
            return SuspendProblem(outcome.reason or "the GPU restore failed", outcome.remedy in LASTING)
        return None

    def _run(
        self, kind: Literal["suspend", "resume"], pids: Sequence[int]
    ) -> tuple[list[int], Outcome] | SuspendProblem:
        """The holders among `pids` and what `kind` did to them (logged with its timings when it did anything)."""
        began = time.monotonic()
        try:
            gpu = self._edge()
            holders = gpu.holders(list(pids))
            outcome = (gpu_suspend.suspend if kind == "suspend" else gpu_suspend.resume)(holders, gpu)
        except DankserveError as exc:  # the edge itself (no cuda-bindings, a helper that died)
            return SuspendProblem(exc.message, getattr(exc, "remedy", None) in LASTING)
        if outcome.ok and outcome.timings:
            timings = {k: round(v, 4) for k, v in outcome.timings.items()}
            event = "gpu_suspended" if kind == "suspend" else "gpu_resumed"
            self._log.info(event, holders=holders, seconds=round(time.monotonic() - began, 3), **timings)
        return holders, outcome
