"""What dankserve takes from a Hub's answer before any of it becomes a path or a complete file.

The Hub, or whatever `HF_ENDPOINT` names (a mirror, a proxy, an attacker on the path), names
the commit, the files and their ETags, and these become directories and file names in the HF
cache, written as the daemon's user (root). So only what the real Hub can send is accepted:
a commit is 40 lowercase hex digits (what huggingface_hub itself takes for a commit), a file
name is a relative POSIX path of plain segments (huggingface_hub's own rule, plus no control
characters and no backslash), an ETag is one plain file name, and every file has a size (and
for LFS files a sha256) in the listing that its bytes must match. Pure: each check returns the
problem in words, or None; `refusal` makes it the error (HubAnswerRefused, exit 3).
"""

from __future__ import annotations

import re

from dankserve.errors import HubAnswerRefused

COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
ETAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
NAME_MAX_BYTES = 255
"""One path segment, as Linux file systems take it."""
PATH_MAX_CHARS = 1024


def commit_problem(commit: str | None, revision: str | None) -> str | None:
    """Why a Hub's commit id cannot name a snapshot directory (None when it can)."""
    if commit is None:
        return "no commit id"
    if not COMMIT.fullmatch(commit):
        return "a commit id that is not 40 hex digits"
    if revision is not None and COMMIT.fullmatch(revision) and revision != commit:
        return f"another commit than the one asked for ({revision})"
    return None


def file_name_problem(name: str) -> str | None:
    """Why a repo file name (or a revision, kept under refs/) cannot be a path under the cache."""
    if not name:
        return "an empty name"
    if len(name) > PATH_MAX_CHARS:
        return f"a name longer than {PATH_MAX_CHARS} characters"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        return "a control character (NUL, newline, ...) in the name"
    if "\\" in name:
        return "a backslash in the name"
    if name.startswith("/"):
        return "an absolute path"
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            return f"a {segment!r} path segment" if segment else "an empty path segment"
        if len(segment.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
            return f"a path segment longer than {NAME_MAX_BYTES} bytes"
    return None


def etag_problem(etag: str | None) -> str | None:
    """Why a file's ETag cannot name its blob (None when it can)."""
    if not etag:
        return "no ETag"
    if not ETAG.fullmatch(etag):
        return "an ETag that is not a plain name of letters, digits, '-' and '_' (at most 128)"
    return None


def sha256_problem(sha256: str | None) -> str | None:
    """Why an LFS sha256 in a listing is not one (None when it is, or when the listing gives none)."""
    if sha256 is not None and not SHA256.fullmatch(sha256):
        return "an LFS sha256 that is not 64 hex digits"
    return None


def expected_size(listed: int | None, announced: int | None) -> int | str:
    """The size a file must have: the listing's, which the file's own headers must not contradict.

    Returns the size, or the problem in words."""
    if listed is None:
        return "no size in the repo's listing"
    if listed < 0:
        return f"a negative size ({listed}) in the repo's listing"
    if announced is not None and announced != listed:
        return f"a size of {announced} bytes in its headers where the listing says {listed}"
    return listed


MIRROR_FIX = (
    "check that HF_ENDPOINT names the Hugging Face Hub or a mirror you trust (unset, it is huggingface.co); "
    "nothing of that answer was written"
)


def refusal(endpoint: str, model: str, what: str, problem: str) -> HubAnswerRefused:
    """The error for an answer dankserve does not take."""
    return HubAnswerRefused(f"{endpoint} answered {what} for {model}: {problem}", fix=MIRROR_FIX)


def checked_commit(endpoint: str, model: str, revision: str | None, commit: str | None) -> str:
    """The Hub's commit id for a revision, when it can name a snapshot directory; else HubAnswerRefused."""
    problem = commit_problem(commit, revision)
    if problem is not None or commit is None:
        raise refusal(endpoint, model, f"the commit id {str(commit)[:100]!r}", problem or "no commit id")
    return commit
