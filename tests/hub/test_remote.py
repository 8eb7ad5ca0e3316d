"""Tests for dankserve.hub.remote: model facts from the stand-in Hub through the real huggingface_hub client."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dankserve.errors import HubUnreachable, ModelAccessDenied, ModelNotFound
from dankserve.hub.access import HubAccess, hub_access
from dankserve.hub.remote import cached_or_fetch, fetch, read_cached
from dankserve.testing.hub import StandInHub
from tests.harness.hub import QWEN3_8B_PARAMETERS, QWEN3_30B_PARAMETERS


def access(hub_url: str, tmp_path: Path, token_file: Path | None = None, offline: bool = False) -> HubAccess:
    env = {"HF_ENDPOINT": hub_url, **({"HF_HUB_OFFLINE": "1"} if offline else {})}
    return hub_access(tmp_path / "hf", tmp_path / "state", "chat", token_file, env)


def test_reads_config_and_safetensors_headers(hub: StandInHub, tmp_path: Path) -> None:
    """config.json and the parameter count from the shards' headers (Range requests), no weights fetched."""
    before = len(hub.requests)
    found = fetch(access(hub.url, tmp_path), "Qwen/Qwen3-30B-A3B", None)
    assert found.parameter_bytes == 2 * QWEN3_30B_PARAMETERS
    assert found.config["num_experts"] == 128
    weights = [r for r in hub.requests[before:] if r.path.startswith("/cdn/")]
    assert weights and all(r.range is not None and r.range.startswith("bytes=0-") for r in weights)
    assert not (tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-30B-A3B").exists()  # the HF cache stays untouched


def test_facts_are_kept_under_the_state_dir(hub: StandInHub, tmp_path: Path) -> None:
    """A second lookup reads the state dir's record: not one request to the Hub."""
    a = access(hub.url, tmp_path)
    first = cached_or_fetch(a, "Qwen/Qwen3-8B", None)
    assert first.parameter_bytes == 2 * QWEN3_8B_PARAMETERS
    assert list((tmp_path / "state" / "model-facts").glob("*.json"))
    before = len(hub.requests)
    assert cached_or_fetch(a, "Qwen/Qwen3-8B", None) == first
    assert len(hub.requests) == before


def test_revision_is_its_own_record(hub: StandInHub, tmp_path: Path) -> None:
    """A tag resolves to its commit; the record for main does not answer for the tag."""
    a = access(hub.url, tmp_path)
    tagged = fetch(a, "org/tagged", "v1.0")
    assert tagged.commit == hub.repos["org/tagged"].commit
    assert read_cached(a, "org/tagged", None) is None


def test_gated_model_without_token_exits_2_naming_the_fix(hub: StandInHub, tmp_path: Path) -> None:
    """A gated repo without a token: exit 2, the model, and how to get access (licence + hf_token_file)."""
    with pytest.raises(ModelAccessDenied) as error:
        fetch(access(hub.url, tmp_path), "org/gated", None)
    assert error.value.exit_code == 2
    assert "org/gated" in error.value.message and "gated" in error.value.message
    assert error.value.fix is not None and "hf_token_file" in error.value.fix


def test_gated_model_with_its_token_is_read(hub: StandInHub, tmp_path: Path) -> None:
    """hf_token_file's token is sent as the Bearer token: the gated repo answers."""
    token = tmp_path / "token"
    token.write_text(hub.token + "\n")
    token.chmod(0o600)
    found = fetch(access(hub.url, tmp_path, token_file=token), "org/gated", None)
    assert found.parameter_bytes is not None


@pytest.mark.parametrize(
    ("model", "revision", "says"),
    [("org/absent", None, "no model 'org/absent'"), ("Qwen/Qwen3-8B", "no-such-tag", "no revision 'no-such-tag'")],
)
def test_unknown_model_or_revision_exits_2(
    hub: StandInHub, tmp_path: Path, model: str, revision: str | None, says: str
) -> None:
    """An unknown repo or revision: exit 2, naming it."""
    with pytest.raises(ModelNotFound) as error:
        fetch(access(hub.url, tmp_path), model, revision)
    assert error.value.exit_code == 2 and says in error.value.message


def test_offline_mode_with_nothing_cached_exits_3(hub: StandInHub, tmp_path: Path) -> None:
    """HF_HUB_OFFLINE and no record: exit 3 before any request, naming the model and the fix."""
    before = len(hub.requests)
    with pytest.raises(HubUnreachable) as error:
        cached_or_fetch(access(hub.url, tmp_path, offline=True), "Qwen/Qwen3-8B", None)
    assert error.value.exit_code == 3 and "Qwen/Qwen3-8B" in error.value.message
    assert len(hub.requests) == before


def test_offline_mode_uses_the_kept_facts(hub: StandInHub, tmp_path: Path) -> None:
    """Facts fetched once serve later plans with HF_HUB_OFFLINE set."""
    cached_or_fetch(access(hub.url, tmp_path), "o/a", None)
    assert cached_or_fetch(access(hub.url, tmp_path, offline=True), "o/a", None).model == "o/a"


def test_no_hub_answering_exits_3(tmp_path: Path) -> None:
    """A Hub endpoint where nothing listens: exit 3 naming the endpoint and the model."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(HubUnreachable) as error:
        fetch(access(url, tmp_path), "Qwen/Qwen3-8B", None)
    assert url in error.value.message and "Qwen/Qwen3-8B" in error.value.message
