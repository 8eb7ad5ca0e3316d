"""Tests for dankserve.supervisor.observe.serving: reading vLLM's /metrics and the preemption warning."""

from __future__ import annotations

import pytest

from dankserve.supervisor.observe.serving import (
    PREEMPTION_ADVICE,
    PreemptionWatch,
    parse_serving,
    preemption_notice,
    with_deployment,
)

TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 20.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.9
"""


def test_numbers_are_summed_over_engines_and_usage_is_the_highest() -> None:
    """Requests and counters add up over engines; KV-cache usage is the fullest engine's."""
    sample = parse_serving(TEXT, at=1.0)
    assert (sample.running, sample.waiting, sample.kv_cache_usage_perc) == (3.0, 4.0, 0.75)
    assert (sample.preemptions_total, sample.tokens, sample.pending) == (7.0, 120.0, 7.0)
    assert sample.as_json()["requests_waiting"] == 4


def test_only_the_relayed_families_are_kept() -> None:
    """cache_config_info stays behind; the TTFT histogram and the counters are relayed."""
    names = {family.name for family in parse_serving(TEXT, at=1.0).families}
    assert "vllm:cache_config_info" not in names
    assert {"vllm:time_to_first_token_seconds", "vllm:num_preemptions", "vllm:num_requests_waiting"} <= names


def test_older_gpu_cache_usage_name_is_read() -> None:
    """Releases before 0.10 call the KV-cache gauge vllm:gpu_cache_usage_perc."""
    sample = parse_serving('vllm:gpu_cache_usage_perc{model_name="m"} 0.3\n', at=0.0)
    assert sample.kv_cache_usage_perc == 0.3


def test_missing_numbers_are_none() -> None:
    """A text without vLLM's metrics gives no numbers, not zeros."""
    sample = parse_serving("other_metric 1\n", at=0.0)
    assert sample.running is None and sample.tokens is None and sample.pending == 0


def test_malformed_text_raises_value_error() -> None:
    """Text that is not the exposition format is a ValueError the caller can report."""
    with pytest.raises(ValueError):
        parse_serving("vllm:num_requests_running{engine= 1 2 3\n", at=0.0)


def test_families_of_several_deployments_merge_with_a_deployment_label() -> None:
    """Two deployments' samples share one family per name, each labelled with its deployment."""
    a = parse_serving(TEXT, at=0.0).families
    merged = {f.name: f for f in with_deployment([("a", a), ("b", a)])}
    samples = merged["vllm:num_requests_running"].samples
    assert sorted((s.labels["deployment"], s.labels["engine"]) for s in samples) == [
        ("a", "0"),
        ("a", "1"),
        ("b", "0"),
        ("b", "1"),
    ]


def test_first_sample_sets_the_baseline_without_a_warning() -> None:
    """Preemptions an adopted server already had are not news."""
    watch, notice = preemption_notice(PreemptionWatch(), 50, now=0, interval=300)
    assert notice is None and watch.baseline == 50


def test_a_rise_warns_once_per_interval_with_the_advice() -> None:
    """A rise warns with the advice; further rises inside the interval wait, then are reported together."""
    watch, _ = preemption_notice(PreemptionWatch(), 0, now=0, interval=300)
    watch, notice = preemption_notice(watch, 3, now=10, interval=300)
    assert notice is not None and notice.new_preemptions == 3 and PREEMPTION_ADVICE in notice.message
    watch, notice = preemption_notice(watch, 5, now=100, interval=300)
    assert notice is None
    watch, notice = preemption_notice(watch, 9, now=311, interval=300)
    assert notice is not None and notice.new_preemptions == 6 and notice.total == 9


def test_a_count_that_falls_sets_a_new_baseline() -> None:
    """A restarted server counts from zero again: no warning, a new baseline."""
    watch, _ = preemption_notice(PreemptionWatch(), 10, now=0, interval=1)
    watch, notice = preemption_notice(watch, 2, now=5, interval=1)
    assert notice is None and watch.baseline == 2


V034_TEXT = """\
# TYPE vllm:sleep_mode_operation_duration_seconds histogram
vllm:sleep_mode_operation_duration_seconds_bucket{le="1.0",operation="sleep"} 1.0
vllm:sleep_mode_operation_duration_seconds_bucket{le="+Inf",operation="sleep"} 1.0
vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"} 1.0
vllm:sleep_mode_operation_duration_seconds_sum{operation="sleep"} 0.22
# TYPE vllm:sleep_mode_operations_in_flight gauge
vllm:sleep_mode_operations_in_flight{operation="wake"} 0.0
# TYPE vllm:admission_rejections_total counter
vllm:admission_rejections_total{engine="0",model_name="m",reason="max_num_queued_reqs"} 3.0
"""


def test_sleep_mode_and_admission_families_are_relayed() -> None:
    """vLLM 0.32+'s sleep-mode and admission families reach the daemon's /metrics (issue 42)."""
    families = {family.name: family for family in parse_serving(V034_TEXT, at=1.0).families}
    assert {
        "vllm:sleep_mode_operation_duration_seconds",
        "vllm:sleep_mode_operations_in_flight",
        "vllm:admission_rejections",
    } <= set(families)
    assert families["vllm:admission_rejections"].samples[0].value == 3.0
