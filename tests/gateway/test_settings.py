"""Tests for the [gateway] settings: exposure needs a key, names are unique, servers stay on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.settings import load_settings


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dankserve.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_gateway_is_off_without_the_table_and_loopback_by_default(tmp_path: Path) -> None:
    """No [gateway]: none; an empty [gateway] listens on 127.0.0.1:9000."""
    assert load_settings(write(tmp_path, ""), environ={}).gateway is None
    gateway = load_settings(write(tmp_path, "[gateway]\n"), environ={}).gateway
    assert gateway is not None and gateway.listen == "127.0.0.1:9000"


def test_exposed_gateway_without_key_is_refused(tmp_path: Path) -> None:
    """listen beyond loopback without api_key_file: exit 2 naming the key and the fix."""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, '[gateway]\nlisten = "0.0.0.0:9000"\n'), environ={})
    assert "listen = '0.0.0.0:9000'" in info.value.message and "api_key_file" in info.value.message


def test_exposed_gateway_with_key_loads_and_an_open_key_file_is_refused(tmp_path: Path) -> None:
    """With a 0600 key file an exposed gateway loads; a world-readable one is refused."""
    key = tmp_path / "gateway.key"
    key.write_text("k" * 32)
    key.chmod(0o644)
    path = write(tmp_path, f'[gateway]\nlisten = "0.0.0.0:9000"\napi_key_file = "{key}"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "gateway.api_key_file" in info.value.message
    key.chmod(0o600)
    assert load_settings(path, environ={}).gateway is not None


@pytest.mark.parametrize(
    ("tables", "named"),
    [
        ('[deployments.a]\nmodel = "m"\n[deployments.b]\nmodel = "m"\nport = 8001\n', "both answer to model 'm'"),
        (
            '[deployments.a]\nmodel = "x"\naliases = ["m"]\n[deployments.b]\nmodel = "m"\nport = 8001\n',
            "both answer to model 'm'",
        ),
        ('[deployments.a]\nmodel = "m"\nport = 9000\n', "deployments.a.port = 9000 is the gateway's port"),
        ('[deployments.a]\nmodel = "m"\nhost = "0.0.0.0"\napi_key_file = "/k"\n', "listens on loopback only"),
        ('[gateway]\nlisten = "nowhere"\n', "is not ADDRESS:PORT"),
    ],
)
def test_gateway_conflicts_are_refused(tmp_path: Path, tables: str, named: str) -> None:
    """Clashing model names, the gateway's own port, and a server off loopback behind it: exit 2."""
    text = tables if tables.startswith("[gateway]") else "[gateway]\n" + tables
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), environ={})
    assert named in info.value.message


def test_an_empty_or_missing_gateway_key_file_is_a_config_error(tmp_path: Path) -> None:
    """An empty key file would be no key at all: exit 2 naming the file; a missing one likewise."""
    from dankserve.gateway.keys_dir import read_keys

    empty = tmp_path / "empty.key"
    empty.write_text("  \n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="empty or holds only whitespace"):
        read_keys(None, empty)
    with pytest.raises(ConfigError, match="cannot read"):
        read_keys(None, tmp_path / "absent.key")
    good = tmp_path / "good.key"
    good.write_text("k3y\n")
    good.chmod(0o600)
    ring = read_keys(None, good)
    assert [(k.name, k.secret) for k in ring.keys] == [("default", "k3y")]


def test_cluster_without_tls_names_the_script(tmp_path: Path) -> None:
    """A [cluster] table from before TLS: exit 2 naming each missing file and how to make them."""
    path = write(tmp_path, '[cluster]\nlisten = "10.0.0.1:7390"\ntoken_file = "/t"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        assert f"cluster.{key} is required" in info.value.message
    assert "scripts/cluster-certs.sh" in info.value.message


@pytest.mark.parametrize(
    "origin", ["https://chat.example.com/", "chat.example.com", "ftp://x.example", "https://a.example/app"]
)
def test_allowed_origins_takes_origins_only(tmp_path: Path, origin: str) -> None:
    """allowed_origins takes scheme://host[:port] or "*" (what a browser's Origin header holds); anything else
    is refused naming the value and the form to write (issue 39 item 14)."""
    good = '["https://chat.example.com", "http://127.0.0.1:3000", "http://[::1]:8080", "*"]'
    gateway = load_settings(write(tmp_path, f"[gateway]\nallowed_origins = {good}\n"), environ={}).gateway
    assert gateway is not None and gateway.allowed_origins[0] == "https://chat.example.com"
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, f'[gateway]\nallowed_origins = ["{origin}"]\n'), environ={})
    assert repr(origin) in info.value.message and "scheme://host[:port]" in info.value.message
