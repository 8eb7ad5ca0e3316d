"""The edge behind verified sleeps and wakes (issue 29): the canary completion on loopback, NVML's
per-process reading, and the state file's fingerprints and unsafe levels. The verdicts are
`swap_checks`' (pure); this module reads, and answers the machine's event.

- Before a configuration's first sleep (its server as booted, never slept) the canary's greedy
  token ids are taken and kept in state.json (`canaries`, by boot key).
- After `/sleep` answered (and `/is_sleeping` says asleep): NVML's used memory of the server's
  processes on its GPUs, against the CUDA context plus `sleep_check_margin_bytes`. More:
  `SleepKeptMemory`, so the machine marks the level unsafe and stops the server instead.
- After a wake, before the member counts as ready: the canary again; other ids: `WokeWrong`, so the
  machine marks the level unsafe and restarts the server by stop and boot. The canary's time is
  part of the wake's seconds (and so of the prediction history).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from dankserve.backend_address import BackendAddress
from dankserve.host.gpu_processes import process_tree
from dankserve.plan.serve_args import served_name
from dankserve.state import UnsafeSleep
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_checks import (
    CANARY_MAX_TOKENS,
    CANARY_PROMPT,
    SUSPENDED_BYTES,
    canary_key,
    check_sleep,
    check_wake,
    sleep_tolerance_bytes,
)
from dankserve.supervisor.observe.swap_history import SwapCheck, Verdict
from dankserve.supervisor.probes.health import post_completion
from dankserve.supervisor.records import StateBook

if TYPE_CHECKING:
    from dankserve.runtime.base import Runtime
    from dankserve.settings import DeploymentSettings

log = structlog.get_logger("dankserve.swap")

SUSPEND_SETTLE_SECONDS = 2.0
"""How long a suspended member's reading may take to come down to 0 bytes (the driver releases the context)."""
CANARY_TIMEOUT_SECONDS = 30.0
"""The longest the canary completion may take (a few greedy tokens of a ready server)."""

Canary = Callable[[BackendAddress, str | None, str], "tuple[int, ...] | str"]
"""(address, api key, served model name) -> the greedy token ids, or why there are none."""
HeldBytes = Callable[[Sequence[int], Sequence[str]], "dict[str, int] | None"]
"""(pids, GPU UUIDs) -> bytes those processes hold on each GPU (None: unreadable)."""


def canary_ids(address: BackendAddress, api_key: str | None, model: str) -> tuple[int, ...] | str:
    """POST /v1/completions of the fixed prompt, temperature 0, `return_token_ids` (vLLM 0.10.2+), through
    the probes' one loopback completion (bounded answer, timeouts)."""
    body: dict[str, object] = {
        "model": model,
        "prompt": CANARY_PROMPT,
        "max_tokens": CANARY_MAX_TOKENS,
        "temperature": 0,
        "seed": 0,
        "return_token_ids": True,
    }
    answer = post_completion(address, body, api_key, CANARY_TIMEOUT_SECONDS, purpose="swap-canary")
    if isinstance(answer, str):
        return answer
    status, raw = answer
    if status != 200:
        return f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
    return _token_ids(raw)


def _token_ids(raw: bytes) -> tuple[int, ...] | str:
    try:
        choice = json.loads(raw)["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return "the answer is not a completion"
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return tuple(ids[:CANARY_MAX_TOKENS])
    text = choice.get("text") if isinstance(choice, dict) else None
    if isinstance(text, str):  # a release without return_token_ids: the text's code points stand in
        return tuple(ord(c) for c in text[:256])
    return "the answer has neither token_ids nor text"


@dataclass(frozen=True)
class SwapTarget:
    """The member a sleep or wake is for, as the checks need it."""

    name: str
    model: str
    served_name: str
    address: BackendAddress
    api_key: str | None
    vllm_version: str | None
    boot_key: str | None
    uuids: tuple[str, ...]
    pids: Callable[[], Sequence[int]]
    margin_bytes: int

    @property
    def canary_key(self) -> str:
        return canary_key(self.boot_key, self.vllm_version, self.model)


class SwapVerifier:
    """Checks every sleep and wake of swap group members (shared by the workers: state is the StateBook's)."""

    def __init__(self, state: StateBook, canary: Canary, held: HeldBytes) -> None:
        self._state = state
        self._canary = canary
        self._held = held

    def sleep(
        self,
        target: SwapTarget,
        do_sleep: Callable[[], m.Event],
        checks: list[SwapCheck] | None = None,
        *,
        suspend: bool = False,
    ) -> m.Event:
        """Take the fingerprint if this configuration has none yet, sleep, then check NVML's reading
        (the sleep's seconds are /sleep's own: the reading takes a few milliseconds); its verdict goes into
        `checks` (the swap history's). A suspend (`suspend`, issue 41 item 7) that went through must leave 0
        bytes; one that fell back to level 1 (`SuspendFailed`) is checked as a level-1 sleep."""
        if target.canary_key not in self._state.deployment(target.name).canaries:
            ids = self._canary(target.address, target.api_key, target.served_name)
            if isinstance(ids, tuple):
                self._state.remember_canary(target.name, target.canary_key, ids)
                log.info("canary_recorded", deployment=target.name, tokens=len(ids))
            else:
                log.warning("canary_not_recorded", deployment=target.name, error=ids)
        event = do_sleep()
        if not isinstance(event, m.FellAsleep | m.SuspendFailed):
            return event
        suspended = suspend and isinstance(event, m.FellAsleep)
        tolerance = SUSPENDED_BYTES if suspended else sleep_tolerance_bytes(target.margin_bytes)
        held = self._held(target.pids(), target.uuids)
        settle_until = time.monotonic() + SUSPEND_SETTLE_SECONDS
        while suspended and held is not None and max(held.values(), default=0) > tolerance:
            if time.monotonic() >= settle_until:  # NVML may list a released context a moment longer
                break
            time.sleep(0.1)
            held = self._held(target.pids(), target.uuids)
        verdict = check_sleep(held, tolerance)
        said: Verdict = "not checked" if held is None else "passed" if verdict.released else "failed"
        (checks if checks is not None else []).append(SwapCheck("memory", said, verdict.message, verdict.held_bytes))
        if not verdict.released:
            return m.SleepKeptMemory(verdict.held_bytes, verdict.message)
        log.info("sleep_verified", deployment=target.name, held_bytes=verdict.held_bytes, check=verdict.message)
        return event

    def wake(
        self, target: SwapTarget, do_wake: Callable[[], m.Event], checks: list[SwapCheck] | None = None
    ) -> m.Event:
        """Wake, then the canary: the same ids as the fingerprint, or WokeWrong. Its time is the wake's; its
        verdict goes into `checks`."""
        event = do_wake()
        if not isinstance(event, m.WokeUp):
            return event
        noted = checks if checks is not None else []
        fingerprint = self._state.deployment(target.name).canaries.get(target.canary_key)
        if fingerprint is None:
            log.info("wake_unverified", deployment=target.name, reason="no fingerprint for this configuration")
            noted.append(SwapCheck("canary", "not checked", "no fingerprint taken for this configuration"))
            return event
        canary_started = time.monotonic()
        problem = check_wake(fingerprint, self._canary(target.address, target.api_key, target.served_name))
        canary_seconds = time.monotonic() - canary_started
        if problem is not None:
            noted.append(SwapCheck("canary", "failed", problem))
            return m.WokeWrong(problem)
        same = f"the same {len(fingerprint)} token ids as before the first sleep ({canary_seconds:.3f} s)"
        noted.append(SwapCheck("canary", "passed", same))
        log.info("wake_verified", deployment=target.name, canary_seconds=round(canary_seconds, 4))
        return m.WokeUp(event.seconds + canary_seconds)

    def mark_unsafe(self, target_name: str, model: str, vllm_version: str | None, level: str, reason: str) -> None:
        """Remember a level that failed (stop never does: it has nothing to check)."""
        if level in ("1", "2", "suspend"):
            self._state.mark_sleep_unsafe(target_name, UnsafeSleep(level, vllm_version, model, reason, time.time()))


def swap_target(
    name: str,
    dep: DeploymentSettings,
    machine: m.MachineState,
    api_key: str | None,
    pids: Callable[[], Sequence[int]],
    *,
    address: BackendAddress,
) -> SwapTarget:
    """The target of a sleep or wake of `name` (its settings, and its boot as the machine knows it)."""
    boot = machine.boot
    return SwapTarget(
        name=name,
        model=dep.model,
        served_name=served_name(dep.served_model_name, dep.extra_args, dep.model),
        address=address,
        api_key=api_key,
        vllm_version=machine.vllm_version,
        boot_key=boot.boot_key if boot is not None else None,
        uuids=machine.gpu_uuids,
        pids=pids,
        margin_bytes=dep.sleep_check_margin_bytes,
    )


def workload_pids(runtime: Runtime, workload_id: str) -> list[int]:
    """The host pids of a workload's processes (its main process and every descendant), none when gone."""
    try:
        workload = runtime.inspect(workload_id)
    except Exception:  # the runtime not answering now: nothing to judge by, the sleep is not verified
        return []
    return process_tree(workload.pid if workload is not None else None)
