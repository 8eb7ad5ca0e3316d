"""Tests for dankserve.settings."""

from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.settings import load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dankserve.toml"
    path.write_text(text)
    return path


def test_absent_default_file_means_no_deployments(tmp_path: Path) -> None:
    """Without a config file the settings load with defaults and no deployments."""
    settings = load_settings(None, environ={})
    assert settings.deployments == {} or isinstance(settings.deployments, dict)


def test_named_missing_file_is_invalid_input(tmp_path: Path) -> None:
    """A config file named explicitly but absent is an error naming the path."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_unknown_key_names_key_and_value(tmp_path: Path) -> None:
    """An unknown key is rejected with the file, the key and its value."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "m"\nflavour = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "deployments.chat.flavour" in info.value.message
    assert str(path) in info.value.message


def test_two_deployments_on_one_port_are_invalid(tmp_path: Path) -> None:
    """Two deployments on the same port are rejected, naming both."""
    path = write(tmp_path, '[deployments.a]\nmodel = "m"\n[deployments.b]\nmodel = "n"\n')
    with pytest.raises(ConfigError, match="both use port 8000"):
        load_settings(path, environ={})


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DANKSERVE_* variables override the file's values."""
    path = write(tmp_path, 'podman_url = "unix:///file.sock"\n')
    monkeypatch.setenv("DANKSERVE_PODMAN_URL", "unix:///env.sock")
    assert load_settings(path).podman_url == "unix:///env.sock"


def test_bad_toml_is_invalid_input(tmp_path: Path) -> None:
    """A file that is not TOML is an error naming the file."""
    path = write(tmp_path, "deployments = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path, environ={})
