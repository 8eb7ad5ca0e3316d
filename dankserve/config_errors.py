"""pydantic's validation errors told in plain words: the key path, the value, what is expected, a fix.

pydantic names union members in its locations (`max_model_len.int`, `max_model_len.literal['auto']`)
and says `Input should be ...`; a user wrote neither. Errors of one key (one per union member) become
one line; an unknown key gets the nearest known key of its table as a suggestion. Pure.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel

Loc = tuple[str | int, ...]

# pydantic error types -> what was expected, in the words of someone writing TOML
_EXPECTED = {
    "int_parsing": "a whole number",
    "int_type": "a whole number",
    "int_from_float": "a whole number",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "string_type": "a string in quotes",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list [...]",
    "tuple_type": "a list [...]",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "string_too_short": "a non-empty string",
    "too_short": "a non-empty list",
}
_BOUNDS = {
    "greater_than_equal": "a number of at least",
    "greater_than": "a number greater than",
    "less_than_equal": "a number of at most",
    "less_than": "a number less than",
}
_HIDDEN = ("extra_args", "env")
"""Keys whose values may hold a secret (which is why they were refused): never echoed."""


_REQUIRED_WHY = {
    "cluster.tls_": ": the cluster API speaks TLS only (make the group's certificates with "
    "scripts/cluster-certs.sh DIR ADDRESS..., docs/MULTI-HOST.md)",
}


@dataclass(frozen=True)
class KeyProblem:
    """What is wrong with one key of the file: a line to print and the fix for it alone."""

    line: str
    fix: str


def _members(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _walk(root: type[BaseModel], loc: Loc, unknown_last: bool) -> tuple[Loc, type[BaseModel] | None]:
    """The location without pydantic's union-member tags, and the model whose table holds its last key."""
    annotation: Any = root
    kept: list[str | int] = []
    holder: type[BaseModel] | None = None
    for i, part in enumerate(loc):
        options = _members(annotation)
        model = next((o for o in options if isinstance(o, type) and issubclass(o, BaseModel)), None)
        container = next((o for o in options if get_origin(o) in (dict, list, tuple)), None)
        if model is not None and isinstance(part, str) and part in model.model_fields:
            holder, annotation = model, model.model_fields[part].annotation
            kept.append(part)
        elif container is not None and (get_origin(container) is dict or isinstance(part, int)):
            args = get_args(container)
            annotation = args[-1] if args else Any
            kept.append(part)
        elif i == len(loc) - 1 and unknown_last:
            holder = model
            kept.append(part)
        # else: a tag pydantic gives a union member (`int`, `literal['auto']`): not part of the key
    return tuple(kept), holder


def _expected(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind == "literal_error":
        expected = str(ctx.get("expected", ""))
        return "one of " + expected.replace("' or '", "', '") if "' or '" in expected else expected
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()), "?")
        shown = str(int(bound)) if isinstance(bound, float) and bound.is_integer() else str(bound)
        return f"{_BOUNDS[kind]} {shown}"
    if kind == "enum":
        return "one of " + str(ctx.get("expected", ""))
    return str(error.get("msg", "")).removeprefix("Input should be ")


def _shown(loc: Loc, value: Any) -> str:
    hidden = isinstance(value, dict) or (bool(loc) and loc[-1] in _HIDDEN) or any(p in _HIDDEN for p in loc)
    return "" if hidden else f" = {value!r}"


def describe(root: type[BaseModel], errors: Sequence[Mapping[str, Any]]) -> list[KeyProblem]:
    """One problem per key of the file, in the order pydantic found them."""
    groups: dict[Loc, list[Mapping[str, Any]]] = {}
    holders: dict[Loc, type[BaseModel] | None] = {}
    for error in errors:
        unknown = error.get("type") == "extra_forbidden"
        loc, holder = _walk(root, tuple(error["loc"]), unknown)
        groups.setdefault(loc, []).append(error)
        holders.setdefault(loc, holder)
    return [_problem(loc, group, holders[loc]) for loc, group in groups.items()]


def _problem(loc: Loc, group: Sequence[Mapping[str, Any]], holder: type[BaseModel] | None) -> KeyProblem:
    key = ".".join(str(part) for part in loc) or "(top level)"
    first = group[0]
    value = first.get("input")
    kind = first.get("type", "")
    if kind == "extra_forbidden":
        name = str(loc[-1]) if loc else ""
        known = list(holder.model_fields) if holder is not None else []
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        if close:
            return KeyProblem(
                f"unknown key {key!r}{_shown(loc, value)}: did you mean {close[0]!r}?", f"rename {name} to {close[0]}"
            )
        return KeyProblem(
            f"unknown key {key!r}{_shown(loc, value)}", f"remove {name} (docs/CONFIGURATION.md lists every key)"
        )
    if kind == "missing":
        why = next((why for prefix, why in _REQUIRED_WHY.items() if key.startswith(prefix)), "")
        return KeyProblem(f"{key} is required{why}", f"set {key}")
    if kind == "value_error":  # dankserve's own validators: their messages are written for people
        message = str(first.get("msg", "")).removeprefix("Value error, ")
        return KeyProblem(f"{key}{_shown(loc, value)}: {message}", "follow the advice on that line")
    expected = " or ".join(dict.fromkeys(_expected(e) for e in group))
    return KeyProblem(f"{key}{_shown(loc, value)}: expected {expected}", f"set {key} to {expected}")
