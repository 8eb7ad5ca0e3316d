"""Tests for dankserve.hub.weights: which deployments the daemon downloads, and the fetcher's shortcuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.hub.weights import WeightsFetcher, wants_download
from dankserve.settings import DeploymentSettings, ModelFactsSettings, Settings
from dankserve.testing.hub import StandInHub
from tests.harness.hub import small_repo

MIB = 1 << 20


@pytest.mark.parametrize(
    ("model", "download", "facts", "expected"),
    [
        ("Qwen/Qwen3-8B", None, False, True),  # a Hub id: yes by default
        ("Qwen/Qwen3-8B", None, True, False),  # facts declared: the Hub is not asked
        ("Qwen/Qwen3-8B", True, True, True),  # unless asked for
        ("Qwen/Qwen3-8B", False, False, False),
        ("/models/q", True, False, False),  # a path: nothing to download
    ],
)
def test_wants_download(model: str, download: bool | None, facts: bool, expected: bool) -> None:
    """Hub ids download unless model_facts are declared or download = false; paths never."""
    dep = DeploymentSettings(
        model=model, download=download, model_facts=ModelFactsSettings(parameter_bytes=1) if facts else None
    )
    assert wants_download(dep) is expected


def test_fetcher_reports_percent_and_then_skips_the_hub(
    hub: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A first fetch reports up to 100 %; a second one finds the pull's record and asks the Hub nothing."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    small_repo(hub, "weights/one", 4 * MIB)
    settings = Settings(state_dir=tmp_path / "state", hf_cache_dir=tmp_path / "hf")
    dep = DeploymentSettings(model="weights/one")
    seen: list[int] = []
    WeightsFetcher(settings)("d", dep, seen.append)
    assert seen[-1] == 100 and seen == sorted(seen)
    before = len(hub.requests)
    again: list[int] = []
    WeightsFetcher(settings)("d", dep, again.append)
    assert again == [100] and len(hub.requests) == before


def test_fetcher_does_nothing_for_declared_facts(tmp_path: Path) -> None:
    """No download, no progress, no Hub for a deployment whose facts are declared."""
    seen: list[int] = []
    settings = Settings(state_dir=tmp_path / "state", hf_cache_dir=tmp_path / "hf")
    WeightsFetcher(settings)(
        "d", DeploymentSettings(model="o/a", model_facts=ModelFactsSettings(parameter_bytes=1)), seen.append
    )
    assert seen == []


def test_fetcher_fetches_hub_adapters_even_with_declared_facts(
    hub: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment's Hub adapters are fetched before its boot (not local ones, nor with download = false); once."""
    from dankserve.hub.adapters import adapter_facts

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    hub.add_adapter("weights/lora", rank=16)
    settings = Settings(state_dir=tmp_path / "state", hf_cache_dir=tmp_path / "hf")
    facts = ModelFactsSettings(parameter_bytes=1)
    dep = DeploymentSettings(model="/models/m", model_facts=facts, adapters={"l": "weights/lora"})
    WeightsFetcher(settings)("d", dep.model_copy(update={"download": False}), lambda _: None)
    assert not (tmp_path / "hf" / "hub" / "models--weights--lora").exists()
    WeightsFetcher(settings)("d", dep, lambda _: None)
    assert adapter_facts(settings.hf_cache_dir, "d", dep)[0].rank == 16
    before = len(hub.requests)
    WeightsFetcher(settings)("d", dep, lambda _: None)
    assert len(hub.requests) == before
