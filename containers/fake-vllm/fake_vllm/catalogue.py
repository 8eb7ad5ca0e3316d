"""`vllm` argv grammar built from the flag catalogue generated from the vLLM 0.33 wheel.

The catalogue (vllm_args_0.33.json) lists every `vllm serve` flag with its kind, choices and
aliases. The parser mirrors vLLM's FlexibleArgumentParser (vllm/utils/argparse_utils.py) where
it shows at the process boundary: the `vllm` parser with subcommands (so unknown flags are
reported by `vllm:` and bad choices by `vllm serve:`, exit 2, exactly as argparse does there),
underscores accepted for dashes, `-O3`, `--model X` moved to the positional, `--help=all`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, cast

from . import VLLM_VERSION, releases

Kind = Literal["value", "switch", "list", "bool_optional"]
KINDS: Final = ("value", "switch", "list", "bool_optional")

# `vllm` subcommands of 0.33 (vllm/entrypoints/cli/main.py CMD_MODULES); only `serve` is imitated.
SUBCOMMANDS: Final = (
    "chat",
    "complete",
    "serve",
    "launch",
    "bench",
    "collect-env",
    "download-kernels",
    "preload",
    "run-batch",
    "snapshot",
)

SERVE_USAGE: Final = "vllm serve [model_tag] [options]"
SERVE_DESCRIPTION: Final = """Launch a local OpenAI-compatible API server to serve LLM
completions via HTTP. Defaults to Qwen/Qwen3-0.6B if no model is specified.

Search by using: `--help=<ConfigGroup>` to explore options by section (e.g.,
--help=ModelConfig, --help=Frontend)
  Use `--help=all` to show all available flags at once.
"""
SERVE_EPILOG: Final = (
    "For full list:            vllm serve --help=all\n"
    "For a section:            vllm serve --help=ModelConfig    (case-insensitive)\n"
    "For a flag:               vllm serve --help=max-model-len  (_ or - accepted)\n"
    "Documentation:            https://docs.vllm.ai\n"
)
DEFAULT_MODEL: Final = "Qwen/Qwen3-0.6B"


class CatalogueError(ValueError):
    """The flag catalogue file is missing or does not follow its schema."""


@dataclass(frozen=True)
class FlagSpec:
    """One `vllm serve` flag as the catalogue describes it."""

    flag: str
    kind: Kind
    choices: tuple[str, ...] | None
    aliases: tuple[str, ...]

    @property
    def dest(self) -> str:
        return dest_of(self.flag)


@dataclass(frozen=True)
class Catalogue:
    """The flag grammar of one vLLM version."""

    vllm_version: str
    source: str
    flags: tuple[FlagSpec, ...]
    kv_cache_dtypes: tuple[str, ...] | None = None
    """What CacheConfig's cache_dtype validator accepts (vllm/config/cache.py CacheDType); None: no check."""


def dest_of(flag: str) -> str:
    """The argparse destination vLLM derives from a long flag (`--max-model-len` -> max_model_len)."""
    return flag.lstrip("-").replace("-", "_")


def parse_catalogue(document: object) -> Catalogue:
    """Validate the catalogue's fixed schema and return it typed."""
    if not isinstance(document, dict):
        raise CatalogueError("the catalogue is not a JSON object")
    version = document.get("vllm_version")
    args = document.get("args")
    if not isinstance(version, str) or not isinstance(args, list):
        raise CatalogueError("the catalogue needs a string 'vllm_version' and a list 'args'")
    flags: list[FlagSpec] = []
    for entry in args:
        if not isinstance(entry, dict):
            raise CatalogueError(f"catalogue entry {entry!r} is not an object")
        flag, kind = entry.get("flag"), entry.get("kind")
        choices, aliases = entry.get("choices"), entry.get("aliases") or []
        if not isinstance(flag, str) or not flag.startswith("--") or kind not in KINDS:
            raise CatalogueError(f"catalogue entry {entry!r} needs a '--flag' and a kind of {KINDS}")
        if choices is not None and not isinstance(choices, list):
            raise CatalogueError(f"catalogue entry {flag}: 'choices' must be null or a list")
        if not (isinstance(aliases, list) and all(isinstance(a, str) for a in aliases)):
            raise CatalogueError(f"catalogue entry {flag}: 'aliases' must be a list of strings")
        flags.append(
            FlagSpec(
                flag=flag,
                kind=cast(Kind, kind),
                choices=tuple(str(choice) for choice in choices) if choices is not None else None,
                aliases=tuple(aliases),
            )
        )
    kv_cache_dtypes: tuple[str, ...] | None = None
    kv_entry = document.get("kv_cache_dtypes")
    if kv_entry is not None:
        values = kv_entry.get("value") if isinstance(kv_entry, dict) else None
        if not (isinstance(values, list) and all(isinstance(value, str) for value in values)):
            raise CatalogueError("'kv_cache_dtypes' needs a 'value' list of strings")
        kv_cache_dtypes = tuple(values)
    return Catalogue(
        vllm_version=version,
        source=str(document.get("source", "")),
        flags=tuple(flags),
        kv_cache_dtypes=kv_cache_dtypes,
    )


def load_catalogue(path: Path) -> Catalogue:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogueError(f"cannot read the flag catalogue {path}: {exc}") from exc
    return parse_catalogue(document)


def human_readable_int(value: str) -> int:
    """vLLM's parser for `1k` (10**3), `1K` (2**10), `25.6k`, `20G` ... (vllm/utils/argparse_utils.py)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from exc
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """As human_readable_int; `-1` or `auto` mean fit the length to memory (-1)."""
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


# Value types of the flags whose values the stand-in uses; other values stay strings.
VALUE_TYPES: Final[dict[str, Callable[[str], object]]] = {
    "port": int,
    "api_server_count": int,
    "seed": int,
    "max_model_len": human_readable_int_or_auto,
    "max_logprobs": int,
    "tensor_parallel_size": int,
    "pipeline_parallel_size": int,
    "data_parallel_size": int,
    "block_size": int,
    "gpu_memory_utilization": float,
    "kv_cache_memory_bytes": human_readable_int,
    "kv_offloading_size": float,
    "cpu_offload_gb": float,
    "max_num_batched_tokens": human_readable_int,
    "max_num_seqs": int,
    "spec_tokens": int,
    "max_loras": int,
    "max_lora_rank": int,
    "max_cpu_loras": int,
}

# argparse defaults as vLLM 0.33 registers them (the rest default to None, switches to False).
DEFAULTS: Final[dict[str, object]] = {
    "port": 8000,
    "uvicorn_log_level": "info",
    "disable_uvicorn_access_log": False,
    "trust_remote_code": False,
    "dtype": "auto",
    "seed": 0,
    "enforce_eager": False,
    "max_logprobs": 20,
    "generation_config": "auto",
    "load_format": "auto",
    "numa_bind": False,
    "pipeline_parallel_size": 1,
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
    "gpu_memory_utilization": 0.92,
    "kv_cache_dtype": "auto",
    "kv_offloading_backend": "native",
    "cpu_offload_gb": 0,
    "model": DEFAULT_MODEL,
}


class ServeArgumentParser(argparse.ArgumentParser):
    """The `vllm serve` parser; `--help=KEYWORD` narrows the help like FlexibleArgumentParser."""

    search_keyword: str | None = None
    json_tip: str = (
        "When passing JSON CLI arguments, the following sets of arguments "
        "are equivalent:\n"
        '   --json-arg \'{"key1": "value1", "key2": {"key3": "value2"}}\'\n'
        "   --json-arg.key1 value1 --json-arg.key2.key3 value2\n\n"
        "Additionally, list elements can be passed individually using +:\n"
        '   --json-arg \'{"key4": ["value3", "value4", "value5"]}\'\n'
        "   --json-arg.key4+ value3 --json-arg.key4+='value4,value5'\n\n"
    )

    def format_help(self) -> str:
        keyword = self.search_keyword
        if keyword is None or keyword == "all":
            self.epilog = self.json_tip if keyword == "all" else SERVE_EPILOG
            return super().format_help()
        keyword = keyword.lower().replace("_", "-")
        formatter = self._get_formatter()
        matched = [
            action for action in self._actions if any(keyword in option.lower() for option in action.option_strings)
        ]
        if matched:
            formatter.start_section(f"Arguments matching '{keyword}'")
            formatter.add_arguments(matched)
            formatter.end_section()
            formatter.add_text(self.json_tip)
        else:
            formatter.add_text(
                f"No group or arguments matching '{keyword}'.\n"
                "Use '--help' to see available groups or "
                "'--help=all' to see all available parameters."
            )
        return formatter.format_help()


class EnableDisableAction(argparse.Action):
    """`--x`/`--no-x` like BooleanOptionalAction, plus vLLM's `--enable-x`/`--disable-x` pairs.

    An alias that is the inverse of the flag (`--disable-prefix-caching` for
    `--enable-prefix-caching`) sets False, as vllm/utils/argparse_utils.py EnableDisableAction does.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, default: object = None, **kwargs: object) -> None:
        negatives = {option for option in option_strings if _is_negative(option, option_strings[0])}
        positives = [option for option in option_strings if option not in negatives]
        negatives |= {"--no-" + option[2:] for option in positives if option.startswith("--")}
        self.negative_options = frozenset(negatives)
        super().__init__([*positives, *sorted(negatives)], dest, nargs=0, default=default)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negative_options)


def _is_negative(option: str, flag: str) -> bool:
    for positive, negative in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
        if flag.startswith(positive) and option == negative + flag.removeprefix(positive):
            return True
    return False


def _typed_choices(
    spec: FlagSpec, value_type: Callable[[str], object]
) -> tuple[Callable[[str], object], list[object] | None]:
    """argparse compares converted values with the choices, so convert the choices too (or keep strings)."""
    if spec.choices is None:
        return value_type, None
    try:
        return value_type, [value_type(choice) for choice in spec.choices]
    except (ValueError, argparse.ArgumentTypeError):
        return str, list(spec.choices)


def _add_flag(parser: argparse.ArgumentParser, spec: FlagSpec, taken: set[str]) -> None:
    """Register one flag; option strings another entry already registered are left out, not fatal."""
    options = [option for option in (spec.flag, *spec.aliases) if option not in taken]
    if spec.flag not in options:
        return
    taken.update(options)
    dest = spec.dest
    default = DEFAULTS.get(dest)
    if spec.kind == "switch":
        parser.add_argument(*options, dest=dest, action="store_true", default=bool(default))
    elif spec.kind == "bool_optional":
        negated = {"--no-" + option[2:] for option in options if option.startswith("--")}
        taken.update(negated)
        parser.add_argument(*options, dest=dest, action=EnableDisableAction, default=default)
    else:
        value_type, choices = _typed_choices(spec, VALUE_TYPES.get(dest, str))
        parser.add_argument(
            *options,
            dest=dest,
            type=value_type,
            choices=choices,
            nargs="+" if spec.kind == "list" else None,
            default=default,
        )


def build_parser(catalogue: Catalogue) -> tuple[argparse.ArgumentParser, ServeArgumentParser]:
    """The `vllm` parser and its `serve` subparser, with every catalogue flag on `serve`."""
    top = argparse.ArgumentParser(prog="vllm", description="vLLM CLI")
    top.add_argument("-v", "--version", action="version", version=VLLM_VERSION)
    subparsers = top.add_subparsers(required=False, dest="subparser", parser_class=ServeArgumentParser)
    serve: ServeArgumentParser | None = None
    for name in SUBCOMMANDS:
        if name == "download-kernels" and not releases.DOWNLOAD_KERNELS:
            continue  # 0.32+ (vllm/entrypoints/cli/main.py)
        if name == "serve":
            serve = subparsers.add_parser(
                name,
                help="Launch a local OpenAI-compatible API server to serve LLM completions via HTTP.",
                description=SERVE_DESCRIPTION,
                usage=SERVE_USAGE,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        elif name == "download-kernels":
            kernels = subparsers.add_parser(name, help="Install precompiled kernels for faster startup.")
            kernels.add_argument("--dry-run", action="store_true")
        else:
            subparsers.add_parser(name, help=f"`vllm {name}` (not imitated by the stand-in)")
    assert serve is not None
    serve.add_argument("model_tag", type=str, nargs="?", help="The model tag to serve")
    taken = {"-h", "--help"}
    for spec in catalogue.flags:
        _add_flag(serve, spec, taken)
    return top, serve


@dataclass(frozen=True)
class PreparedArgv:
    """argv after FlexibleArgumentParser's rewriting, and what the rewriting noticed."""

    argv: tuple[str, ...]
    help_keyword: str | None
    model_flag_used: bool


def prepare_argv(argv: Sequence[str]) -> PreparedArgv:
    """Rewrite argv the way vLLM's FlexibleArgumentParser.parse_args does before argparse sees it."""
    args = list(argv)
    model_flag_used = False
    if args[:1] == ["serve"]:
        for index, arg in enumerate(args):
            if re.match(r"^--model(=.+|$)", arg):
                model_flag_used = True
                if arg == "--model" and index + 1 < len(args):
                    model_tag, rest = args[index + 1], index + 2
                else:
                    model_tag, rest = arg.removeprefix("--model="), index + 1
                args = ["serve", model_tag, *args[1:index], *args[rest:]]
                break
    help_keyword: str | None = None
    prepared: list[str] = []
    for index, arg in enumerate(args):
        if arg.startswith("--help="):
            help_keyword = arg.split("=", 1)[1].lower()
            prepared.append("--help")
        elif arg.startswith("--"):
            key, sep, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            prepared.append("--" + head.replace("_", "-") + dot + tail + sep + value)
        elif arg.startswith("-O") and arg != "-O":
            prepared += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and index + 1 < len(args) and args[index + 1] in {"0", "1", "2", "3"}:
            prepared.append("--optimization-level")
        else:
            prepared.append(arg)
    return PreparedArgv(argv=tuple(_merge_dotted(prepared)), help_keyword=help_keyword, model_flag_used=model_flag_used)


def _merge_dotted(args: list[str]) -> list[str]:
    """`--json-arg.key1 v1 --json-arg.key2.key3 v2` becomes `--json-arg '{"key1": v1, ...}'`."""
    merged: dict[str, dict[str, object]] = {}
    kept: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        name, sep, inline = arg.partition("=")
        if not (arg.startswith("--") and "." in name):
            kept.append(arg)
            index += 1
            continue
        if sep:
            raw = inline
        elif index + 1 < len(args):
            raw = args[index + 1]
            index += 1
        else:
            raw = ""
        index += 1
        key, *path = name.split(".")
        value: object
        if path and path[-1].endswith("+"):
            path[-1] = path[-1][:-1]
            value = raw.split(",")
        else:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        node = merged.setdefault(key, {})
        for part in path[:-1]:
            child = node.setdefault(part, {})
            node = child if isinstance(child, dict) else {}
        node[path[-1]] = value
    for key, value in merged.items():
        kept += [key, json.dumps(value)]
    return kept


def non_default_args(namespace: argparse.Namespace, serve: argparse.ArgumentParser) -> dict[str, object]:
    """The `non-default args:` dict vLLM logs: every parsed value that differs from the parser default."""
    defaults = vars(serve.parse_args([]))
    return {dest: value for dest, value in vars(namespace).items() if dest in defaults and value != defaults[dest]}
