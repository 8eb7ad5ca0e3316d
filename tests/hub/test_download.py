"""Tests for dankserve.hub.download: which files, disk fit, progress (pure)."""

from __future__ import annotations

import pytest

from dankserve.hub.download import (
    GIB,
    Progress,
    ProgressMeter,
    RemoteFile,
    choose_files,
    disk_shortfall,
    plan_pull,
    progress_text,
)


def test_other_weight_formats_are_left_out_beside_safetensors() -> None:
    """With safetensors present, .bin/.pt/GGUF and original/ checkpoints are not downloaded."""
    files = [
        RemoteFile(p, 1) for p in ("config.json", "model.safetensors", "pytorch_model.bin", "original/x.pth", "m.gguf")
    ]
    assert [f.path for f in choose_files(files)] == ["config.json", "model.safetensors"]


def test_without_safetensors_everything_is_kept() -> None:
    """A .bin-only repo keeps its weights."""
    files = [RemoteFile("config.json", 1), RemoteFile("pytorch_model.bin", 5)]
    assert choose_files(files) == tuple(files)


def test_plan_counts_what_is_left() -> None:
    """Complete files are skipped; bytes in .incomplete blobs are not fetched again."""
    plan = plan_pull([RemoteFile("a", 10), RemoteFile("b", 90)], ["a"], partial_bytes=40)
    assert [f.path for f in plan.missing] == ["b"]
    assert (plan.total_bytes, plan.complete_bytes, plan.bytes_to_fetch) == (100, 10, 50)


@pytest.mark.parametrize(
    ("need", "free", "short"), [(10 * GIB, 20 * GIB, 0), (10 * GIB, 11 * GIB, 0), (10 * GIB, 10 * GIB, GIB)]
)
def test_disk_shortfall_keeps_a_margin(need: int, free: int, short: int) -> None:
    """A pull leaves 1 GiB free; the shortfall is what is missing for that."""
    assert disk_shortfall(need, free) == short


def test_meter_rate_and_eta() -> None:
    """The rate over the window and the time left; the text names bytes, percent, rate and time left."""
    meter = ProgressMeter(total_bytes=100 * GIB)
    meter.sample(0.0, 0)
    progress = meter.sample(10.0, 10 * GIB)
    assert progress.rate == pytest.approx(GIB) and progress.eta_seconds == pytest.approx(90.0)
    assert progress_text(progress) == "10.0 GiB of 100.0 GiB (10 %), 1.0 GiB/s, 1:30 left"


def test_percent_of_an_empty_repo_is_complete() -> None:
    """Nothing to fetch is 100 %."""
    assert Progress(0, 0, None).percent == 100.0
