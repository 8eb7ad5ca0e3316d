"""The stand-in's copy of vLLM's driver-to-Ray-worker environment rule (vllm/ray/ray_env.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

STANDIN = Path(__file__).resolve().parents[2] / "containers" / "fake-vllm"
sys.path.insert(0, str(STANDIN))
from fake_vllm.ray_leader import carried_env, rank_order  # noqa: E402


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        (None, {"VLLM_CACHE_ROOT": "/leader/cache", "VLLM_X": "1"}),  # no file: every VLLM_* is copied
        (["VLLM_CACHE_ROOT"], {"VLLM_X": "1"}),  # listed: the worker keeps its own node's value
    ],
)
def test_carried_env(tmp_path: Path, listed: list[str] | None, expected: dict[str, str]) -> None:
    """VLLM_* variables reach the workers except worker-specific ones and those in the non-carry-over file."""
    if listed is not None:
        (tmp_path / "ray_non_carry_over_env_vars.json").write_text(json.dumps(listed))
    env = {
        "VLLM_CACHE_ROOT": "/leader/cache",
        "VLLM_X": "1",
        "VLLM_HOST_IP": "10.0.0.1",
        "PATH": "/bin",
        "VLLM_CONFIG_ROOT": str(tmp_path),
    }
    assert carried_env(env) == {**expected, "VLLM_CONFIG_ROOT": str(tmp_path)}


@pytest.mark.parametrize(
    ("ips", "expected"),
    [
        (["10.0.0.3", "10.0.0.1", "10.0.0.2", "10.0.0.1"], [1, 3, 2, 0]),
        (["10.0.0.1", "10.0.0.1"], [0, 1]),
    ],
)
def test_rank_order(ips: list[str], expected: list[int]) -> None:
    """Ranks go to the driver's node first, then by node IP, whatever order the placement group gave."""
    assert rank_order(ips, "10.0.0.1") == expected
