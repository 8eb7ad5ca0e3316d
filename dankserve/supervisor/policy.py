"""The failure policy: what the supervisor does when a boot fails, and when it restarts. Pure.

`FAILURE_POLICY` is the one table (docs/failure-policy.md is rendered from it); `decide()`
applies a row to one failure, given what the configuration allows; `next_restart()` turns a
deployment's failure history into "restart after N s" or "failed", with exponential backoff
and jitter (tenacity's `wait_exponential_jitter` formula, its random draw injected), the
first retry immediate, and more than `max_failures_in_window` failures in the window ending
the deployment's retries (other deployments are untouched: each has its own history).

Regenerate the docs page: ``python -m dankserve.supervisor.policy --write docs/failure-policy.md``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import SimpleNamespace
from typing import TYPE_CHECKING, Literal

from dankserve.bootlog.facts import FailureClass

if TYPE_CHECKING:  # the settings type only: importing pydantic-settings here would slow the CLI
    from dankserve.settings import Settings


class FailureCause(StrEnum):
    """What ended a boot: a failure class from its log, or what the supervisor saw itself."""

    BAD_ARGUMENT = FailureClass.BAD_ARGUMENT.value
    MODEL_NOT_FOUND = FailureClass.MODEL_NOT_FOUND.value
    MAX_LEN_TOO_LARGE = FailureClass.MAX_LEN_TOO_LARGE.value
    NO_KV_MEMORY = FailureClass.NO_KV_MEMORY.value
    OOM_LOAD = FailureClass.OOM_LOAD.value
    ENGINE_DEAD = FailureClass.ENGINE_DEAD.value
    OTHER = FailureClass.OTHER.value
    CRASH = "crash"
    """The workload exited and its log names no failure."""
    BOOT_TIMEOUT = "boot_timeout"
    """No readiness within `boot_timeout_seconds`."""
    ENGINE_HUNG = "engine_hung"
    """Ready, /health 200, but no tokens: requests stalled, or the token probe failed twice."""

    @classmethod
    def from_log(cls, failure: FailureClass | None) -> FailureCause:
        """The cause of an exit whose log says `failure` (None: a crash without a known reason)."""
        return cls.CRASH if failure is None else cls(failure.value)


class PolicyAction(StrEnum):
    """The four things the supervisor can do about a failure."""

    CONFIG_ERROR = "config_error"
    """Not restarted: the configuration must change. Reported with the log's message."""
    REMEDIATE_ONCE = "remediate_once"
    """Change one planned value, once per deployment, saying what changed; else a config error."""
    RELEARN = "relearn"
    """Drop the learned KV bytes and profile again, once; wait with backoff while others hold the GPU."""
    RESTART_WITH_BACKOFF = "restart_with_backoff"
    """Restart with exponential backoff and jitter; the first retry is immediate."""


@dataclass(frozen=True)
class PolicyRule:
    """One row of the failure policy."""

    cause: FailureCause
    action: PolicyAction
    does: str
    """What the supervisor does (docs)."""
    otherwise: str
    """When the action cannot apply (docs)."""


FAILURE_POLICY: tuple[PolicyRule, ...] = (
    PolicyRule(
        FailureCause.BAD_ARGUMENT,
        PolicyAction.CONFIG_ERROR,
        "Stop the deployment (state `failed`) and report vLLM's message: a flag or value was rejected.",
        "-",
    ),
    PolicyRule(
        FailureCause.MODEL_NOT_FOUND,
        PolicyAction.CONFIG_ERROR,
        "Stop the deployment and report the message: no such model or revision, a gated model without a token, "
        "or an offline cache without it.",
        "-",
    ),
    PolicyRule(
        FailureCause.MAX_LEN_TOO_LARGE,
        PolicyAction.REMEDIATE_ONCE,
        "When `max_model_len` is not set by hand: boot again once with vLLM's estimated maximum length "
        "(`auto` when the log gives none).",
        "A hand-set `max_model_len`, or a second time: configuration error naming the estimate.",
    ),
    PolicyRule(
        FailureCause.NO_KV_MEMORY,
        PolicyAction.REMEDIATE_ONCE,
        "When `gpu_memory_utilization` is not set by hand: boot again once with the top of its table band.",
        "A hand-set utilisation, one already at the top, or a second time: configuration error.",
    ),
    PolicyRule(
        FailureCause.OOM_LOAD,
        PolicyAction.RELEARN,
        "If other processes hold GPU memory (NVML): wait and retry with backoff. Else drop the learned KV "
        "bytes and profile again at once.",
        "Out of memory again after the learned bytes were dropped, with no other process on the GPU: "
        "configuration error (the weights do not fit as configured). No learned bytes used: restart with backoff.",
    ),
    PolicyRule(
        FailureCause.ENGINE_DEAD,
        PolicyAction.RESTART_WITH_BACKOFF,
        "Restart with backoff: the engine died (at start without a known cause, or while serving).",
        "-",
    ),
    PolicyRule(
        FailureCause.ENGINE_HUNG,
        PolicyAction.RESTART_WITH_BACKOFF,
        "Stop the hung server and restart with backoff: /health said 200, but requests waited with no token "
        "for `stall_seconds`, or a one-token probe (every `liveness_interval_seconds` while idle) failed twice. "
        "The evidence is the failure's message.",
        "-",
    ),
    PolicyRule(
        FailureCause.CRASH,
        PolicyAction.RESTART_WITH_BACKOFF,
        "Restart with backoff: the workload exited and its log names no failure.",
        "-",
    ),
    PolicyRule(
        FailureCause.BOOT_TIMEOUT,
        PolicyAction.RESTART_WITH_BACKOFF,
        "Stop the hung workload and restart with backoff: no readiness within `boot_timeout_seconds`.",
        "-",
    ),
    PolicyRule(
        FailureCause.OTHER,
        PolicyAction.RESTART_WITH_BACKOFF,
        "Restart with backoff: an exception of no known class.",
        "-",
    ),
)

_RULES: dict[FailureCause, PolicyRule] = {rule.cause: rule for rule in FAILURE_POLICY}


@dataclass(frozen=True)
class FailureContext:
    """What `decide()` needs to know beyond the cause: the configuration and the past."""

    message: str | None = None
    """The log's failure message."""
    max_model_len_setting: int | Literal["auto"] | None = None
    """`max_model_len` as the configuration says it (None: not set by hand)."""
    estimated_max_model_len: int | None = None
    """vLLM's estimate from its max-length error."""
    gpu_memory_utilization_setting: float | None = None
    """`gpu_memory_utilization` as set by hand (None: planned from the table)."""
    gpu_memory_utilization_planned: float | None = None
    """The utilisation the failed boot used."""
    utilization_band_top: float | None = None
    """The top of the table band of the assigned GPUs' size."""
    remediated: frozenset[FailureCause] = frozenset()
    """Causes already remediated for this deployment (each only once)."""
    learned_kv_in_use: bool = False
    """The failed boot was given learned `--kv-cache-memory-bytes`."""
    relearned: bool = False
    """The learned bytes were already dropped after an OOM since the last boot that became ready."""
    other_gpu_processes: bool = False
    """NVML shows processes other than this deployment's holding memory on its GPUs."""


@dataclass(frozen=True)
class PolicyDecision:
    """What to do about one failure."""

    cause: FailureCause
    action: PolicyAction
    outcome: Literal["config_error", "restart"]
    backoff: bool
    """True: restart after `next_restart()`'s delay; False: at once (still counted in the window)."""
    reason: str
    """What happened and what changed, for the log and `status`."""
    overrides: Mapping[str, int | float | str] = field(default_factory=dict)
    """Planned values to change for the next boot, e.g. {"max_model_len": 34480}."""
    drop_learned_kv: bool = False
    remediation: FailureCause | None = None
    """The cause remediated now (to add to `FailureContext.remediated` next time)."""


def _said(context: FailureContext) -> str:
    return f": {context.message}" if context.message else ""


def decide(cause: FailureCause, context: FailureContext) -> PolicyDecision:
    """Apply the policy table's row for `cause` to one failure."""
    rule = _RULES[cause]
    said = _said(context)

    def config_error(why: str) -> PolicyDecision:
        return PolicyDecision(cause, rule.action, "config_error", False, why)

    def backoff(why: str) -> PolicyDecision:
        return PolicyDecision(cause, rule.action, "restart", True, why)

    if rule.action is PolicyAction.CONFIG_ERROR:
        return config_error(f"vLLM rejected the configuration ({cause.value}){said}")

    if cause is FailureCause.MAX_LEN_TOO_LARGE:
        estimate = context.estimated_max_model_len
        suggestion = f"{estimate} or auto" if estimate else "auto"
        if context.max_model_len_setting is not None:
            return config_error(
                f"max_model_len = {context.max_model_len_setting} (set by hand) does not fit in the KV cache{said}; "
                f"set max_model_len = {suggestion}"
            )
        if cause in context.remediated:
            return config_error(f"max_model_len still too large after one reduction{said}")
        value: int | str = estimate if estimate else "auto"
        return PolicyDecision(
            cause,
            rule.action,
            "restart",
            False,
            f"max_model_len lowered to {value} (vLLM's estimate of what fits) after: {context.message or cause.value}",
            overrides={"max_model_len": value},
            remediation=cause,
        )

    if cause is FailureCause.NO_KV_MEMORY:
        top, planned = context.utilization_band_top, context.gpu_memory_utilization_planned
        if context.gpu_memory_utilization_setting is not None:
            return config_error(
                f"no GPU memory left for the KV cache at gpu_memory_utilization = "
                f"{context.gpu_memory_utilization_setting} (set by hand){said}; raise it or lower max_model_len"
            )
        if cause in context.remediated or top is None or (planned is not None and planned >= top):
            return config_error(f"no GPU memory left for the KV cache at the top of the utilisation band{said}")
        return PolicyDecision(
            cause,
            rule.action,
            "restart",
            False,
            f"gpu_memory_utilization raised from {planned} to {top} (top of its band) after: "
            f"{context.message or cause.value}",
            overrides={"gpu_memory_utilization": top},
            remediation=cause,
        )

    if cause is FailureCause.OOM_LOAD:
        if context.other_gpu_processes:
            return backoff(f"out of GPU memory while other processes hold it; waiting to retry{said}")
        if context.learned_kv_in_use and not context.relearned:
            return PolicyDecision(
                cause,
                rule.action,
                "restart",
                False,
                f"out of GPU memory with learned KV bytes: dropped them, profiling again{said}",
                drop_learned_kv=True,
            )
        if context.relearned:
            return config_error(
                f"out of GPU memory again after profiling afresh, with no other process on the GPU: the model does "
                f"not fit as configured{said}; lower max_model_len or gpu_memory_utilization, or use more GPUs"
            )
        return backoff(f"out of GPU memory{said}")

    return backoff(f"{cause.value}{said}")


# --- restart timing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestartSettings:
    """The restart keys of the settings (see dankserve.settings.Settings)."""

    initial_seconds: float
    max_seconds: float
    multiplier: float
    jitter_seconds: float
    window_seconds: float
    max_failures_in_window: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RestartSettings:
        """The restart keys of dankserve's settings."""
        return cls(
            initial_seconds=settings.restart_backoff_initial_seconds,
            max_seconds=settings.restart_backoff_max_seconds,
            multiplier=settings.restart_backoff_multiplier,
            jitter_seconds=settings.restart_jitter_seconds,
            window_seconds=settings.failure_window_seconds,
            max_failures_in_window=settings.max_failures_in_window,
        )


@dataclass(frozen=True)
class RestartDecision:
    """Restart after `delay_seconds` (at `not_before`), or give up: `failed`."""

    kind: Literal["restart", "failed"]
    delay_seconds: float
    not_before: float
    failures_in_window: int
    attempt: int
    """1 for the first retry in the window, 2 for the second ..."""
    reason: str


def backoff_delay(
    attempt: int, settings: RestartSettings, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """Seconds before retry number `attempt` (1-based): 0 for the first, then tenacity's
    `wait_exponential_jitter(multiplier=initial, max=max, exp_base=multiplier, jitter=jitter)`
    at its attempt `attempt - 1`: min(initial * multiplier**(attempt-2) + uniform(0, jitter), max)."""
    if attempt <= 1:
        return 0.0
    jitter = uniform(0, settings.jitter_seconds)
    try:
        result = settings.initial_seconds * settings.multiplier ** (attempt - 2) + jitter
    except OverflowError:
        result = settings.max_seconds
    return max(0.0, min(result, settings.max_seconds))


OUTAGE_RETRY_MAX_SECONDS = 30.0
"""The longest wait between attempts to reach an unreachable runtime (Podman)."""


def outage_retry_delay(
    attempt: int, settings: RestartSettings, uniform: Callable[[float, float], float] = random.uniform
) -> float:
    """Seconds before attempt number `attempt` (1-based) to reach a runtime that did not answer.

    The restart backoff, never zero (an unreachable service is not back a moment later) and at
    most `OUTAGE_RETRY_MAX_SECONDS` (so the deployment is supervised again soon after the
    service returns). Outages count no failure: a deployment is never `failed` for one.
    """
    delay = backoff_delay(attempt + 1, settings, uniform)
    return max(0.2, min(delay, settings.max_seconds, OUTAGE_RETRY_MAX_SECONDS))


def failures_in_window(history: Sequence[float], now: float, window_seconds: float) -> int:
    """How many failure times of `history` lie within the window ending `now`."""
    return sum(1 for at in history if now - window_seconds < at <= now)


def next_restart(
    history: Sequence[float],
    now: float,
    settings: RestartSettings,
    uniform: Callable[[float, float], float] = random.uniform,
    *,
    immediate: bool = False,
) -> RestartDecision:
    """When to restart a deployment whose failures happened at `history` (the latest one included).

    `uniform(a, b)` is the jitter's random source: tests inject a fixed one (or
    `random.Random(seed).uniform`); the default draws from the process's random generator.
    `immediate`: a remediation or relearn restart, at once but still counted in the window.
    """
    count = failures_in_window(history, now, settings.window_seconds)
    if count > settings.max_failures_in_window:
        return RestartDecision(
            "failed",
            0.0,
            now,
            count,
            count,
            f"{count} failures within {settings.window_seconds:g} s (more than {settings.max_failures_in_window}): "
            "not restarted again until `dankserve up`",
        )
    attempt = max(count, 1)
    delay = 0.0 if immediate else backoff_delay(attempt, settings, uniform)
    return RestartDecision(
        "restart",
        delay,
        now + delay,
        count,
        attempt,
        f"retry {attempt} of {settings.max_failures_in_window} within {settings.window_seconds:g} s, in {delay:.1f} s",
    )


# --- restart or give up ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BootFailed:
    """A boot failed (or its server died): `history` holds every failure time in the window, this one last."""

    cause: FailureCause
    context: FailureContext
    history: Sequence[float]


@dataclass(frozen=True)
class Unavailable:
    """Something the deployment needs did not answer (Podman, the Hub, a group's members): a transient
    error (`errors.DankserveError.transient`), the `attempts`-th in a row. Never the deployment's fault."""

    attempts: int


@dataclass(frozen=True)
class Refusal:
    """A command was refused for a reason only a person can fix (the configuration, the host)."""

    message: str


Trouble = BootFailed | Unavailable | Refusal


@dataclass(frozen=True)
class Verdict:
    """What becomes of a deployment in trouble: it boots again after `delay_seconds`, a failure counted
    (`restart`) or none (`retry`), or it gives up (`give_up`: failed until `dankserve up` or a config change)."""

    kind: Literal["restart", "retry", "give_up"]
    delay_seconds: float
    reason: str
    decision: PolicyDecision | None = None
    """A boot failure's row of the policy table (its action, remediation, learned bytes dropped)."""
    restart: RestartDecision | None = None
    """A boot failure's place in the restart window (None: the table gave up first)."""


def restart_or_give_up(
    trouble: Trouble,
    now: float,
    settings: RestartSettings,
    uniform: Callable[[float, float], float] = random.uniform,
) -> Verdict:
    """The one decision whether a deployment boots again, and when, or gives up.

    A boot failure goes by the policy table (`decide`: a configuration error gives up) and then the restart
    window (`next_restart`: too many failures give up; a remediation restarts at once). An unavailable
    service is waited out with the outage backoff and counts no failure. A refusal gives up."""
    match trouble:
        case Unavailable(attempts=attempts):
            delay = outage_retry_delay(attempts, settings, uniform)
            return Verdict("retry", delay, f"retrying in {delay:.1f} s")
        case Refusal(message=message):
            return Verdict("give_up", 0.0, message)
        case BootFailed(cause=cause, context=context, history=history):
            decision = decide(cause, context)
            if decision.outcome == "config_error":
                return Verdict("give_up", 0.0, decision.reason, decision)
            restart = next_restart(history, now, settings, uniform, immediate=not decision.backoff)
            if restart.kind == "failed":
                return Verdict("give_up", 0.0, restart.reason, decision, restart)
            return Verdict("restart", restart.delay_seconds, restart.reason, decision, restart)


# --- docs -------------------------------------------------------------------------------------------


def render_policy_markdown() -> str:
    """docs/failure-policy.md, rendered from FAILURE_POLICY (and the settings' defaults)."""
    from dankserve.settings import Settings

    # The declared defaults, not Settings(): that would read DANKSERVE_* from the environment.
    default = {name: info.default for name, info in Settings.model_fields.items()}
    defaults = RestartSettings.from_settings(SimpleNamespace(**default))  # type: ignore[arg-type]
    lines = [
        "# Failure policy",
        "",
        "<!-- Generated from dankserve/supervisor/policy.py (FAILURE_POLICY); do not edit by hand.",
        "     Regenerate: python -m dankserve.supervisor.policy --write docs/failure-policy.md -->",
        "",
        "What the supervisor does when a deployment's boot fails or its server dies. The cause comes from",
        "the boot log (`dankserve inspect-log` shows it) or from the supervisor itself (`crash`, `boot_timeout`,",
        "`engine_hung`).",
        "",
        "| cause | action | what dankserve does | otherwise |",
        "|---|---|---|---|",
    ]
    for rule in FAILURE_POLICY:
        lines.append(f"| `{rule.cause.value}` | `{rule.action.value}` | {rule.does} | {rule.otherwise} |")
    lines += [
        "",
        "## Restarts",
        "",
        "- The first retry is immediate; later ones wait `restart_backoff_initial_seconds` "
        f"({defaults.initial_seconds:g} s), growing by `restart_backoff_multiplier` ({defaults.multiplier:g}) "
        f"per failure up to `restart_backoff_max_seconds` ({defaults.max_seconds:g} s), plus a random jitter of "
        f"0 to `restart_jitter_seconds` ({defaults.jitter_seconds:g} s): tenacity's `wait_exponential_jitter`.",
        "- Failures are counted over the last `failure_window_seconds` "
        f"({defaults.window_seconds:g} s); more than `max_failures_in_window` ({defaults.max_failures_in_window}) "
        "there and the deployment is `failed`: not restarted until `dankserve up`. Other deployments are untouched.",
        "- Remediations (`remediate_once`) and the relearn after an OOM restart at once, but count in the window.",
        "- The runtime (Podman) unreachable is no failure of the deployment: its server is still probed over "
        "HTTP, and the runtime is asked again with the same backoff (never more than "
        f"{OUTAGE_RETRY_MAX_SECONDS:g} s apart) until it answers; the container is then followed again if it "
        "kept running, else replaced. Nothing counts in the window.",
        "- A configuration error is not restarted; the deployment shows `failed` with vLLM's message.",
        "- Swap groups: a sleep or wake that fails (an error answer, a route that answers but leaves the server in "
        "the wrong state, 300 s without an answer) is `engine_dead` of a server that served: it is removed and "
        "restarted as above, and its boot first makes room among the group's awake members. A server that dies "
        "while asleep is the same. A server without sleep mode (`/is_sleeping` 404) is no failure: it is stopped "
        "instead of put to sleep.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    """Print the policy page, or write it with `--write FILE`."""
    text = render_policy_markdown()
    if len(argv) == 2 and argv[0] == "--write":
        with open(argv[1], "w", encoding="utf-8") as out:
            out.write(text)
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
