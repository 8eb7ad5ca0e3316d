"""What every settings value must be: the strict frozen section base, bounds, listen addresses."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

MAX_SECONDS = 7 * 24 * 3600.0
"""Upper bound of every duration setting: beyond a week is a typo (and overflows timers)."""
MAX_GIB = 1_000_000.0
"""Upper bound of every GiB amount (a petabyte)."""


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type accepts a boolean (bool itself, or a union holding it)."""
    if annotation is bool:
        return True
    return any(_takes_bool(arg) for arg in get_args(annotation) if get_origin(annotation) is not list)


def reject_bool_for_non_bool(model: type[BaseModel], value: Any, field_name: str | None) -> Any:
    """A TOML `true` where a number, text or list of them is expected is a type error, not 1.

    (pydantic's lax mode would read `port = true` as port 1.)
    """
    field = model.model_fields.get(field_name or "")
    if field is None or _takes_bool(field.annotation):
        return value
    items = value if isinstance(value, list) else [value]
    if any(isinstance(item, bool) for item in items):
        expected = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
        raise ValueError(f"a boolean ({value!r}) where {expected} is expected")
    return value


def reject_nul(value: Any) -> Any:
    """A NUL byte anywhere in a text value (or a table's key) is a config error: no program argument,
    environment variable or path can carry one, so the server would never start."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str) and "\x00" in item:
            raise ValueError(
                "holds a NUL byte (\\u0000), which no argument, environment variable or path can carry: remove it"
            )
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            pending += list(item)
    return value


# An image reference as the distribution spec writes one (github.com/distribution/reference's grammar):
# [DOMAIN[:PORT]/]PATH[:TAG][@DIGEST], PATH lowercase components. Nothing else names an image here: a
# transport (`containers-storage:[overlay@DIR]...`, `docker-archive:`, `oci:`, `dir:`) makes Podman open
# storage or files of the caller's choosing, as root, even for an upgrade it then refuses.
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]{{1,5}})?)"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
MAX_IMAGE_REFERENCE = 512


def image_reference_problem(reference: str) -> str | None:
    """Why `reference` is not a registry reference or a local image's name (None: it is one)."""
    if len(reference) > MAX_IMAGE_REFERENCE:
        return f"is {len(reference)} characters long; an image reference has at most {MAX_IMAGE_REFERENCE}"
    if _IMAGE_REFERENCE.fullmatch(reference):
        return None
    if re.match(r"[a-z][a-z0-9-]*:(?!\d+/)(?![\w][\w.-]*$)", reference) or "://" in reference:
        return "names a transport (such as containers-storage: or docker://), not an image"
    return "is not an image reference ([REGISTRY[:PORT]/]NAME[:TAG][@DIGEST], NAME in lowercase)"


IMAGE_FIX = "name a registry image (docker.io/vllm/vllm-openai:v0.33.0) or a local image (localhost/NAME:TAG)"


MAX_NAME_LENGTH = 63
"""A deployment's name becomes container, file and DNS-label names (63 is a label's limit)."""


class _Strict(BaseModel):
    """A settings section: unknown keys are errors, values are frozen once loaded, no NaN or
    infinity, no boolean standing in for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_non_bool(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_nul(reject_bool_for_non_bool(cls, value, info.field_name))


def check_address(value: str, default_port: int = 0) -> str:
    """The value, when it is ADDRESS:PORT (or ADDRESS with a default port); ValueError otherwise."""
    host, port = split_listen(value, default_port)
    if not host or not 1 <= port <= 65535:
        raise ValueError(f"{value!r} is not ADDRESS:PORT")
    return value


def split_listen(address: str, default_port: int = 0) -> tuple[str, int]:
    """'HOST:PORT' (or 'HOST', or '[v6]:PORT') as (host, port); a port that is not a number is -1."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else str(default_port)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, str(default_port)
    return host, int(port_text) if port_text.isdigit() else -1


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as an address and a port; ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'{value!r} is not HOST:PORT (e.g. "127.0.0.1:9400" or "[::1]:9400")')
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether the address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False
