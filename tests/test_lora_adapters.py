"""Tests for dankserve.lora_adapters and the settings that use it: adapter names and sources."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dankserve.lora_adapters import AdapterSource, name_problem, parse_source
from dankserve.settings import DeploymentSettings, Settings


def test_sources_are_a_directory_or_a_hub_repo() -> None:
    """An absolute directory is a path, ORG/NAME a Hub repo."""
    assert parse_source("a", "/srv/loras/sql/") == AdapterSource("path", "/srv/loras/sql")
    assert parse_source("a", "org/sql-lora") == AdapterSource("hub", "org/sql-lora")


@pytest.mark.parametrize(
    "value",
    ["relative/dir/x", "./here", "/srv/a=b", "/srv/a,b", "org/x,y", "/srv/../etc", "org/..", "", "x" * 2000, "a\nb"],
)
def test_hostile_sources_are_refused(value: str) -> None:
    """Relative paths, '=' or ',' (vLLM would split them), '..', control characters and huge values are refused."""
    with pytest.raises(ValueError, match=r"adapters\.a"):
        parse_source("a", value)


@pytest.mark.parametrize("name", ["", "-flag", "a b", "a=b", "a,b", "x" * 200, "ünï"])
def test_names_that_cannot_be_served_are_refused(name: str) -> None:
    """An adapter's name is a model name: plain characters, no '=' or ','."""
    assert name_problem(name) is not None


def test_a_deployment_validates_its_adapters() -> None:
    """The settings refuse a bad name, a bad source and a name the deployment itself answers to."""
    DeploymentSettings(model="org/base", adapters={"sql": "org/sql-lora", "mine": "/srv/mine"})
    with pytest.raises(ValidationError, match="not a plain model name"):
        DeploymentSettings(model="org/base", adapters={"a b": "org/x"})
    with pytest.raises(ValidationError, match="neither an absolute directory"):
        DeploymentSettings(model="org/base", adapters={"sql": "sql"})
    with pytest.raises(ValidationError, match="the deployment itself answers to"):
        DeploymentSettings(model="org/base", aliases=["fast"], adapters={"fast": "org/x"})
    with pytest.raises(ValidationError, match="multi-host"):
        DeploymentSettings(model="org/base", hosts=["gpu2:7390"], adapters={"a": "org/x"})
    with pytest.raises(ValidationError, match="at most 64"):
        DeploymentSettings(model="org/base", adapters={f"a{i}": "org/x" for i in range(65)})


def test_adapter_names_collide_with_other_deployments_at_the_gateway() -> None:
    """Behind the gateway an adapter's name may not be another deployment's name, alias or adapter."""
    deployments = {
        "a": {"model": "org/a", "port": 8001, "aliases": ["chat"]},
        "b": {"model": "org/b", "port": 8002, "adapters": {"chat": "org/chat-lora"}},
    }
    with pytest.raises(ValidationError, match=r"both answer to model 'chat'.*adapter name"):
        Settings(gateway={"listen": "127.0.0.1:9000"}, deployments=deployments)
