"""Tests for `dankserve usage`: the gateway's counters file read by the real CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

from dankserve.cli.usage import render_table
from dankserve.gateway.usage import Usage, usage_rows
from dankserve.gateway.usage_store import usage_path, write_usage
from tests.harness.cli import dankserve_cli


def config_with_state(tmp_path: Path) -> tuple[Path, Path]:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    config = tmp_path / "dankserve.toml"
    config.write_text(f'state_dir = "{state}"\n')
    config.chmod(0o600)
    return config, state


def counters(now: float) -> Usage:
    usage = Usage()
    usage.record(("alice", "qwen"), 200, prompt=10, completion=20, estimated=False, now=now - 3 * 86400)
    usage.record(("alice", "qwen"), 200, prompt=1, completion=2, estimated=False, now=now)
    usage.record(("bob", "qwen"), 429, prompt=0, completion=0, estimated=False, now=now)
    usage.record(("-", "-"), 401, prompt=0, completion=0, estimated=False, now=now)
    return usage


def test_usage_shows_keys_and_models_with_since_and_json(tmp_path: Path) -> None:
    """The table has a row per key and model and a total; --since 1h drops the old hour; --json has the rows."""
    config, state = config_with_state(tmp_path)
    write_usage(usage_path(state), counters(time.time()).to_json())
    shown = dankserve_cli(config, "usage")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split()[:3] == ["KEY", "MODEL", "REQUESTS"]
    assert lines[2].split() == ["alice", "qwen", "2", "2", "0", "0", "11", "22"]
    assert lines[-1].split() == ["total", "4", "2", "2", "0", "11", "22"]
    recent = json.loads(dankserve_cli(config, "usage", "--since", "1h", "--json").stdout)
    alice = next(r for r in recent["rows"] if r["key"] == "alice")
    assert alice["requests"] == 1 and alice["prompt_tokens"] == 1 and recent["since"] is not None
    assert {r["key"]: r["codes"] for r in recent["rows"]}["bob"] == {"429": 1}


def test_usage_without_counters_and_with_a_corrupt_file(tmp_path: Path) -> None:
    """No file yet: a sentence, exit 0; a corrupt file: exit 3 naming it, no traceback; a bad --since: exit 2."""
    config, state = config_with_state(tmp_path)
    empty = dankserve_cli(config, "usage")
    assert empty.returncode == 0 and "no requests counted" in empty.stdout
    usage_path(state).write_text("{nope")
    broken = dankserve_cli(config, "usage")
    assert broken.returncode == 3 and "gateway-usage.json" in broken.stderr and "Traceback" not in broken.stderr
    assert dankserve_cli(config, "usage", "--since", "whenever").returncode == 2


def test_render_marks_estimated_tokens() -> None:
    """Completion tokens counted from stream events are said to be so."""
    usage = Usage()
    usage.record(("a", "m"), 200, prompt=0, completion=5, estimated=True, now=0.0)
    assert "5 completion tokens counted from stream events" in render_table(usage_rows(usage.since(None)))
