"""The upgrade's pure checks: does the plan hold on the new release, and is the new server no worse?"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from dankserve.plan.serve_args import split_options
from dankserve.plan.types import Plan


@dataclass(frozen=True)
class Limits:
    """How much worse the new server may be (settings' [upgrade] table)."""

    kv_shrink_percent: float = 5.0
    decode_slowdown_percent: float = 10.0


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Measurement:
    """One server's figures on the fixed request."""

    kv_cache_tokens: int | None
    """`GPU KV cache size: N tokens` from its boot log (None: not read)."""
    decode_tokens_per_second: float | None
    greedy_ids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_cache_tokens": self.kv_cache_tokens,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "greedy_ids": list(self.greedy_ids),
        }


@dataclass(frozen=True)
class Verdict:
    """Switch or roll back, with the reasons (empty when it switches) and the figures for status."""

    switch: bool
    reasons: tuple[str, ...]
    report: dict[str, Any]


def flag_name(argument: str) -> str | None:
    """The option string of one argv item (`--max-model-len=4096` -> `--max-model-len`), None for a value."""
    if not argument.startswith("--") or argument == "--":
        return None
    return argument.split("=", 1)[0]


def flags_gone(argv: Iterable[str], accepted: Collection[str]) -> tuple[str, ...]:
    """The planned option strings the new release's `vllm serve` does not accept, in argv order."""
    gone: list[str] = []
    for argument in argv:
        name = flag_name(argument)
        if name is not None and name not in accepted and name not in gone:
            gone.append(name)
    return tuple(gone)


@dataclass(frozen=True)
class _Figure:
    """One figure judged by how much worse the new server's is (KV tokens, decode tokens/s)."""

    key: str
    worse: str
    unit: str
    missing: str

    def judge(self, old: Measurement, new: Measurement, limits: Limits, report: dict[str, Any]) -> str | None:
        """Why the new value is a regression (None: it is not, or the old one is unknown); its change reported."""
        kv = self.key == "kv"
        before = old.kv_cache_tokens if kv else old.decode_tokens_per_second
        after = new.kv_cache_tokens if kv else new.decode_tokens_per_second
        limit = limits.kv_shrink_percent if kv else limits.decode_slowdown_percent
        if not before:
            return None
        if not after:
            return self.missing
        change = (after - before) / before * 100.0
        report[f"{self.key}_change_percent"] = round(change, 2)
        if -change <= limit:
            return None
        return f"{self.worse} {-change:.1f} % ({before:g} -> {after:g} {self.unit}; the limit is {limit:g} %)"


def judge(old: Measurement, new: Measurement, limits: Limits) -> Verdict:
    """Whether the new server keeps the KV capacity and decode speed within the limits.

    A figure the old server never had cannot be compared and is not held against the new one;
    one the new server cannot give while the old one did is a regression. Greedy ids are reported,
    never judged: a new release may change kernels and with them a token at a tie."""
    reasons: list[str] = []
    report: dict[str, Any] = {"old": old.to_json(), "new": new.to_json()}
    for figure in (
        _Figure("kv", "KV cache shrank", "tokens", "the new server's KV cache size was not read from its boot log"),
        _Figure("decode", "decode is slower by", "tokens/s", "the new server gave no decode throughput on the request"),
    ):
        reason = figure.judge(old, new, limits, report)
        if reason is not None:
            reasons.append(reason)
    if old.greedy_ids and new.greedy_ids:
        report["greedy_ids_equal"] = old.greedy_ids == new.greedy_ids
        if old.greedy_ids != new.greedy_ids:
            first = next(
                (i for i, (a, b) in enumerate(zip(old.greedy_ids, new.greedy_ids, strict=False)) if a != b),
                min(len(old.greedy_ids), len(new.greedy_ids)),
            )
            report["greedy_ids_first_difference"] = first
    return Verdict(not reasons, tuple(reasons), report)


def plan_changes(old: Plan | None, new: Plan) -> tuple[str, ...]:
    """What the re-plan for the new release changes, one line each: the release, flags added, dropped or
    given another value, environment variables, the kept kernels, and the plan's new notes (empty: the same)."""
    if old is None:
        return ()
    lines: list[str] = []
    if old.vllm_version != new.vllm_version:
        lines.append(f"vLLM {old.vllm_version} -> {new.vllm_version}")
    before = {o.name: " ".join(o.values) for o in split_options(old.argv[1:])[1]}
    after = {o.name: " ".join(o.values) for o in split_options(new.argv[1:])[1]}
    reasons = {c.flag: c.reason for c in new.flags}
    for flag, value in after.items():
        if flag not in before:
            lines.append(f"added {flag}{' ' + value if value else ''}: {reasons.get(flag, 'from extra_args')}")
        elif before[flag] != value:
            lines.append(f"{flag} {before[flag]} -> {value}")
    lines += [f"dropped {flag}" for flag in before if flag not in after]
    lines += [f"env {key} dropped" for key in old.env if key not in new.env]
    lines += [f"env {key}={new.env[key]}" for key in new.env if old.env.get(key) != new.env[key]]
    old_kernels = old.kernels.target if old.kernels is not None else None
    new_kernels = new.kernels.target if new.kernels is not None else None
    if old_kernels != new_kernels:
        lines.append(f"kept kernels {old_kernels or 'none'} -> {new_kernels or 'none'}")
    lines += [f"note: {note}" for note in new.notes if note not in old.notes]
    return tuple(lines)
