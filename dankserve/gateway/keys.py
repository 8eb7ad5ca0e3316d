"""The gateway's client keys (pure): one key file's TOML parsed into a `Key`, scopes as globs, lookup.

A key file is `NAME.toml` in `[gateway] keys_dir` (the file's name is the key's name):

    key = "..."                 # or key_file = "/etc/dankserve/alice.secret"
    models = ["*"]              # globs over served names and aliases (fnmatch, case-sensitive)
    requests_per_minute = 60    # optional limits
    tokens_per_minute = 100000
    max_concurrent = 4
    priority = 0                # higher goes first when a deployment's admission queue is full
    scopes = ["api"]            # optional: "api" (the OpenAI routes), "console" (the web console's
                                # pages, read-only), "console:admin" (its actions too); unset: ["api"]

Reading the directory (owners, modes, symlinks) is keys_dir.py's; this module only decides.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

MAX_KEYS = 1000
"""Key files read from keys_dir at most; more is a mistake (or an attack on start-up time)."""
MAX_KEY_FILE_BYTES = 16 * 1024
"""A key file is a few lines."""
MIN_KEY_LENGTH = 16
"""A shorter key is guessable."""
MAX_KEY_LENGTH = 4096
MAX_SCOPES = 256
NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}\Z")
"""A key's name: it goes into logs, metrics labels and `dankserve usage`, so it is plain ASCII."""
KEY_TEXT = re.compile(r"[\x21-\x7e]+\Z")
"""A key is what a client can send in an HTTP header: printable ASCII, no spaces."""
LIMIT_MAX = 100_000_000
API = "api"
CONSOLE = "console"
CONSOLE_ADMIN = "console:admin"
SCOPES = (API, CONSOLE, CONSOLE_ADMIN)
DEFAULT_NAME = "default"
"""The name `[gateway] api_key_file`'s key goes by."""


class KeyFileError(ValueError):
    """A key file that cannot be used: the message names the problem and the value."""


@dataclass(frozen=True)
class Key:
    """One client key: its name (in logs and metrics), its secret (never), what it may use, its limits."""

    name: str
    secret: str
    models: tuple[str, ...] = ("*",)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    priority: int = 0
    scopes: tuple[str, ...] = (API,)
    """What the key may use: `api` (the OpenAI routes), `console` (the console's pages), `console:admin`
    (its actions; implies `console`). A key file without `scopes` keeps the meaning keys had before them."""

    def __repr__(self) -> str:  # the secret never reaches a log through repr
        return f"Key(name={self.name!r}, models={self.models!r})"

    def may(self, scope: str) -> bool:
        """Whether the key holds `scope` (`console:admin` holds `console` too)."""
        return scope in self.scopes or (scope == CONSOLE and CONSOLE_ADMIN in self.scopes)

    def allows(self, names: Iterable[str]) -> bool:
        """Whether any of a model's names (served name, alias) matches one of the key's globs."""
        return any(fnmatchcase(name, pattern) for name in names for pattern in self.models)


def key_name(file_name: str) -> str:
    """The key's name from its file's name (`alice.toml` -> `alice`); KeyFileError for any other name."""
    if not file_name.endswith(".toml"):
        raise KeyFileError(f"{file_name!r} is not NAME.toml")
    name = file_name.removesuffix(".toml")
    if not NAME.match(name):
        raise KeyFileError(
            f"{file_name!r}: a key's name is 1-63 of a-z, 0-9, '_', '.', '-', beginning with a letter or digit"
        )
    return name


ALLOWED = frozenset(
    {"key", "key_file", "models", "requests_per_minute", "tokens_per_minute", "max_concurrent", "priority", "scopes"}
)


def parse_key(name: str, text: str, read_key_file: Callable[[str], str]) -> Key:
    """A key file's TOML as a Key; `read_key_file(path)` reads a `key_file` (the shell's, with its checks)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KeyFileError(f"not TOML: {exc}") from None
    except RecursionError:
        raise KeyFileError("nests arrays or tables too deeply to read (a key file is a few flat lines)") from None
    unknown = sorted(set(data) - ALLOWED)
    if unknown:
        raise KeyFileError(f"unknown setting {unknown[0]!r}; a key file holds {', '.join(sorted(ALLOWED))}")
    if ("key" in data) == ("key_file" in data):
        raise KeyFileError('set one of key = "..." and key_file = "PATH"')
    if "key" in data:
        secret = data["key"]
        if not isinstance(secret, str):
            raise KeyFileError("key must be a string")
    else:
        path = data["key_file"]
        if not isinstance(path, str) or not path.startswith("/"):
            raise KeyFileError(f"key_file must be an absolute path, not {path!r}")
        secret = read_key_file(path)
    secret = secret.strip()
    _check_secret(secret)
    return Key(
        name=name,
        secret=secret,
        models=_models(data.get("models", ["*"])),
        requests_per_minute=_limit(data, "requests_per_minute"),
        tokens_per_minute=_limit(data, "tokens_per_minute"),
        max_concurrent=_limit(data, "max_concurrent"),
        priority=_priority(data.get("priority", 0)),
        scopes=_scopes(data.get("scopes", [API])),
    )


def _check_secret(secret: str) -> None:
    if not KEY_TEXT.match(secret):
        raise KeyFileError("the key must be printable ASCII without spaces (what a client can send in a header)")
    if not MIN_KEY_LENGTH <= len(secret) <= MAX_KEY_LENGTH:
        raise KeyFileError(
            f"the key is {len(secret)} characters long; {MIN_KEY_LENGTH}-{MAX_KEY_LENGTH} are needed "
            "(e.g. `openssl rand -hex 32`)"
        )


def _models(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise KeyFileError(f'models must be a list of name globs, e.g. ["*"] or ["qwen*"], not {value!r:.80}')
    if len(value) > MAX_SCOPES:
        raise KeyFileError(f"models lists {len(value)} globs; at most {MAX_SCOPES}")
    return tuple(value)


def _scopes(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(s, str) and s in SCOPES for s in value):
        raise KeyFileError(f"scopes must be a non-empty list of {', '.join(map(repr, SCOPES))}, not {value!r:.80}")
    return tuple(dict.fromkeys(value))


def _limit(data: dict[str, Any], setting: str) -> int | None:
    value = data.get(setting)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LIMIT_MAX:
        raise KeyFileError(f"{setting} must be a whole number from 1 to {LIMIT_MAX}, not {value!r:.40}")
    return value


def _priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -1000 <= value <= 1000:
        raise KeyFileError(f"priority must be a whole number from -1000 to 1000, not {value!r:.40}")
    return value


@dataclass(frozen=True)
class KeyRing:
    """Every key the gateway accepts. `required` False (no keys configured at all): no key is asked for (a
    loopback gateway); a configured keys_dir without a key file lets no one in."""

    keys: tuple[Key, ...] = ()
    required: bool = False
    _digests: tuple[bytes, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [k.name for k in self.keys]
        if len(set(names)) != len(names):
            raise KeyFileError("two keys have one name")
        secrets = [k.secret for k in self.keys]
        if len(set(secrets)) != len(secrets):
            raise KeyFileError("two keys hold the same secret: a request could not say which it is")
        object.__setattr__(self, "required", self.required or bool(self.keys))
        object.__setattr__(self, "_digests", tuple(hashlib.sha256(s.encode()).digest() for s in secrets))

    def identify(self, offered: str) -> Key | None:
        """The key whose secret is `offered`, compared with every key in constant time (no early exit).

        Digests are compared, not the texts, so the time says nothing of the keys' lengths either."""
        given = hashlib.sha256(offered.encode(errors="surrogateescape")).digest()
        found: Key | None = None
        for key, digest in zip(self.keys, self._digests, strict=True):
            if hmac.compare_digest(given, digest):
                found = key
        return found


def bearer(values: list[str]) -> str | None:
    """The token of a request's Authorization headers: exactly one `Bearer TOKEN` (scheme in any case)."""
    if len(values) != 1:
        return None  # none, or several: which one counts would be the attacker's choice
    scheme, _, token = values[0].strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        return None
    return token
