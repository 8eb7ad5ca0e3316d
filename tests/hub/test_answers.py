"""Tests for dankserve.hub.answers: what of a Hub's answer may become a path or a complete file."""

from __future__ import annotations

import pytest

from dankserve.errors import HubAnswerRefused
from dankserve.hub.answers import (
    checked_commit,
    commit_problem,
    etag_problem,
    expected_size,
    file_name_problem,
    sha256_problem,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("commit", [None, "main", "../../x", "/etc", COMMIT.upper(), COMMIT + "0", COMMIT[:-1]])
def test_only_40_lowercase_hex_digits_are_a_commit(commit: str | None) -> None:
    """Anything but 40 lowercase hex digits is refused as a snapshot directory name."""
    assert commit_problem(commit, None) is not None


def test_a_commit_asked_for_must_be_the_one_answered() -> None:
    """A revision that is a commit gets that commit, or the answer is refused."""
    assert commit_problem(COMMIT, COMMIT) is None
    assert commit_problem(COMMIT, "f" * 40) is not None
    assert commit_problem(COMMIT, "main") is None


def test_checked_commit_raises_the_refusal_naming_the_endpoint() -> None:
    """The refusal names the endpoint, the value and HF_ENDPOINT in its fix (exit 3)."""
    with pytest.raises(HubAnswerRefused) as error:
        checked_commit("http://mirror", "o/m", None, "../x")
    assert "http://mirror" in error.value.message and "'../x'" in error.value.message
    assert error.value.exit_code == 3 and "HF_ENDPOINT" in (error.value.fix or "")


@pytest.mark.parametrize(
    "name",
    ["", "/etc/passwd", "../x", "a/../../x", "a/./b", "a//b", "a/", "a\x00b", "a\nb", "a\\b", "x" * 256, "a/" * 600],
)
def test_a_file_name_must_be_a_plain_relative_path(name: str) -> None:
    """Absolute, climbing, empty or dot segments, control characters, backslashes, overlong names: refused."""
    assert file_name_problem(name) is not None


@pytest.mark.parametrize(
    "name", ["config.json", "original/params.json", "refs/pr/1", "v1.0", "a b/ü.txt", ".gitattributes"]
)
def test_plain_names_are_taken(name: str) -> None:
    """What real repos and revisions use passes."""
    assert file_name_problem(name) is None


@pytest.mark.parametrize("etag", [None, "", "..", "a/b", "a.b", ".x", "e" * 129, "a\\b"])
def test_an_etag_must_be_one_plain_name(etag: str | None) -> None:
    """An ETag names a blob: letters, digits, '-' and '_' only."""
    assert etag_problem(etag) is not None


def test_hub_etags_are_taken() -> None:
    """A git blob id, an LFS sha256 and an S3-style multipart ETag pass."""
    assert etag_problem("a" * 40) is None and etag_problem("b" * 64) is None and etag_problem("9f2e-12") is None


def test_sha256_and_sizes() -> None:
    """A listed sha256 is 64 hex digits; the listing's size is required and a header must not contradict it."""
    assert sha256_problem(None) is None and sha256_problem("a" * 64) is None and sha256_problem("xyz") is not None
    assert expected_size(1000, None) == 1000 and expected_size(1000, 1000) == 1000
    assert isinstance(expected_size(None, 1000), str) and isinstance(expected_size(1000, 5), str)
    assert isinstance(expected_size(-1, None), str)
