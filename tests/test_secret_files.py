"""Secret files: one reader for every secret; an empty or whitespace-only key is no key."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.exitcodes import ExitCode
from dankserve.secret_files import read_key_now, read_secret


@pytest.fixture(autouse=True)
def private_files() -> Iterator[None]:
    """Files written here are 0600, as a secret file must be (others' access is tested on its own)."""
    before = os.umask(0o077)
    yield
    os.umask(before)


@pytest.mark.parametrize(("content", "value"), [(b"tok\n", b"tok"), (b"tok\r\n\n", b"tok"), (b" a b \n", b"a b")])
def test_surrounding_whitespace_is_not_part_of_the_secret(tmp_path: Path, content: bytes, value: bytes) -> None:
    """A secret file's surrounding whitespace and newlines are not part of the secret."""
    (tmp_path / "s").write_bytes(content)
    assert read_secret(tmp_path / "s", "api_key") == value


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), (b"\n", "is empty"), (b"", "is empty"), (b"   \t \n", "only whitespace")],
)
def test_missing_empty_or_blank_secret_is_refused(tmp_path: Path, content: bytes | None, message: str) -> None:
    """A missing, empty or whitespace-only secret file is an exit-2 error naming the secret and the file."""
    if content is not None:
        (tmp_path / "s").write_bytes(content)
    with pytest.raises(ConfigError) as info:
        read_secret(tmp_path / "s", "api_key")
    assert message in info.value.message and str(tmp_path / "s") in info.value.message
    assert "api_key" in info.value.message and info.value.exit_code == ExitCode.INVALID_INPUT


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named as a secret file is refused at once (reading it would block forever)."""
    os.mkfifo(tmp_path / "s")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret(tmp_path / "s", "api_key")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """A directory named as a secret file is refused as not a regular file."""
    with pytest.raises(ConfigError, match="not a regular file"):
        read_secret(tmp_path, "api_key")


def test_a_key_read_while_running_is_none_when_it_cannot_be_read_now(tmp_path: Path) -> None:
    """read_key_now: the key as read_secret reads it; none set, missing, empty or a FIFO is no key (never blocks)."""
    (tmp_path / "k").write_bytes(b" k3y \n")
    (tmp_path / "empty").write_bytes(b"\n")
    os.mkfifo(tmp_path / "fifo")
    assert read_key_now(tmp_path / "k") == "k3y"
    assert read_key_now(None) is None
    assert read_key_now(tmp_path / "absent") is None
    assert read_key_now(tmp_path / "empty") is None
    assert read_key_now(tmp_path / "fifo") is None
