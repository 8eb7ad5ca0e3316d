"""Tests for dankserve.hub.pull: downloads from the stand-in Hub with the real huggingface_hub client."""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
from pathlib import Path

import pytest

from dankserve.errors import DiskSpaceShortfall, ModelAccessDenied
from dankserve.hub.access import HubAccess, hub_access
from dankserve.hub.cache import read_model_files
from dankserve.hub.download import Progress
from dankserve.hub.pull import complete_locally, partial_bytes, pull, repo_folder
from dankserve.testing.hub import StandInHub
from tests.harness.hub import SLOW_BYTES_PER_SECOND, small_repo, tensors_of
from tests.harness.wait import wait_until

MIB = 1 << 20


def access(hub: StandInHub, tmp_path: Path) -> HubAccess:
    return hub_access(tmp_path / "hf", tmp_path / "state", "chat", None, {"HF_ENDPOINT": hub.url})


def test_pull_downloads_what_vllm_needs_with_progress(hub: StandInHub, tmp_path: Path) -> None:
    """Config, tokenizer and safetensors land in the HF cache under refs/main; other formats are left out."""
    small_repo(hub, "pull/small", 8 * MIB)
    seen: list[Progress] = []
    result = pull(access(hub, tmp_path), "pull/small", None, seen.append)
    assert result.fetched_files == result.files == 4
    snapshot = result.snapshot
    assert (snapshot / "model.safetensors").stat().st_size == 8 * MIB
    assert not (snapshot / "pytorch_model.bin").exists()
    assert (repo_folder(access(hub, tmp_path), "pull/small") / "refs" / "main").read_text() == result.commit
    assert seen and seen[-1].done_bytes == seen[-1].total_bytes == result.total_bytes
    assert read_model_files(tmp_path / "hf", "pull/small", None) is not None  # the planner finds it


def test_second_pull_skips_complete_files(hub: StandInHub, tmp_path: Path) -> None:
    """Everything complete: nothing fetched, no download request."""
    small_repo(hub, "pull/again", 2 * MIB)
    a = access(hub, tmp_path)
    pull(a, "pull/again", None)
    before = len(hub.requests)
    result = pull(a, "pull/again", None)
    assert result.fetched_files == 0 and result.fetched_bytes == 0
    assert not [r for r in hub.requests[before:] if "/resolve/" in r.path or "/cdn/" in r.path]
    assert complete_locally(a, "pull/again", None)


def _pull_in_child(url: str, root: str) -> None:
    os.environ["HF_ENDPOINT"] = url
    pull(hub_access(Path(root) / "hf", Path(root) / "state", "chat", None, {"HF_ENDPOINT": url}), "pull/slow", None)


def test_interrupted_pull_resumes_with_a_range_request(hub: StandInHub, tmp_path: Path) -> None:
    """A pull killed midway leaves an .incomplete blob; the next one asks only for the rest (Range)."""
    size = 6 * SLOW_BYTES_PER_SECOND  # about 6 s at the slow repo's rate
    small_repo(hub, "pull/slow", size, bytes_per_second=SLOW_BYTES_PER_SECOND)
    a = access(hub, tmp_path)
    child = multiprocessing.get_context("spawn").Process(target=_pull_in_child, args=(hub.url, str(tmp_path)))
    child.start()
    with contextlib.suppress(AssertionError):  # the assertion below says what was there
        wait_until(lambda: partial_bytes(repo_folder(a, "pull/slow")) >= 2 * SLOW_BYTES_PER_SECOND, 30, 0.1)
    child.kill()
    child.join()
    already = partial_bytes(repo_folder(a, "pull/slow"))
    assert already >= 2 * SLOW_BYTES_PER_SECOND
    hub.repos["pull/slow"].bytes_per_second = None  # the rest at full speed
    before = len(hub.requests)
    result = pull(a, "pull/slow", None)
    ranges = [r.range for r in hub.requests[before:] if r.path.endswith("/model.safetensors") and r.method == "GET"]
    assert ranges and ranges[-1] is not None and int(ranges[-1].removeprefix("bytes=").split("-")[0]) >= already
    whole = (result.snapshot / "model.safetensors").read_bytes()
    assert hashlib.sha256(whole).hexdigest() == hub.repos["pull/slow"].files["model.safetensors"].sha256
    assert partial_bytes(repo_folder(a, "pull/slow")) == 0


def test_too_little_disk_exits_3_naming_the_shortfall(hub: StandInHub, tmp_path: Path) -> None:
    """A repo larger than the free disk: exit 3 before any download, with the bytes missing."""
    hub.add_model("pull/huge", {"model_type": "llama"}, tensors_of(4 << 40, 2))  # 8 TiB, sparse on the Hub's side
    before = len(hub.requests)
    with pytest.raises(DiskSpaceShortfall) as error:
        pull(access(hub, tmp_path), "pull/huge", None)
    assert error.value.exit_code == 3 and "short" in error.value.message and "pull/huge" in error.value.message
    assert not [r for r in hub.requests[before:] if "/cdn/" in r.path]


def test_gated_pull_without_token_exits_2(hub: StandInHub, tmp_path: Path) -> None:
    """The same access errors as planning: a gated model without a token is exit 2."""
    with pytest.raises(ModelAccessDenied):
        pull(access(hub, tmp_path), "org/gated", None)
