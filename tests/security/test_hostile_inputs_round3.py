"""Issue 38.12: hostile inputs the gateway, its usage file and the LoRA planner must survive.

A key file of TOML nested 3000 deep (it escaped as a RecursionError: a reload said "internal error"),
a usage file that is a directory (the gateway, and so the daemon, did not start), usage counters at
2^62 (the next save wrote a file the reader refused, so every count was lost), `lora_alpha` NaN or
infinite (vLLM scales every delta by it: garbage served without an error). The unquoted ExecStart=
path is tests/security/test_unit_code.py's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from dankserve.errors import ConfigError
from dankserve.gateway.keys_dir import read_keys
from dankserve.gateway.usage import Usage
from dankserve.gateway.usage_store import load_usage, read_usage, write_usage
from dankserve.plan.lora import AdapterConfigError, parse_adapter_config
from tests.harness.daemon import free_port, process_deployment, running_daemon

NESTED = "x = " + "[" * 3000 + "]" * 3000 + "\n"
MAX_COUNT = (1 << 62) - 1
"""The counters' ceiling (the usage file holds counts below 2^62)."""
ALICE = "sk-alice-0123456789abcdef"


def _keys(tmp_path: Path) -> Path:
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    (keys / "alice.toml").write_text(f'key = "{ALICE}"\n')
    (keys / "alice.toml").chmod(0o600)
    return keys


def test_a_key_file_nested_3000_deep_is_a_config_error(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    (keys / "deep.toml").write_text(NESTED)
    (keys / "deep.toml").chmod(0o600)
    with pytest.raises(ConfigError, match=r"deep\.toml: nests arrays or tables too deeply"):
        read_keys(keys, None)


def test_the_daemon_survives_a_nested_key_file_on_reload_and_a_usage_file_that_is_a_directory(tmp_path: Path) -> None:
    gateway_port = free_port()
    keys = _keys(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "gateway-usage.json").mkdir()  # someone (or a bad restore) left a directory in its place
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny-chat", gpus=[0])}
    gateway = {"listen": f"127.0.0.1:{gateway_port}", "keys_dir": str(keys)}
    url = f"http://127.0.0.1:{gateway_port}/v1/models"
    with running_daemon(tmp_path, deployments, extra_globals={"gateway": gateway}) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        assert httpx.get(url, headers={"Authorization": f"Bearer {ALICE}"}, timeout=10).status_code == 200
        assert daemon.events_named("gateway_usage_unreadable"), daemon.log_tail()
        (keys / "deep.toml").write_text(NESTED)
        (keys / "deep.toml").chmod(0o600)
        refused = daemon.cli("reload")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "deep.toml" in refused.stderr and "nests" in refused.stderr and "internal error" not in refused.stderr
        chat = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        answer = httpx.post(
            url.removesuffix("models") + "chat/completions",
            json=chat,
            headers={"Authorization": f"Bearer {ALICE}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
    assert (state / "gateway-usage.json.corrupt").is_dir()
    assert read_usage(state / "gateway-usage.json").since(None)[("alice", "tiny-chat")].requests == {200: 1}


def test_counters_at_2_62_saturate_and_the_file_stays_readable(tmp_path: Path) -> None:
    """A backend's usage is hostile input: 2^62 tokens twice (and a negative count) must not cost the file."""
    usage = Usage()
    usage.record(("bob", "m"), 200, prompt=1, completion=2, estimated=False, now=0)
    for _ in range(2):
        usage.record(("alice", "m"), 200, prompt=1 << 62, completion=1 << 62, estimated=True, now=0)
    usage.record(("alice", "m"), 200, prompt=-(1 << 62), completion=0, estimated=False, now=0)
    path = tmp_path / "gateway-usage.json"
    write_usage(path, usage.to_json())
    again = load_usage(path)
    assert not (tmp_path / "gateway-usage.json.corrupt").exists()
    totals = again.since(None)
    assert totals[("alice", "m")].prompt_tokens == MAX_COUNT == totals[("alice", "m")].completion_tokens
    assert totals[("bob", "m")].completion_tokens == 2


@pytest.mark.parametrize("alpha", ["NaN", "Infinity", "-Infinity", "1e400", "0", "-16", "1e9"])
def test_lora_alpha_that_is_not_a_sane_number_is_refused(alpha: str) -> None:
    raw = f'{{"r": 8, "lora_alpha": {alpha}, "target_modules": ["q_proj"]}}'.encode()
    with pytest.raises(AdapterConfigError, match="sql: "):
        parse_adapter_config("sql", raw)


def test_nan_anywhere_in_adapter_config_is_refused_and_a_sane_alpha_passes() -> None:
    raw = json.dumps({"r": 8, "lora_alpha": 16.0, "target_modules": ["q_proj"]}).encode()
    assert parse_adapter_config("sql", raw) == (8, ("q_proj",))
    with pytest.raises(AdapterConfigError, match="not JSON"):
        parse_adapter_config("sql", b'{"r": 8, "lora_alpha": 16, "target_modules": ["q"], "lora_dropout": NaN}')
