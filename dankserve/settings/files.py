"""Where the config file lives, the checks before it is trusted (owner, mode, path), secret files, and loading."""

from __future__ import annotations

import errno
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dankserve.errors import ConfigError
from dankserve.settings.model import Settings
from dankserve.settings.reloading import ReloadEffects, reload_effects

DEFAULT_CONFIG_PATH = Path("/etc/dankserve/dankserve.toml")
CONFIG_ENV = "DANKSERVE_CONFIG"


def resolve_config_path(explicit: Path | None, environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to read and whether the user named it (so its absence is an error)."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit, True
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]), True
    return DEFAULT_CONFIG_PATH, False


def config_file_problem(mode: int, owner: int, me: int) -> str | None:
    """Why a config file with this mode and owner must not be trusted, or None when it may be."""
    if mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    if owner not in (0, me):
        return f"is owned by uid {owner}, neither root nor the user running dankserve (uid {me})"
    return None


def secret_file_problem(mode: int) -> str | None:
    """Why a secret file with this mode is unsafe (others may read it, or its group change it), or None."""
    if mode & 0o007:
        return f"is open to others (mode {stat.S_IMODE(mode):04o})"
    if mode & 0o020:
        return f"is writable by its group (mode {stat.S_IMODE(mode):04o})"
    return None


def config_dir_problem(mode: int, owner: int, entry_owner: int, me: int) -> str | None:
    """Why a directory on the way to the config lets someone else swap what is read, or None.

    Only root and the user running dankserve may own it or write it. A sticky directory (`/tmp`,
    mode 1777) is the exception where others may write: there an entry can be renamed or removed
    only by its owner, the directory's owner or root, so it is safe when all of those are root or
    this user."""
    if owner not in (0, me):
        return f"is owned by uid {owner}, neither root nor the user running dankserve (uid {me})"
    if mode & 0o022:
        if mode & stat.S_ISVTX and entry_owner in (0, me):
            return None
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    return None


MAX_SYMLINKS = 40
"""As the kernel's lookup: more symlinks on the way to the config is a loop."""


def _lookups(path: Path) -> tuple[list[tuple[str, os.stat_result, os.stat_result]], os.stat_result]:
    """Each directory resolving `path` looks a name up in, with its lstat and the entry's; the file's lstat.

    Symlinks are followed as the kernel follows them, so a link's directory counts as well as its
    target's. Raises OSError when a step cannot be looked at."""
    pending = [part for part in str(Path.cwd() / path).split("/") if part]
    pending.reverse()
    current = "/"
    steps: list[tuple[str, os.stat_result, os.stat_result]] = []
    links = 0
    entry = os.lstat(current)  # the path "/" itself
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            entry = os.lstat(current)
            continue
        directory = os.lstat(current)
        candidate = os.path.join(current, name)
        entry = os.lstat(candidate)
        steps.append((current, directory, entry))
        if stat.S_ISLNK(entry.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed([part for part in target.split("/") if part]))
        else:
            current = candidate
    return steps, entry


def _check_config_file(path: Path, opened: os.stat_result) -> None:
    """The opened file's own owner and mode (fstat: what is read is what is checked), then every directory
    on the way to it: a config someone else can change or swap decides what dankserve runs as root."""
    me = os.geteuid()
    problem = config_file_problem(opened.st_mode, opened.st_uid, me)
    if problem is not None:
        who = "root" if me == 0 else f"you (uid {me})"
        owner = "root" if me == 0 else str(me)
        raise ConfigError(
            f"config file {path} {problem}: whoever can change it decides what dankserve runs as {who}; "
            "it must be writable by its owner only (0600, 0640 or 0644 are fine) and owned by root or you",
            fix=f"chmod go-w {path} && chown {owner} {path}",
        )
    try:
        steps, found = _lookups(path)
    except OSError as exc:
        raise ConfigError(
            f"config file {path}: the directories on its way cannot be checked ({exc.strerror or exc})",
            fix="keep the config where root (or the user running dankserve) can look up every directory",
        ) from None
    for directory, info, entry in steps:
        problem = config_dir_problem(info.st_mode, info.st_uid, entry.st_uid, me)
        if problem is not None:
            raise ConfigError(
                f"config file {path}: the directory {directory} on its way {problem}, so someone else can "
                "swap the config for their own",
                fix=f"chown root {directory} && chmod go-w {directory}, or keep the config in a directory only "
                "root (or you) can write, such as /etc/dankserve",
            )
    if (found.st_dev, found.st_ino) != (opened.st_dev, opened.st_ino):
        raise ConfigError(
            f"config file {path} changed while it was read", fix="read it again once nothing is replacing it"
        )


def check_secret_files(settings: Settings) -> None:
    """Refuse secret files that exist and are open to others; absent ones are reported when read."""
    secrets: list[tuple[str, Path | None]] = []
    for name, dep in settings.deployments.items():
        for key in ("api_key_file", "hf_token_file", "cluster_token_file"):
            secrets.append((f"deployments.{name}.{key}", getattr(dep, key)))
    if settings.gateway is not None:
        secrets.append(("gateway.api_key_file", settings.gateway.api_key_file))
    if settings.cluster is not None:
        secrets += [
            ("cluster.token_file", settings.cluster.token_file),
            ("cluster.tls_key_file", settings.cluster.tls_key_file),
        ]
    for key, path in secrets:
        if path is None:
            continue
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        problem = secret_file_problem(mode)
        if problem is not None:
            raise ConfigError(
                f"{key} = {str(path)!r}: the file {problem}",
                fix=f"chmod 600 {path} (a group may read it, never write it; others get nothing)",
            )
        if stat.S_ISREG(mode) and _holds_no_secret(path):
            raise ConfigError(
                f"{key} = {str(path)!r}: the file is empty or holds only whitespace, "
                "and an empty key is no key (the server would run without one)",
                fix=f"write the secret into {path}",
            )


MAX_CONFIG_BYTES = 1024 * 1024
"""The largest config file read: a real one is a few KiB; a bigger one is a mistake or an attack
that would cost seconds and hundreds of MB to parse."""


def _read_config_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist; only a safe regular file of a sane size is read.

    Opened without blocking and checked before reading, on the descriptor read from: a FIFO or a
    device would hang the reader (and, on reload, the daemon's main loop), and a check of the
    path would not be of the file read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"config file {path} is not a regular file (a FIFO, device, socket or directory)",
                fix="point --config or DANKSERVE_CONFIG at a regular TOML file",
            )
        _check_config_file(path, info)
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config file {path} is {info.st_size} bytes, more than the {MAX_CONFIG_BYTES} a config may hold",
                fix="point --config or DANKSERVE_CONFIG at the right file (a real config is a few KiB)",
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # it grew while we looked
        raise ConfigError(
            f"config file {path} holds more than the {MAX_CONFIG_BYTES} bytes a config may hold",
            fix="point --config or DANKSERVE_CONFIG at the right file (a real config is a few KiB)",
        )
    return data.decode("utf-8")


def _holds_no_secret(path: Path) -> bool:
    """Whether a readable secret file holds only whitespace (one this user cannot read is checked when used)."""
    try:
        with path.open("rb") as handle:
            return not handle.read(MAX_CONFIG_BYTES).strip()
    except OSError:
        return False


def read_config_file(path: Path, *, required: bool) -> dict[str, Any]:
    """The TOML file's tables, or {} when an unnamed default file is absent."""
    try:
        text = _read_config_text(path)
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}", fix="check its permissions") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})",
            fix="save it as UTF-8 (TOML files are UTF-8)",
        ) from None
    if text is None:
        if required:
            raise ConfigError(
                f"config file {path} does not exist",
                fix="create it (`dankserve install` writes a commented example of every key) "
                f"or point --config/{CONFIG_ENV} elsewhere",
            )
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not valid TOML: {exc}", fix="correct the syntax at that line"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"config file {path} nests arrays or tables too deeply to read",
            fix="flatten the nesting (no dankserve key nests more than a few levels)",
        ) from None


_STATE_DIR_LINE = re.compile(r"""\s*state_dir\s*=\s*(?:"([^"\\]*)"|'([^']*)')\s*(?:#.*)?""")


def state_dir_despite_errors(config: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The state dir (where the running daemon listens) named by a config file that may not validate.

    Read-only commands reach the daemon through it while the file on disk is refused: the top-level
    `state_dir` (from the TOML, or from its line when the TOML does not parse), DANKSERVE_STATE_DIR over
    it, the default without either. A file that others may change names no directory worth trusting."""
    env = os.environ if environ is None else environ
    if env.get("DANKSERVE_STATE_DIR"):
        return Path(env["DANKSERVE_STATE_DIR"])
    default: Path = Settings.model_fields["state_dir"].default
    path, _ = resolve_config_path(config, env)
    try:
        text = _read_config_text(path)  # checked on the descriptor it reads, as load_settings does
    except (ConfigError, OSError, UnicodeDecodeError):
        return default
    if text is None:
        return default
    try:
        value = tomllib.loads(text).get("state_dir")
    except (tomllib.TOMLDecodeError, RecursionError):
        value = None
        for line in text.splitlines():
            if line.lstrip().startswith("["):
                break  # the top-level keys end at the first table
            if found := _STATE_DIR_LINE.fullmatch(line):
                value = found.group(1) if found.group(1) is not None else found.group(2)
    return Path(value) if isinstance(value, str) and value else default


def load_settings(config: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; every problem becomes a ConfigError (exit 2)."""
    path, required = resolve_config_path(config, environ)
    data = read_config_file(path, required=required)
    private = sorted(key for key in data if key.startswith("_"))
    if private:
        # pydantic-settings reads `_name` arguments as its own options (`_env_prefix` would switch
        # off the DANKSERVE_* overrides): no dankserve key begins with '_'.
        raise ConfigError(
            "invalid configuration:\n  "
            + "\n  ".join(
                f"{path}: unknown key {key!r}; see config/dankserve.toml for the keys allowed" for key in private
            ),
            fix="remove the keys named above (no dankserve key begins with '_')",
        )
    try:
        settings = Settings(**data)
    except RecursionError:
        raise ConfigError(
            f"invalid configuration: {path} nests values too deeply to check",
            fix="flatten the nesting (no dankserve key nests more than a few levels)",
        ) from None
    except ValidationError as exc:
        from dankserve.config_errors import describe

        problems = describe(Settings, exc.errors())
        raise ConfigError(
            "invalid configuration:\n  " + "\n  ".join(f"{path}: {p.line}" for p in problems),
            fix=problems[0].fix
            if len(problems) == 1
            else "correct the keys named above (docs/CONFIGURATION.md, and the example config `dankserve install` "
            "writes, document every key)",
        ) from None
    check_secret_files(settings)
    return settings


def load_reload(running: Settings, config: Path | None = None) -> ReloadEffects:
    """The config file read again for a reload: what the daemon runs with after it (`reload_effects`).

    A ConfigError, as for a start, when the file does not validate, or when its deployments do not
    fit the global keys kept at their running values until a restart (a deployment given the port of
    a gateway the file moved, which keeps listening until the restart)."""
    effects = reload_effects(running, load_settings(config))
    if not effects.needs_restart:
        return effects
    try:
        Settings.model_validate(effects.settings.model_dump())
    except ValidationError as exc:
        from dankserve.config_errors import describe

        kept = ", ".join(effects.needs_restart)
        problems = "; ".join(p.line for p in describe(Settings, exc.errors()))
        raise ConfigError(
            f"the file's deployments do not fit the running {kept} (kept until the daemon restarts): {problems}",
            fix=f"restart the daemon to apply the new {kept} (`systemctl restart dankserve`), "
            "or change the deployments to fit the running values",
        ) from None
    return effects
