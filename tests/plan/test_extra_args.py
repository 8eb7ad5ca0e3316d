"""Tests for dankserve.plan.extra_args: turning setting-backed flags of extra_args into settings."""

from __future__ import annotations

import pytest

from dankserve.errors import ConfigError
from dankserve.plan.extra_args import absorb
from dankserve.settings import DeploymentSettings


def test_absorb_moves_setting_flags_and_keeps_the_rest() -> None:
    """Setting-backed flags become settings (checked like them); the others stay, verbatim."""
    dep = DeploymentSettings(model="m", extra_args=["-tp", "2", "--enable-prefix-caching", "--max-model-len=auto"])
    done = absorb(dep, "d")
    assert done.deployment.tensor_parallel_size == 2 and done.deployment.max_model_len == "auto"
    assert done.deployment.extra_args == ["--enable-prefix-caching"]
    assert {"--tensor-parallel-size", "--max-model-len"} <= done.replaced


@pytest.mark.parametrize("args", [["--max-num-seqs", "many"], ["--max-num-seqs"], ["--gpu-memory-utilization", "0"]])
def test_bad_values_are_exit_2(args: list[str]) -> None:
    """A value the setting would refuse (or none) is a config error naming extra_args."""
    with pytest.raises(ConfigError, match=r"deployments\.d\.extra_args"):
        absorb(DeploymentSettings(model="m", extra_args=args), "d")
