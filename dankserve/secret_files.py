"""Reading a secret from its file (an API key, the Hugging Face token, a cluster token).

One reader for every secret file so that all refuse alike: a file that is missing, not a regular
file, someone else's, open to others, in a directory someone else may change (file_trust), or
holds nothing but whitespace is a ConfigError (exit 2). `read_key_now` is the same reader
for a deployment's API key read again while the daemon runs (its sleep routes, the liveness probe,
the gateway's upstream key), where a key that cannot be read now is no key. An empty key is no key: a
server given one would run unauthenticated (vLLM treats an empty `VLLM_API_KEY` as unset)
while the configuration claims it is protected.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dankserve.errors import ConfigError
from dankserve.file_trust import check_way, owner_problem

MAX_SECRET_BYTES = 64 * 1024
"""A secret is a line; a bigger file is the wrong file."""


def secret_file_problem(mode: int) -> str | None:
    """Why a secret file with this mode is unsafe (others may read it, or its group change it), or None."""
    if mode & 0o007:
        return f"is open to others (mode {stat.S_IMODE(mode):04o})"
    if mode & 0o020:
        return f"is writable by its group (mode {stat.S_IMODE(mode):04o})"
    return None


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)


def read_secret(path: Path, what: str) -> bytes:
    """The secret in `path` without surrounding whitespace; `what` names it in errors (e.g. `api_key`).

    Opened once; the descriptor's owner and mode and every directory on the way are checked (file_trust),
    so a file another user owns, may change or may swap in is refused rather than read."""
    try:
        fd = _open(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} file {path}: {exc.strerror or exc}",
            fix=f"create {path} (mode 0600, readable by root) or correct the setting naming it",
        ) from None
    return _read_trusted(fd, path, what)


def check_secret(path: Path, what: str) -> None:
    """Refuse a secret file as `read_secret` would; one that does not exist or that this user may not open
    passes (the daemon reports it when it reads it: `dankserve plan` as a login user names root's files)."""
    try:
        fd = _open(path)
    except OSError:
        return
    _read_trusted(fd, path, what)


def _read_trusted(fd: int, path: Path, what: str) -> bytes:
    """Check the open file `fd` (closed here) and everything on its way, then read its secret."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"the {what} file {path} is not a regular file", fix="write the secret into a regular file (mode 0600)"
            )
        problem = owner_problem(info.st_uid, os.geteuid())
        if problem is not None:
            raise ConfigError(
                f"the {what} file {path} {problem}: its owner can change the secret or read it",
                fix=f"chown root {path} && chmod 600 {path} (or your own user when you run dankserve yourself)",
            )
        problem = secret_file_problem(info.st_mode)
        if problem is not None:
            raise ConfigError(
                f"the {what} file {path} {problem}",
                fix=f"chmod 600 {path} (a group may read it, never write it; others get nothing)",
            )
        check_way(path, info, f"the {what} file {path}", "the secret")
        with os.fdopen(os.dup(fd), "rb") as handle:
            value = handle.read(MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(value) > MAX_SECRET_BYTES:
        raise ConfigError(
            f"the {what} file {path} is larger than {MAX_SECRET_BYTES} bytes", fix="name the file holding the secret"
        )
    value = value.strip()
    if not value:
        raise ConfigError(
            f"the {what} file {path} is empty or holds only whitespace: an empty key is no key",
            fix=f"write the secret into {path}",
        )
    return value


def read_key_now(path: Path | None, what: str = "api_key") -> str | None:
    """The key in `path` as `read_secret` reads it, or None: no file set, or it cannot be read now.

    For a server already started with the key (its boot refused an unreadable one): a rotated key
    is read again, and a file gone or broken meanwhile makes the request go without one."""
    if path is None:
        return None
    try:
        return read_secret(path, what).decode("utf-8")
    except (ConfigError, UnicodeDecodeError):
        return None


def read_secret_file(path: Path, what: str, fix: str, *, min_length: int = 1) -> str:
    """A secret's text (`read_secret`: a regular, non-empty file), UTF-8 and at least min_length long."""
    try:
        secret = read_secret(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} file {path} is not UTF-8 text", fix=fix) from None
    if len(secret) < min_length:
        raise ConfigError(
            f"{what} in {path} is {len(secret)} characters long: at least {min_length} are needed", fix=fix
        )
    return secret
