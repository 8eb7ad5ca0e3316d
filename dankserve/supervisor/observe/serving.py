"""vLLM's own serving numbers, read from its /metrics text, and what they mean for us. Pure.

`parse_serving` turns one scrape into a `ServingSample`: the few numbers the supervisor reads
itself (requests running and waiting, KV-cache usage, preemptions, tokens) and the metric
families relayed on the daemon's /metrics with a `deployment` label (`RELAYED`, a fixed list:
relaying all of vLLM's histograms would make every scrape of ours slow). `preemption_notice`
says when a rising preemption count is worth a warning, at most once per interval.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

RELAYED: tuple[str, ...] = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",  # the same gauge's name before vLLM 0.10
    "vllm:num_preemptions",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:engine_sleep_state",
    "vllm:sleep_mode_operation_duration_seconds",  # 0.32+: each sleep, wake and KV release, by operation
    "vllm:sleep_mode_operations_in_flight",  # 0.32+
    "vllm:admission_rejections",  # 0.32+: requests vLLM's --max-num-queued-reqs/-tokens refused, by reason
)
"""vLLM metric families (as the parser names them: counters without `_total`) relayed per deployment."""

PREEMPTION_ADVICE = (
    'the KV cache is too small for the load: give it more memory (kv_cache_dtype = "fp8"), '
    "lower max_num_seqs, or shorten max_model_len"
)


@dataclass(frozen=True)
class ServingSample:
    """One read of a server's /metrics (sums over vLLM's engines and label sets)."""

    at: float
    """When it was read (the daemon's clock, seconds)."""
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_perc: float | None = None
    """Fraction of the KV cache in use (1.0 = full), the highest over engines."""
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    families: tuple[Metric, ...] = field(default=(), compare=False, repr=False)
    """The RELAYED families as read (labels as vLLM gave them)."""

    @property
    def pending(self) -> float:
        """Requests the engine holds (running or waiting); unknown counts as none."""
        return (self.running or 0.0) + (self.waiting or 0.0)

    @property
    def tokens(self) -> float | None:
        """Prompt plus generation tokens processed so far (None when vLLM reports neither)."""
        if self.prompt_tokens_total is None and self.generation_tokens_total is None:
            return None
        return (self.prompt_tokens_total or 0.0) + (self.generation_tokens_total or 0.0)

    def as_json(self) -> dict[str, float | int | None]:
        """The numbers `status --json` shows under `serving`."""
        return {
            "requests_running": _int(self.running),
            "requests_waiting": _int(self.waiting),
            "kv_cache_usage_perc": self.kv_cache_usage_perc,
            "preemptions": _int(self.preemptions_total),
            "prompt_tokens": _int(self.prompt_tokens_total),
            "generation_tokens": _int(self.generation_tokens_total),
        }


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def parse_serving(text: str, at: float) -> ServingSample:
    """The sample in one /metrics text; a malformed text raises ValueError."""
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    relayed: list[Metric] = []
    for family in text_string_to_metric_families(text):
        if family.name in RELAYED:
            relayed.append(family)
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            peaks[sample.name] = max(peaks.get(sample.name, sample.value), sample.value)
    usage = peaks.get("vllm:kv_cache_usage_perc", peaks.get("vllm:gpu_cache_usage_perc"))
    return ServingSample(
        at=at,
        running=sums.get("vllm:num_requests_running"),
        waiting=sums.get("vllm:num_requests_waiting"),
        kv_cache_usage_perc=usage,
        preemptions_total=sums.get("vllm:num_preemptions_total"),
        prompt_tokens_total=sums.get("vllm:prompt_tokens_total"),
        generation_tokens_total=sums.get("vllm:generation_tokens_total"),
        families=tuple(relayed),
    )


def with_deployment(families: Iterable[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """vLLM's families of several deployments merged into one family per name, each sample
    labelled with its `deployment` (an exposition may name a family only once)."""
    merged: dict[str, Metric] = {}
    for deployment, own in families:
        for family in own:
            target = merged.get(family.name)
            if target is None:
                target = Metric(family.name, family.documentation, family.type, family.unit)
                merged[family.name] = target
            for sample in family.samples:
                labels = {**sample.labels, "deployment": deployment}
                target.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
    return list(merged.values())


@dataclass(frozen=True)
class PreemptionWatch:
    """What the preemption warning remembers between samples."""

    baseline: float | None = None
    """The count at the last warning (or the first sample): a rise beyond it is news."""
    warned_at: float | None = None


@dataclass(frozen=True)
class PreemptionNotice:
    """A warning to log and show in status."""

    at: float
    new_preemptions: int
    total: int
    message: str


def preemption_notice(
    watch: PreemptionWatch, total: float | None, now: float, interval: float
) -> tuple[PreemptionWatch, PreemptionNotice | None]:
    """Whether preemptions rose since the last warning and the interval has passed since it.

    The first sample of a boot sets the baseline (a server adopted with old preemptions is not
    news); a count that fell (the server restarted) sets it again.
    """
    if total is None:
        return watch, None
    if watch.baseline is None or total < watch.baseline:
        return PreemptionWatch(total, watch.warned_at), None
    rise = total - watch.baseline
    if rise <= 0 or (watch.warned_at is not None and now - watch.warned_at < interval):
        return watch, None
    notice = PreemptionNotice(
        at=now,
        new_preemptions=int(rise),
        total=int(total),
        message=f"{int(rise)} preemptions while serving ({int(total)} since start): {PREEMPTION_ADVICE}",
    )
    return PreemptionWatch(total, now), notice
