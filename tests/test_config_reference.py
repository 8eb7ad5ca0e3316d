"""Tests for dankserve.config_reference."""

from pathlib import Path

from dankserve.config_reference import render_reference
from dankserve.settings import DeploymentSettings, Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md"


def test_committed_reference_is_current() -> None:
    """docs/CONFIGURATION.md matches the settings model (run `make docs` when this fails)."""
    assert DOC.read_text() == render_reference()


def test_every_key_is_documented() -> None:
    """Every global and deployment key appears in the reference."""
    text = render_reference()
    for name in [*Settings.model_fields, *DeploymentSettings.model_fields]:
        if name != "deployments":
            assert f"`{name}`" in text
