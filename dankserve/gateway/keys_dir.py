"""Reading the gateway's keys: `[gateway] keys_dir` (one NAME.toml per key) and `api_key_file` (the key
named `default`), refusing what someone other than root (or the daemon's user) could change or read.

The directory and every file are opened without following symlinks and checked on the descriptor
read from (fstat), so what is checked is what is read: a link planted in the directory, a file
others may write or read, a directory others may write (they could swap a file in) are refused with
the path, the problem and the fix. Names beginning with '.' (editors' swap files) are skipped.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dankserve.errors import ConfigError
from dankserve.file_trust import check_way, owner_problem
from dankserve.gateway.keys import (
    DEFAULT_NAME,
    MAX_KEY_FILE_BYTES,
    MAX_KEYS,
    Key,
    KeyFileError,
    KeyRing,
    key_name,
    parse_key,
)
from dankserve.secret_files import read_secret


def read_keys(keys_dir: Path | None, api_key_file: Path | None) -> KeyRing:
    """Every key the gateway accepts (empty: none asked for); ConfigError (exit 2) for anything unsafe."""
    keys: list[Key] = []
    if api_key_file is not None:
        keys.append(Key(DEFAULT_NAME, _read_key_file(str(api_key_file), "gateway.api_key_file")))
    if keys_dir is not None:
        keys += _read_dir(keys_dir)
    names = [k.name for k in keys]
    if api_key_file is not None and names.count(DEFAULT_NAME) > 1:
        raise ConfigError(
            f"gateway keys_dir {keys_dir} holds {DEFAULT_NAME}.toml, the name api_key_file's key goes by",
            fix=f"rename {keys_dir}/{DEFAULT_NAME}.toml, or move its key into api_key_file and remove the file",
        )
    try:
        return KeyRing(tuple(keys), required=keys_dir is not None or api_key_file is not None)
    except KeyFileError as exc:
        raise ConfigError(f"gateway keys: {exc}", fix=f"give every key file in {keys_dir} its own key") from None


def _owner_problem(info: os.stat_result) -> str | None:
    return owner_problem(info.st_uid, os.geteuid())


def _read_dir(keys_dir: Path) -> list[Key]:
    fix_dir = f"chown root {keys_dir} && chmod 700 {keys_dir}"
    try:
        fd = os.open(keys_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        symlink = exc.errno == errno.ELOOP or keys_dir.is_symlink()  # O_DIRECTORY first: ENOTDIR
        why = "is a symlink (name the directory itself)" if symlink else (exc.strerror or str(exc))
        raise ConfigError(
            f"gateway keys_dir {keys_dir}: {why}", fix=f"create {keys_dir} as a directory (mode 0700, owned by root)"
        ) from None
    try:
        info = os.fstat(fd)
        problem = _owner_problem(info)
        if problem is None and info.st_mode & 0o022:
            problem = f"is writable by others than its owner (mode {stat.S_IMODE(info.st_mode):04o})"
        if problem is not None:
            raise ConfigError(f"gateway keys_dir {keys_dir} {problem}: they could add keys", fix=fix_dir)
        check_way(keys_dir, info, f"gateway keys_dir {keys_dir}", "the keys")
        names = sorted(n for n in os.listdir(fd) if not n.startswith("."))
        files = [n for n in names if n.endswith(".toml")]
        if len(files) > MAX_KEYS:
            raise ConfigError(
                f"gateway keys_dir {keys_dir} holds {len(files)} key files; at most {MAX_KEYS} are read",
                fix=f"remove unused keys from {keys_dir}",
            )
        return [_read_one(fd, keys_dir, name) for name in files]
    finally:
        os.close(fd)


def _read_one(dir_fd: int, keys_dir: Path, file_name: str) -> Key:
    path = keys_dir / file_name
    fix = f"chown root {path} && chmod 600 {path}"
    try:
        name = key_name(file_name)
    except KeyFileError as exc:
        raise ConfigError(f"gateway key file {path}: {exc}", fix=f"rename {path}") from None
    try:
        fd = os.open(file_name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        why = "is a symlink (key files are read only as regular files)" if exc.errno == errno.ELOOP else exc.strerror
        raise ConfigError(f"gateway key file {path} {why}", fix=f"put the key file itself in {keys_dir}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"gateway key file {path} is not a regular file", fix=f"remove {path}")
        problem = _owner_problem(info)
        if problem is None and info.st_mode & 0o077:
            problem = f"is open to its group or others (mode {stat.S_IMODE(info.st_mode):04o})"
        if problem is not None:
            raise ConfigError(f"gateway key file {path} {problem}", fix=fix)
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError(
            f"gateway key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes", fix="a key file is a few lines"
        )
    try:
        return parse_key(name, data.decode("utf-8"), lambda p: _read_key_file(p, f"key_file of {path}"))
    except UnicodeDecodeError:
        raise ConfigError(f"gateway key file {path} is not UTF-8 text", fix=f"rewrite {path}") from None
    except KeyFileError as exc:
        raise ConfigError(f"gateway key file {path}: {exc}", fix=f"correct {path} (docs/GATEWAY.md, Keys)") from None


def _read_key_file(path: str, what: str) -> str:
    """A secret file's key: `secret_files.read_secret` refuses one others may read, change or swap."""
    try:
        return read_secret(Path(path), what).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} {path} is not UTF-8 text", fix=f"write the key into {path}") from None
