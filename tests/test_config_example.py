"""Tests for config/dankserve.toml, the commented example of every settings key."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from dankserve.settings import (
    ClusterSettings,
    CpuOffloadSettings,
    DeploymentSettings,
    GatewaySettings,
    ModelFactsSettings,
    Settings,
    SpeculativeSettings,
    load_settings,
)
from dankserve.settings.upgrade import UpgradeSettings

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "dankserve.toml"


def test_example_loads() -> None:
    """The example is valid: it loads with its four seed deployments on distinct ports."""
    settings = load_settings(EXAMPLE, environ={})
    assert set(settings.deployments) == {"qwen3-30b", "qwen3-30b-fp8", "llama-70b", "qwen36-dflash"}
    assert [name for name, d in settings.deployments.items() if d.enabled] == ["qwen3-30b"]


def test_example_shows_every_key() -> None:
    """Every settings field (global, per deployment, and nested tables) appears as a key in the example."""
    text = EXAMPLE.read_text()
    sections: list[tuple[str, type[BaseModel]]] = [
        ("global", Settings),
        ("deployment", DeploymentSettings),
        ("speculative", SpeculativeSettings),
        ("cpu_offload", CpuOffloadSettings),
        ("model_facts", ModelFactsSettings),
        ("cluster", ClusterSettings),
        ("gateway", GatewaySettings),
        ("upgrade", UpgradeSettings),
    ]
    missing = []
    for section, model in sections:
        for name in model.model_fields:
            as_key = re.search(rf"^#? ?{name} = ", text, re.MULTILINE)
            as_section = re.search(rf"^#? ?\[{name}\]", text, re.MULTILINE)
            as_table = re.search(rf"^#? ?\[deployments\.[\w-]+\.{name}\]", text, re.MULTILINE)
            as_tables = name == "deployments" and "[deployments." in text
            if not (as_key or as_table or as_tables or as_section):
                missing.append(f"{section}.{name}")
    assert missing == []
