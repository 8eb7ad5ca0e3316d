"""The snapshot's pure core: the validity key and the disk budget's eviction (issue 41)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dankserve.snapshot.eviction import StoredSnapshot, fits, to_evict
from dankserve.snapshot.key import SnapshotKey, WeightsFile, invalid_reason

_INPUTS: dict[str, Any] = {
    "argv": ("vllm", "serve", "m", "--port", "8000"),
    "image_digest": "sha256:aa",
    "vllm_version": "0.26.0",
    "driver_version": "580.1",
    "gpu_model": "NVIDIA H200",
    "gpu_uuid": "GPU-1",
    "kernel_release": "6.18",
    "criu_version": "4.2.1",
    "dankserve_version": "0.1.0",
}


def _key(**over: object) -> SnapshotKey:
    base = SnapshotKey.of(
        **_INPUTS,
        env={"HF_TOKEN": "hf_secret", "B": "2"},
        weights=(WeightsFile("b.safetensors", 2, 20), WeightsFile("a.safetensors", 1, 10)),
    )
    return replace(base, **over)  # type: ignore[arg-type]


def test_same_inputs_in_any_order_are_valid() -> None:
    other_order = SnapshotKey.of(
        **_INPUTS,
        env={"B": "2", "HF_TOKEN": "hf_secret"},
        weights=(WeightsFile("a.safetensors", 1, 10), WeightsFile("b.safetensors", 2, 20)),
    )
    assert invalid_reason(_key(), other_order) is None


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("image_digest", "sha256:bb", "image digest"),
        ("vllm_version", "0.27.0", "vLLM version"),
        ("driver_version", "590.0", "driver version"),
        ("gpu_model", "NVIDIA B200", "GPU model"),
        ("gpu_uuid", "GPU-2", "GPU (UUID)"),
        ("kernel_release", "6.19", "kernel release"),
        ("criu_version", "4.3", "CRIU version"),
        ("dankserve_version", "0.2.0", "dankserve version"),
    ],
)
def test_each_field_invalidates_and_is_named(field: str, value: str, words: str) -> None:
    reason = invalid_reason(_key(), _key(**{field: value}))
    assert reason is not None and words in reason and value in reason


def test_env_and_argv_changes_never_show_their_values() -> None:
    stored = _key()
    reason = invalid_reason(stored, _key(env=(("B", "2"), ("HF_TOKEN", "hf_other"))))
    assert reason == "the server's environment changed since the capture"
    reason = invalid_reason(stored, _key(argv=("vllm", "serve", "m", "--api-key", "sk-x")))
    assert reason is not None and "sk-x" not in reason and "arguments" in reason


def test_weights_changes_name_the_files() -> None:
    stored = _key()
    now = _key(weights=(WeightsFile("a.safetensors", 1, 11), WeightsFile("c.safetensors", 3, 30)))
    reason = invalid_reason(stored, now)
    assert reason is not None
    assert "gone b.safetensors" in reason and "new c.safetensors" in reason and "changed a.safetensors" in reason


def test_first_difference_wins_plan_first() -> None:
    reason = invalid_reason(_key(), _key(argv=("x",), kernel_release="7"))
    assert reason is not None and "arguments" in reason


def _e(name: str, size: int, used: float) -> StoredSnapshot:
    return StoredSnapshot(deployment=name, bytes=size, last_used=used)


def test_nothing_evicted_within_budget() -> None:
    assert to_evict((_e("a", 10, 1), _e("b", 10, 2)), max_bytes=30, incoming_bytes=10) == ()


def test_least_recently_used_go_first_until_it_fits() -> None:
    entries = (_e("new", 10, 9), _e("old", 10, 1), _e("mid", 10, 5))
    chosen = to_evict(entries, max_bytes=25, incoming_bytes=10)
    assert chosen == ("old", "mid")
    assert fits(entries, max_bytes=25, incoming_bytes=10, evicted=chosen)


def test_the_kept_deployment_is_never_evicted() -> None:
    entries = (_e("cur", 10, 0), _e("other", 10, 5))
    assert to_evict(entries, max_bytes=15, incoming_bytes=0, keep="cur") == ("other",)


def test_too_big_names_all_others_and_does_not_fit() -> None:
    entries = (_e("a", 10, 1), _e("b", 10, 2))
    chosen = to_evict(entries, max_bytes=5, incoming_bytes=50)
    assert chosen == ("a", "b")
    assert not fits(entries, max_bytes=5, incoming_bytes=50, evicted=chosen)
