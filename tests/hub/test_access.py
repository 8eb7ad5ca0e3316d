"""Tests for dankserve.hub.access and the HF_HOME / HF_HUB_CACHE default of hf_cache_dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.hub.access import DEFAULT_ENDPOINT, hub_access, is_hub_id, offline_mode, read_token
from dankserve.settings import DEFAULT_HF_CACHE_DIR, default_hf_cache_dir


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, DEFAULT_HF_CACHE_DIR),
        ({"HF_HOME": "/data/hf"}, Path("/data/hf")),
        ({"HF_HUB_CACHE": "/data/hf/hub"}, Path("/data/hf")),
        ({"HF_HUB_CACHE": "/data/models"}, DEFAULT_HF_CACHE_DIR),  # not a hub/ dir: the container could not see it
        ({"HF_HOME": "/a", "HF_HUB_CACHE": "/b/hub"}, Path("/a")),
    ],
)
def test_hf_cache_dir_default_follows_huggingface_hub(environ: dict[str, str], expected: Path) -> None:
    """Unset hf_cache_dir: HF_HOME, else HF_HUB_CACHE's parent when it is a hub/ directory, else dankserve's."""
    assert default_hf_cache_dir(environ) == expected


def test_access_reads_endpoint_offline_and_cache(tmp_path: Path) -> None:
    """HF_ENDPOINT (trailing slash dropped), HF_HUB_OFFLINE, the hub/ cache and the facts dir."""
    access = hub_access(
        tmp_path / "hf", tmp_path / "state", "d", None, {"HF_ENDPOINT": "http://mirror/", "HF_HUB_OFFLINE": "1"}
    )
    assert access.endpoint == "http://mirror" and access.offline
    assert access.cache_dir == tmp_path / "hf" / "hub" and access.facts_dir == tmp_path / "state" / "model-facts"
    assert hub_access(tmp_path, tmp_path, "d", None, {}).endpoint == DEFAULT_ENDPOINT


@pytest.mark.parametrize(("value", "offline"), [("1", True), ("ON", True), ("yes", True), ("0", False), ("", False)])
def test_offline_mode_values(value: str, offline: bool) -> None:
    """HF_HUB_OFFLINE's truthy spellings, as huggingface_hub reads them."""
    assert offline_mode({"HF_HUB_OFFLINE": value}) is offline


def test_token_file_is_read_and_its_problems_are_config_errors(tmp_path: Path) -> None:
    """The token is stripped; a missing, empty or world-readable file is exit 2 naming the key."""
    token = tmp_path / "token"
    token.write_text("hf_abc\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="open to others"):
        read_token(token, "chat")
    token.chmod(0o600)
    assert read_token(token, "chat") == "hf_abc"
    assert read_token(None, "chat") is None
    with pytest.raises(ConfigError, match=r"deployments\.chat\.hf_token_file"):
        read_token(tmp_path / "absent", "chat")
    token.write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        read_token(token, "chat")


@pytest.mark.parametrize(
    ("model", "hub"), [("Qwen/Qwen3-8B", True), ("/models/q", False), ("./q", False), ("q", False), ("a/b/c", False)]
)
def test_hub_ids(model: str, hub: bool) -> None:
    """ORG/NAME is a Hub repo; paths and bare names are not."""
    assert is_hub_id(model) is hub
