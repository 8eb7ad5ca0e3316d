"""A `vllm serve` argv read the way vLLM's argparse reads it: the one reader of argv in dankserve.

Every part that reads flags back from an argv (extra_args against the plan, the boot fingerprint's
memory flags, the served model name, the host RAM a plan pins) reads them here, so all agree on the
three things argparse decides: an option's value is the token after it or the text after `=`; a
long option may be spelled with `_` for `-` (`--max_model_len`); and when an option occurs more than
once, the last occurrence wins. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

OPTION = re.compile(r"^-{1,2}[A-Za-z]")
"""A token that starts an option (`-tp`, `--max-model-len`); `-1` is a value."""


@dataclass(frozen=True)
class Option:
    """One option of an argv with its value tokens."""

    name: str
    values: tuple[str, ...]
    tokens: tuple[str, ...]


def split_options(args: Sequence[str]) -> tuple[list[str], list[Option]]:
    """Leading positional tokens, then each option with the values that follow it."""
    leading: list[str] = []
    options: list[Option] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not OPTION.match(token):
            leading.append(token)
            i += 1
            continue
        name, eq, inline = token.partition("=")
        values: list[str] = [inline] if eq else []
        j = i + 1
        while not eq and j < len(args) and not OPTION.match(args[j]):
            values.append(args[j])
            j += 1
        options.append(Option(name, tuple(values), tuple(args[i:j])))
        i = j
    return leading, options


def spelled(name: str) -> str:
    """A long option in its `-` spelling (argparse takes `--max_model_len` for `--max-model-len`)."""
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def last_options(argv: Sequence[str], names: Mapping[str, str]) -> dict[str, Option]:
    """The last occurrence of each option `names` maps (any spelling, aliases such as `-tp`) to its key."""
    found: dict[str, Option] = {}
    for option in split_options(argv)[1]:
        key = names.get(spelled(option.name))
        if key is not None:
            found[key] = option
    return found


def option_value(argv: Sequence[str], *names: str) -> str | None:
    """The (first) value of the last occurrence of any of `names` in argv, None when absent or given none."""
    option = last_options(argv, dict.fromkeys(names, "")).get("")
    return option.values[0] if option is not None and option.values else None


def served_name(served_model_name: str | None, extra_args: Sequence[str], model: str) -> str:
    """The (first) name a deployment's server answers to, as vLLM reads its argv: extra_args come after the
    plan's `--served-model-name` (the setting), so theirs wins; else the setting; else the model. The
    probes, the warm-up and the wake canary ask for this name (a wrong one is a 404 that warms nothing)."""
    return option_value(extra_args, "--served-model-name") or served_model_name or model


def option_number(argv: Sequence[str], *names: str) -> float | None:
    """`option_value` as a number; None when absent or not a number."""
    value = option_value(argv, *names)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
