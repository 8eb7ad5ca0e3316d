"""Reading a secret from its file (an API key, the Hugging Face token, a cluster token).

One reader for every secret file so that all refuse alike: a file that is missing, not a regular
file, or holds nothing but whitespace is a ConfigError (exit 2). `read_key_now` is the same reader
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

MAX_SECRET_BYTES = 64 * 1024
"""A secret is a line; a bigger file is the wrong file."""


def read_secret(path: Path, what: str) -> bytes:
    """The secret in `path` without surrounding whitespace; `what` names it in errors (e.g. `api_key`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the {what} file {path}: {exc.strerror or exc}",
            fix=f"create {path} (mode 0600, readable by root) or correct the setting naming it",
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(
                f"the {what} file {path} is not a regular file", fix="write the secret into a regular file (mode 0600)"
            )
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
