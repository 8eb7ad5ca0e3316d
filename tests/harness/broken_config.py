"""Hypothesis strategies of broken dankserve configurations: every example is invalid by construction.

A valid base (one or two deployments, one GPU each, distinct ports; `base_configs`) gets one or
two mutations, each of which alone makes the file unusable: broken TOML syntax, a value of the
wrong type, an unknown key, a number out of its range, two deployments on one port, a bad
deployment name, a missing required key, an empty value, a value vLLM does not know, or a hostile
value (a flag or variable dankserve owns, a secret in extra_args or env, a model starting with '-',
a pydantic-settings `_option`, a nesting bomb). The
examples are rendered as TOML text (bytes: some are not UTF-8) with the category and a short
description, so a failing example says what it broke.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from dankserve.settings import CpuOffloadSettings, DeploymentSettings, ModelFactsSettings, Settings, SpeculativeSettings
from dankserve.testing.config_file import TomlRaw, config_text

Raw = TomlRaw
"""A TOML value written verbatim (a literal the generator chose, maybe a broken one)."""


Table = dict[str, Any]


@dataclass(frozen=True)
class Config:
    """A configuration as data: global keys and deployments (name -> keys, nested tables as dicts)."""

    globals_: Table
    deployments: dict[str, Table]


@dataclass(frozen=True)
class BrokenConfig:
    """One generated invalid configuration."""

    category: str
    detail: str
    text: bytes


def render(config: Config) -> str:
    """The configuration as a TOML document (nested tables of a deployment as sub-tables)."""
    return config_text(config.globals_, config.deployments)


NESTED = {"model_facts": ModelFactsSettings, "speculative": SpeculativeSettings, "cpu_offload": CpuOffloadSettings}

# --- the valid base --------------------------------------------------------------------------------

NAMES = st.from_regex(r"[a-z][a-z0-9_-]{0,11}", fullmatch=True)


@st.composite
def base_configs(draw: st.DrawFn) -> Config:
    """A valid configuration: one or two deployments, each on its own GPU and port, some optional keys."""
    count = draw(st.integers(1, 2))
    names = draw(st.lists(NAMES, min_size=count, max_size=count, unique=True))
    ports = draw(st.lists(st.integers(1024, 65535), min_size=count, max_size=count, unique=True))
    deployments: dict[str, Table] = {}
    for gpu, (name, port) in enumerate(zip(names, ports, strict=True)):
        dep: Table = {"model": f"org/model-{gpu}", "port": port, "gpus": [gpu]}
        if draw(st.booleans()):
            dep["max_model_len"] = draw(st.sampled_from([4096, 32768, "auto"]))
        if draw(st.booleans()):
            dep["enforce_eager"] = draw(st.booleans())
        if draw(st.booleans()):
            dep["model_facts"] = {"parameter_bytes": 2_000_000_000, "num_hidden_layers": 16}
        if draw(st.booleans()):
            dep["speculative"] = {"method": "ngram", "tokens": 4}
        deployments[name] = dep
    globals_: Table = {}
    if draw(st.booleans()):
        globals_["restart_backoff_initial_seconds"] = 1.5
    if draw(st.booleans()):
        globals_["log_format"] = "json"
    return Config(globals_, deployments)


# --- mutations -----------------------------------------------------------------------------------


def with_deployment(config: Config, name: str, dep: Table) -> Config:
    return Config(config.globals_, {**config.deployments, name: dep})


def first(config: Config) -> tuple[str, Table]:
    name = next(iter(config.deployments))
    return name, dict(config.deployments[name])


SCOPES: dict[str, type[Any]] = {"global": Settings, "deployment": DeploymentSettings, **NESTED}

# Values of each kind of field that no lax coercion turns into a valid one.
BAD_FOR = {
    "str": ["1", "2.5", "true", "[1, 2]", "{ a = 1 }", "1979-05-27"],
    "int": ['"eight"', "2.5", "true", "[1]", "{ a = 1 }", '"0x10"'],
    "float": ['"half"', "true", "[0.5]", "{ a = 0.5 }", '"1/2"'],
    "bool": ["2", "0.5", '"maybe"', "[true]", "{ a = true }"],
    "list": ["5", "true", "{ a = 1 }", '"--x"'],
    "path": ["5", "true", '["a"]', "{ a = 1 }"],
    "dict": ['"A=1"', "[1]", "{ A = 1 }", "{ A = true }"],
    "table": ["5", '"x"', "[1]", "true"],
    "choice": ['"sometimes"', "3", '["missing"]', "true"],
}

# (scope, key, kind) of the fields whose wrong types are generated.
TYPED_FIELDS = [
    ("global", "podman_url", "str"),
    ("global", "state_dir", "path"),
    ("global", "restart_backoff_multiplier", "float"),
    ("global", "max_failures_in_window", "int"),
    ("global", "boot_timeout_seconds", "float"),
    ("global", "log_format", "choice"),
    ("global", "vllm_version", "str"),
    ("deployment", "model", "str"),
    ("deployment", "image", "str"),
    ("deployment", "revision", "str"),
    ("deployment", "pull", "choice"),
    ("deployment", "runtime", "choice"),
    ("deployment", "profile", "choice"),
    ("deployment", "host", "str"),
    ("deployment", "port", "int"),
    ("deployment", "gpus", "list"),
    ("deployment", "tensor_parallel_size", "int"),
    ("deployment", "gpu_memory_utilization", "float"),
    ("deployment", "max_num_seqs", "int"),
    ("deployment", "max_num_batched_tokens", "int"),
    ("deployment", "enforce_eager", "bool"),
    ("deployment", "enabled", "bool"),
    ("deployment", "numa_bind", "bool"),
    ("deployment", "extra_args", "list"),
    ("deployment", "env", "dict"),
    ("deployment", "api_key_file", "path"),
    ("deployment", "model_facts", "table"),
    ("deployment", "speculative", "table"),
    ("deployment", "cpu_offload", "table"),
    ("model_facts", "num_hidden_layers", "int"),
    ("model_facts", "moe", "bool"),
    ("speculative", "tokens", "int"),
    ("cpu_offload", "gib", "float"),
]

# (scope, key, values) out of each field's range.
OUT_OF_RANGE = [
    ("deployment", "port", ["0", "-1", "65536", "99999999"]),
    ("deployment", "gpu_memory_utilization", ["0", "-0.5", "1.01", "2", "nan", "inf"]),
    ("deployment", "tensor_parallel_size", ["0", "-2"]),
    ("deployment", "max_num_seqs", ["0", "-1"]),
    ("deployment", "max_num_batched_tokens", ["0", "-100"]),
    ("deployment", "max_model_len", ["0", "-5"]),
    ("deployment", "kv_offload", ["-5", "nan", "-inf"]),
    ("deployment", "gpus", ["[7]", "[-1]", "[2]"]),
    ("speculative", "tokens", ["0", "65"]),
    ("cpu_offload", "gib", ["0", "-1", "1e7", "inf"]),
    ("model_facts", "num_attention_heads", ["0", "-8"]),
    ("model_facts", "parameter_bytes", ["0", "-1"]),
    ("global", "restart_backoff_initial_seconds", ["-1", "nan"]),
    ("global", "restart_backoff_max_seconds", ["0", "1e9"]),
    ("global", "restart_backoff_multiplier", ["0.5", "0"]),
    ("global", "restart_jitter_seconds", ["-1"]),
    ("global", "failure_window_seconds", ["0", "-60"]),
    ("global", "max_failures_in_window", ["0", "-3"]),
    ("global", "boot_timeout_seconds", ["0", "1e300"]),
    ("global", "stop_timeout_seconds", ["0", "inf"]),
    ("global", "health_interval_seconds", ["-1", "0"]),
]

UNKNOWN_VALUES = [
    ("deployment", "kv_cache_dtype", ['"q8_0"', '"bogus"', '"FP8"']),
    ("deployment", "attention_backend", ['"NOPE"', '"flash"']),
    ("speculative", "method", ['"bogus"', '"eagle4"']),
]

EMPTY_OR_DUPLICATE = [
    ("deployment", "model", ['""']),
    ("deployment", "image", ['""']),
    ("deployment", "revision", ['""']),
    ("deployment", "gpus", ["[]", "[0, 0]", '[0, "0"]']),
]


REQUIRED_IN: dict[str, Table] = {"speculative": {"method": "ngram"}, "cpu_offload": {"gib": 1.0}}
"""What a nested table needs besides the key a mutation sets (so only that key is wrong)."""


def set_field(config: Config, scope: str, name: str, raw: str) -> Config:
    """The configuration with `scope.name = raw` in its first deployment (or globally)."""
    if scope == "global":
        return Config({**config.globals_, name: Raw(raw)}, config.deployments)
    dep_name, dep = first(config)
    if scope == "deployment":
        dep[name] = Raw(raw)
    else:
        table = dict(dep.get(scope) or {})
        required: Table = REQUIRED_IN.get(scope, {})
        dep[scope] = {**required, **table, name: Raw(raw)}
    return with_deployment(config, dep_name, dep)


@st.composite
def wrong_type(draw: st.DrawFn, config: Config) -> tuple[Config, str]:
    scope, name, kind = draw(st.sampled_from(TYPED_FIELDS))
    raw = draw(st.sampled_from(BAD_FOR[kind]))
    return set_field(config, scope, name, raw), f"{scope}.{name} = {raw} ({kind} expected)"


@st.composite
def from_table(draw: st.DrawFn, config: Config, table: list[tuple[str, str, list[str]]]) -> tuple[Config, str]:
    scope, name, values = draw(st.sampled_from(table))
    raw = draw(st.sampled_from(values))
    return set_field(config, scope, name, raw), f"{scope}.{name} = {raw}"


@st.composite
def unknown_key(draw: st.DrawFn, config: Config) -> tuple[Config, str]:
    scope = draw(st.sampled_from(sorted(SCOPES)))
    known = set(SCOPES[scope].model_fields) | {"deployments"}
    name = draw(st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True).filter(lambda k: k not in known))
    raw = draw(st.sampled_from(["1", '"x"', "true", "[1, 2]", "2.5"]))
    return set_field(config, scope, name, raw), f"unknown key {scope}.{name}"


@st.composite
def duplicate_port(draw: st.DrawFn, config: Config) -> tuple[Config, str]:
    deployments = dict(config.deployments)
    if len(deployments) < 2:
        extra = draw(NAMES.filter(lambda n: n not in deployments))
        deployments[extra] = {"model": "org/other", "gpus": [1]}
    (a, dep_a), (b, dep_b) = list(deployments.items())[:2]
    port = dep_a.get("port", 8000)
    host_b = draw(st.sampled_from([None, "0.0.0.0", "127.0.0.1"]))
    dep_b = {**dep_b, "port": port}
    dep_a = {**dep_a, "host": "127.0.0.1"}
    if host_b is not None:
        dep_b["host"] = host_b
    deployments[a], deployments[b] = dep_a, dep_b
    return Config(config.globals_, deployments), f"{a} and {b} both on port {port}"


BAD_NAME_CHARS = st.sampled_from([*" ./:!@é*+=,;", "\t"])


@st.composite
def bad_name(draw: st.DrawFn, config: Config) -> tuple[Config, str]:
    old, dep = first(config)
    if draw(st.booleans()):
        name = ""
    else:
        head = draw(st.text("abc", max_size=4))
        name = head + draw(BAD_NAME_CHARS) + draw(st.text("xyz0", max_size=4))
    deployments = {name if n == old else n: d for n, d in config.deployments.items()}
    deployments[name] = dep
    return Config(config.globals_, deployments), f"deployment name {name!r}"


@st.composite
def missing_required(draw: st.DrawFn, config: Config) -> tuple[Config, str]:
    name, dep = first(config)
    which = draw(st.sampled_from(["model", "speculative.method", "cpu_offload.gib"]))
    if which == "model":
        dep.pop("model")
    elif which == "speculative.method":
        dep["speculative"] = {"tokens": 4}
    else:
        dep["cpu_offload"] = {"params": ["experts"]}
    return with_deployment(config, name, dep), f"{which} missing"


BAD_LINES = [
    'K = "unterminated',
    "K =",
    "= 1",
    "[deployments.",
    "K = [1, 2",
    "K = { a = 1",
    'K = "\\q"',
    "K = 1__0",
    "K = 0x",
    "K = 1979-13-45",
    "K = tru",
    "K = .5",
    "K = 08",
    "[[deployments]]",
    "K = 1.",
    "K = +inf_",
    "K K = 1",
    "[deployments.a.]",
]


@st.composite
def broken_syntax(draw: st.DrawFn, text: str) -> tuple[bytes, str]:
    """Corrupt a valid TOML text so that no TOML parser can read it."""
    lines = text.splitlines()
    how = draw(st.sampled_from(["bad line", "duplicate key", "duplicate table", "not utf-8", "control char"]))
    assignments = [i for i, line in enumerate(lines) if " = " in line and not line.startswith("[")]
    headers = [i for i, line in enumerate(lines) if line.startswith("[deployments.")]
    if how == "duplicate key" and assignments:
        i = draw(st.sampled_from(assignments))
        lines.insert(i + 1, lines[i])
        return ("\n".join(lines) + "\n").encode(), f"key repeated: {lines[i]}"
    if how == "duplicate table" and headers:
        i = draw(st.sampled_from(headers))
        lines.append(lines[i])
        return ("\n".join(lines) + "\n").encode(), f"table repeated: {lines[i]}"
    if how in ("not utf-8", "control char") and assignments:
        i = draw(st.sampled_from(assignments))
        garbage = b"\xff\xfe" if how == "not utf-8" else b"\x00"
        data = ("\n".join(lines[:i]) + "\n").encode() + b"# " + garbage + b"\n" + ("\n".join(lines[i:]) + "\n").encode()
        return data, f"{how} before line {i + 1}"
    bad = draw(st.sampled_from(BAD_LINES)).replace("K", draw(st.from_regex(r"[a-z_]{1,8}", fullmatch=True)))
    at = draw(st.integers(0, len(lines)))
    lines.insert(at, bad)
    return ("\n".join(lines) + "\n").encode(), f"line {at + 1}: {bad}"


def _hostile_table() -> list[tuple[str, str, list[str]]]:
    """What a careless admin or an attacker writes: flags dankserve owns, secrets in the open, variables
    that break its contract, a model that would become a flag, pydantic-settings' own options."""
    from dankserve.owned import CONTRACT_ENV, OWNED_FLAGS, SECRET_ENV, SECRET_FLAGS

    flags = [*OWNED_FLAGS, *SECRET_FLAGS]
    variables = [*SECRET_ENV, *CONTRACT_ENV]
    return [
        ("deployment", "extra_args", [f'["{flag}", "1"]' for flag in flags] + [f'["{flag}=1"]' for flag in flags]),
        ("deployment", "env", [f'{{ {name} = "x" }}' for name in variables]),
        ("deployment", "model", ['"--help"', '"-x"', '"--trust-remote-code"']),
        ("deployment", "revision", ['"--help"', '"-main"']),
        ("global", "_env_prefix", ['"NOPE_"']),
        ("global", "_case_sensitive", ["true"]),
        ("global", "_cli_parse_args", ["true"]),
        ("global", "x", ["[" * 3000 + "]" * 3000, "{ a = " * 3000 + "1" + " }" * 3000]),
    ]


HOSTILE = _hostile_table()


CATEGORIES = [
    "syntax",
    "hostile",
    "wrong type",
    "unknown key",
    "out of range",
    "duplicate port",
    "bad name",
    "missing key",
    "empty or duplicate",
    "unknown value",
]


@st.composite
def broken_configs(draw: st.DrawFn, safe_globals: Table) -> BrokenConfig:
    """An invalid configuration; `safe_globals` (paths, the Podman URL) are kept unless a mutation hits them."""
    base = draw(base_configs())
    config = Config({**safe_globals, **base.globals_}, base.deployments)
    category = draw(st.sampled_from(CATEGORIES))
    if category == "syntax":
        data, detail = draw(broken_syntax(render(config)))
        return BrokenConfig(category, detail, data)
    mutate = {
        "wrong type": wrong_type(config),
        "unknown key": unknown_key(config),
        "out of range": from_table(config, OUT_OF_RANGE),
        "duplicate port": duplicate_port(config),
        "bad name": bad_name(config),
        "missing key": missing_required(config),
        "empty or duplicate": from_table(config, EMPTY_OR_DUPLICATE),
        "unknown value": from_table(config, UNKNOWN_VALUES),
        "hostile": from_table(config, HOSTILE),
    }[category]
    mutated, detail = draw(mutate)
    return BrokenConfig(category, detail, render(mutated).encode())
