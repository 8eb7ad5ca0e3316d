"""Tests for dankserve.gateway.keys_dir: keys_dir read as an attacker would fill it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.gateway.keys import MAX_KEYS
from dankserve.gateway.keys_dir import read_keys

SECRET = "sk-0123456789abcdef"


def keys_dir(tmp_path: Path, **files: str) -> Path:
    directory = tmp_path / "keys"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, text in files.items():
        path = directory / f"{name}.toml"
        path.write_text(text)
        path.chmod(0o600)
    return directory


def test_keys_dir_and_api_key_file_make_one_ring(tmp_path: Path) -> None:
    """Each NAME.toml is the key NAME; api_key_file is `default`; dot files are skipped."""
    directory = keys_dir(tmp_path, alice=f'key = "{SECRET}-a"\nmodels = ["qwen*"]', bob=f'key = "{SECRET}-b"')
    (directory / ".alice.toml.swp").write_text("junk")
    single = tmp_path / "gateway.key"
    single.write_text(SECRET + "\n")
    single.chmod(0o600)
    ring = read_keys(directory, single)
    assert [(k.name, k.models) for k in ring.keys] == [("default", ("*",)), ("alice", ("qwen*",)), ("bob", ("*",))]
    assert ring.identify(SECRET + "-b").name == "bob"  # type: ignore[union-attr]


def test_an_empty_keys_dir_lets_no_one_in(tmp_path: Path) -> None:
    """A keys_dir without key files still asks for a key (none matches), never opens the gateway."""
    ring = read_keys(keys_dir(tmp_path), None)
    assert ring.required and ring.keys == ()


@pytest.mark.parametrize("mode", [0o770, 0o722, 0o777])
def test_a_keys_dir_others_may_write_is_refused(tmp_path: Path, mode: int) -> None:
    """Group- or world-writable keys_dir: exit 2 naming the mode and the fix."""
    directory = keys_dir(tmp_path, alice=f'key = "{SECRET}"')
    directory.chmod(mode)
    with pytest.raises(ConfigError, match="writable by others") as info:
        read_keys(directory, None)
    assert "chmod 700" in (info.value.fix or "")


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_key_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    """A key file its group or others may read or write: refused with the path."""
    directory = keys_dir(tmp_path, alice=f'key = "{SECRET}"')
    (directory / "alice.toml").chmod(mode)
    with pytest.raises(ConfigError, match=r"alice\.toml is open to its group or others"):
        read_keys(directory, None)


def test_wrong_owners_are_refused(tmp_path: Path) -> None:
    """A directory or key file owned by another user (not root, not us): refused."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    directory = keys_dir(tmp_path, alice=f'key = "{SECRET}"')
    os.chown(directory / "alice.toml", 4242, 4242)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        read_keys(directory, None)
    os.chown(directory / "alice.toml", 0, 0)
    os.chown(directory, 4242, 4242)
    with pytest.raises(ConfigError, match="owned by uid 4242"):
        read_keys(directory, None)


def test_symlinks_are_refused(tmp_path: Path) -> None:
    """A symlinked key file, or keys_dir itself a symlink: refused, nothing read through them."""
    directory = keys_dir(tmp_path)
    target = tmp_path / "elsewhere.toml"
    target.write_text(f'key = "{SECRET}"')
    target.chmod(0o600)
    (directory / "mallory.toml").symlink_to(target)
    with pytest.raises(ConfigError, match="is a symlink"):
        read_keys(directory, None)
    (directory / "mallory.toml").unlink()
    link = tmp_path / "link"
    link.symlink_to(directory)
    with pytest.raises(ConfigError, match="is a symlink"):
        read_keys(link, None)


def test_hostile_contents_are_refused_with_the_file_named(tmp_path: Path) -> None:
    """Huge, not UTF-8, NUL bytes, a bad name, a FIFO: each a ConfigError naming the file."""
    directory = keys_dir(tmp_path)
    cases = {
        "huge.toml": b'key = "' + b"x" * 100_000 + b'"',
        "latin.toml": b'key = "\xe9\xe9\xe9"',
        "nul.toml": b'key = "sk-0123456789\x00abcdef"',
        "Upper.toml": f'key = "{SECRET}"'.encode(),
    }
    for name, data in cases.items():
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600)
        with pytest.raises(ConfigError) as info:
            read_keys(directory, None)
        assert name in info.value.message
        path.unlink()
    os.mkfifo(directory / "fifo.toml", 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_keys(directory, None)


def test_too_many_keys_are_refused(tmp_path: Path) -> None:
    """More than MAX_KEYS key files: refused before any is read."""
    directory = keys_dir(tmp_path)
    for index in range(MAX_KEYS + 1):
        (directory / f"k{index}.toml").touch(mode=0o600)
    with pytest.raises(ConfigError, match=f"at most {MAX_KEYS}"):
        read_keys(directory, None)


def test_duplicates_and_the_default_name_are_refused(tmp_path: Path) -> None:
    """Two files with one secret, or default.toml beside api_key_file: refused."""
    directory = keys_dir(tmp_path, a=f'key = "{SECRET}"', b=f'key = "{SECRET}"')
    with pytest.raises(ConfigError, match="same secret"):
        read_keys(directory, None)
    directory = keys_dir(tmp_path / "x", default=f'key = "{SECRET}-d"')
    single = tmp_path / "single.key"
    single.write_text(SECRET)
    single.chmod(0o600)
    with pytest.raises(ConfigError, match=r"default\.toml"):
        read_keys(directory, single)


def test_key_file_is_checked_like_a_secret_file(tmp_path: Path) -> None:
    """key_file must be a safe secret file: others may not read it."""
    secret = tmp_path / "alice.secret"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    directory = keys_dir(tmp_path, alice=f'key_file = "{secret}"')
    with pytest.raises(ConfigError, match="open to others"):
        read_keys(directory, None)
    secret.chmod(0o600)
    assert read_keys(directory, None).keys[0].secret == SECRET
