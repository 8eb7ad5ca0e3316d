"""Issue 38.6: secret files another local user owns, or can swap on their way, are refused.

A gateway `key_file` used to be checked with stat() and then opened by path, with no directory on its
way checked: a user owning that directory could swap their own key in between (accepted after a few
reloads). Deployment secrets were checked for their mode, not their owner. Now every secret file is
opened once, its descriptor checked (owner, mode) and every directory on its way, as the config is."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.gateway.keys_dir import read_keys
from tests.harness.cli import plan_chat
from tests.harness.users import LocalUser, unprivileged_user

KEY = "sk-root-0123456789abcdef"
ATTACKER_KEY = "sk-mine-0123456789abcdef"


@pytest.fixture
def place() -> Iterator[Path]:
    """A root-owned 0755 directory the other user can reach (pytest's own tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="dankserve-owners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _private_dir(path: Path, owner: int = 0) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, owner, -1)
    return path


def _secret(path: Path, value: str, owner: int = 0) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    os.chown(path, owner, -1)
    return path


def _as(user: LocalUser, *command: str) -> None:
    subprocess.run(user.argv(command), check=True, capture_output=True, timeout=30)


def test_a_key_file_in_a_directory_another_user_owns_is_refused(place: Path) -> None:
    """Root's own key file, but in a directory the attacker owns: they can swap it for theirs at will."""
    user = unprivileged_user()
    keys = _private_dir(place / "keys")
    theirs = _private_dir(place / "theirs", owner=user.uid)
    secret = _secret(theirs / "alice.secret", KEY)
    (keys / "alice.toml").write_text(f'key_file = "{secret}"\n')
    (keys / "alice.toml").chmod(0o600)
    with pytest.raises(ConfigError) as refused:
        read_keys(keys, None)
    assert f"{theirs} on its way is owned by uid {user.uid}" in refused.value.message
    assert f"chown root {theirs}" in (refused.value.fix or "")

    # What the directory lets them do: their own key in place of root's, owned by them, mode 0600.
    _as(user, "mv", str(secret), str(theirs / "moved"))
    _as(user, "sh", "-c", f"umask 077 && echo {ATTACKER_KEY} > {secret}")
    with pytest.raises(ConfigError, match=f"is owned by uid {user.uid}"):
        read_keys(keys, None)


def test_a_key_file_the_attacker_owns_is_refused_in_a_root_directory(tmp_path: Path) -> None:
    user = unprivileged_user()
    keys = _private_dir(tmp_path / "keys")
    secret = _secret(tmp_path / "alice.secret", ATTACKER_KEY, owner=user.uid)
    (keys / "alice.toml").write_text(f'key_file = "{secret}"\n')
    (keys / "alice.toml").chmod(0o600)
    with pytest.raises(ConfigError, match=f"is owned by uid {user.uid}"):
        read_keys(keys, None)


def test_a_keys_dir_below_a_directory_another_user_owns_is_refused(place: Path) -> None:
    """keys_dir itself is root's, mode 0700, but its parent is the attacker's: they can rename it away and
    put a directory of their own keys in its place."""
    user = unprivileged_user()
    theirs = _private_dir(place / "theirs", owner=user.uid)
    theirs.chmod(0o755)
    keys = _private_dir(theirs / "keys")
    _secret(keys / "alice.toml", f'key = "{KEY}"')
    with pytest.raises(ConfigError, match=f"{theirs} on its way is owned by uid {user.uid}"):
        read_keys(keys, None)


@pytest.mark.parametrize("key", ["api_key_file", "hf_token_file"])
def test_a_deployment_secret_another_user_owns_is_refused_by_the_cli(tmp_path: Path, key: str) -> None:
    """A deployment's secret owned by another user (mode 0600, so the mode alone passed): they choose the
    key the server runs with, or read the token. `dankserve plan` and the daemon refuse it, exit 2."""
    user = unprivileged_user()
    secret = _secret(tmp_path / "secret", "sk-theirs-0123456789abcdef", owner=user.uid)
    done = plan_chat(tmp_path, f'{key} = "{secret}"')
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"deployments.chat.{key}" in done.stderr and f"is owned by uid {user.uid}" in done.stderr
    assert "Traceback" not in done.stderr and "sk-theirs" not in done.stdout + done.stderr


def test_a_deployment_secret_in_a_directory_another_user_owns_is_refused_by_the_cli(
    tmp_path: Path, place: Path
) -> None:
    user = unprivileged_user()
    theirs = _private_dir(place / "theirs", owner=user.uid)
    secret = _secret(theirs / "api.key", KEY)
    done = plan_chat(tmp_path, f'api_key_file = "{secret}"')
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{theirs} on its way is owned by uid {user.uid}" in done.stderr, done.stderr
