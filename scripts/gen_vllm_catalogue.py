#!/usr/bin/env python3
"""Generate dankserve's vLLM capability catalogue and the stand-in vLLM's argv grammar.

Run by hand (it needs PyPI), never by the CI: its outputs are committed.

    python3 scripts/gen_vllm_catalogue.py                 # every release in RELEASES
    python3 scripts/gen_vllm_catalogue.py --source-cache DIR   # keep/reuse extracted sources

For each vLLM release it downloads the release wheel (`pip download --no-deps
--only-binary=:all: vllm==X`, one at a time), reads the Python files it needs straight out of
the zip (nothing is installed or imported), deletes the wheel, and works out statically (ast)
what `vllm serve` accepts. vLLM builds that parser as follows, and this script follows the
same steps without running them:

- `vllm/entrypoints/cli/serve.py` `ServeSubcommand.subparser_init` calls `make_arg_parser`
  (`vllm/entrypoints/openai/cli_args.py`, later `vllm/entrypoints/common/cli_args.py`), which
  adds a few arguments itself, then `FrontendArgs.add_cli_args` (a config dataclass: every
  field `foo_bar` becomes `--foo-bar`) and `AsyncEngineArgs.add_cli_args` -> `EngineArgs.add_cli_args`
  (`vllm/engine/arg_utils.py`), which adds `--flag` with `**get_kwargs(SomeConfig)["field"]`
  per flag, plus explicit `add_argument` calls.
- `get_kwargs` turns a field's type into argparse kwargs: a dataclass -> a JSON value,
  `bool` -> `BooleanOptionalAction` (`--x` / `--no-x`), `Literal` -> `choices` (or only a
  metavar when `str` is also allowed: then the value is checked later, e.g. CacheDType in
  0.33), `list`/`tuple`/`set` -> `nargs="+"`, anything else -> one value. The script mirrors
  that table, including what each version's `_compute_kwargs` has or lacks, and then applies
  the edits `add_cli_args` makes to those kwargs (`del kw["nargs"]`, `kw["action"] = ...`).
- From 0.33, `FlexibleArgumentParser` registers `EnableDisableAction` for boolean flags, so
  `--enable-x` also accepts `--disable-x` (and the other way round).

Outputs:
- `dankserve/data/vllm_catalogue.json`: per version the flags (grouped by the wheel file that
  adds them), the value sets the planner uses, each with the wheel file it came from, the
  variables `vllm/envs.py` reads and refuses (`env`, `removed_env`), the `vllm` subcommands and
  the server's routes and metrics dankserve keys on; in the header, what replaces removed flags.
- `containers/fake-vllm/vllm_args_0.33.json` and `vllm_args_0.34.json`: the full argv grammars of
  `vllm serve` 0.33.0 and 0.34.0 for the stand-in vLLM image (schema fixed by that image's reader).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CATALOGUE_PATH = REPO / "dankserve" / "data" / "vllm_catalogue.json"
FAKE_ARGS_DIR = REPO / "containers" / "fake-vllm"
# The stand-in's grammars: 0.33's for FAKE_VLLM_VERSION 0.26-0.33 (as before), 0.34's for 0.34 and later.
FAKE_VERSIONS = ("0.33.0", "0.34.0")

# Every vLLM release on PyPI from 0.10.0 to 0.34.0 (patch releases included: 0.10.1 added
# --kv-cache-memory-bytes, so a minor's .0 alone would misdescribe its patches).
RELEASES = (
    "0.10.0", "0.10.1", "0.10.1.1", "0.10.2",
    "0.11.0", "0.11.1", "0.11.2",
    "0.12.0", "0.13.0", "0.14.0", "0.14.1", "0.15.0", "0.15.1", "0.16.0", "0.17.0", "0.17.1",
    "0.18.0", "0.18.1", "0.19.0", "0.19.1", "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0",
    "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0",
    "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)  # fmt: skip

# Flags whose presence the planner checks; printed as a table at the end of a run.
PLANNER_FLAGS = (
    "--swap-space",
    "--kv-offloading-size",
    "--kv-offloading-backend",
    "--kv-cache-memory-bytes",
    "--numa-bind",
    "--numa-bind-nodes",
    "--cpu-offload-gb",
    "--cpu-offload-params",
    "--speculative-config",
    "--attention-backend",
    "--kv-cache-dtype",
    "--max-model-len",
)


# --------------------------------------------------------------------------- sources


class Source:
    """Python files of one vLLM release, by path inside the wheel (vllm/...)."""

    def __init__(self, files: dict[str, bytes] | None = None, root: Path | None = None) -> None:
        self._files = files
        self._root = root
        self.read_paths: set[str] = set()

    def read(self, path: str) -> str | None:
        data: bytes | None
        if self._files is not None:
            data = self._files.get(path)
        else:
            assert self._root is not None
            file = self._root / path
            data = file.read_bytes() if file.is_file() else None
        if data is None:
            return None
        self.read_paths.add(path)
        return data.decode("utf-8")


def download_wheel(version: str, into: Path) -> tuple[Path, float]:
    """Download one vLLM wheel with pip; returns its path and the seconds it took."""
    start = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            f"vllm=={version}",
            "-d",
            str(into),
        ],
        check=True,
    )
    wheels = sorted(into.glob("vllm-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one vllm wheel in {into}, found {wheels}")
    return wheels[0], time.monotonic() - start


def python_files(wheel: Path) -> dict[str, bytes]:
    """The wheel's vllm/**/*.py files, read into memory (nothing is extracted to disk)."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            info.filename: archive.read(info)
            for info in archive.infolist()
            if info.filename.startswith("vllm/") and info.filename.endswith(".py")
        }


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------- modules


@dataclass
class Module:
    name: str
    path: str
    tree: ast.Module
    symbols: dict[str, ast.AST] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ClassRef:
    module: Module
    node: ast.ClassDef

    def __hash__(self) -> int:
        return hash((self.module.path, self.node.name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClassRef) and (self.module.path, self.node.name) == (
            other.module.path,
            other.node.name,
        )


@dataclass(frozen=True)
class FuncRef:
    module: Module
    node: ast.FunctionDef
    owner: ClassRef | None = None


@dataclass(frozen=True)
class ValueRef:
    """A module-level assignment's value expression."""

    module: Module
    node: ast.expr


@dataclass(frozen=True)
class ModuleRef:
    module: Module


@dataclass(frozen=True)
class External:
    """A name from outside the vLLM package (typing, argparse, torch ...)."""

    module: str
    name: str


Symbol = ClassRef | FuncRef | ValueRef | ModuleRef | External


class Project:
    """Lazily parsed modules of one release, with name resolution across imports."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._modules: dict[str, Module | None] = {}

    def module(self, name: str) -> Module | None:
        if name not in self._modules:
            self._modules[name] = self._load(name)
        return self._modules[name]

    def _load(self, name: str) -> Module | None:
        if not name.startswith("vllm"):
            return None
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            text = self.source.read(path)
            if text is not None:
                module = Module(name, path, ast.parse(text))
                self._index(module, module.tree.body)
                return module
        return None

    def _index(self, module: Module, body: list[ast.stmt]) -> None:
        package = module.name if module.path.endswith("__init__.py") else module.name.rpartition(".")[0]
        for stmt in body:
            if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                module.symbols[stmt.name] = stmt
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                name = stmt.targets[0].id
                lazy = stmt.value
                if (
                    isinstance(lazy, ast.Call)
                    and _callee_name(lazy) == "LazyLoader"
                    and len(lazy.args) >= 3
                    and isinstance(lazy.args[2], ast.Constant)
                ):
                    module.imports[name] = (str(lazy.args[2].value), None)  # a lazily imported module
                    module.symbols.pop(name, None)
                else:
                    module.symbols[name] = stmt.value
                    module.imports.pop(name, None)
            elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                module.symbols[stmt.target.id] = stmt.value
            elif type(stmt).__name__ == "TypeAlias":  # `type X = ...` (3.12 syntax)
                module.symbols[stmt.name.id] = stmt.value  # type: ignore[attr-defined]
            elif isinstance(stmt, ast.ImportFrom):
                origin = _absolute(package, stmt.module, stmt.level)
                for alias in stmt.names:
                    if alias.name == "*":
                        module.star_imports.append(origin)
                    else:
                        module.imports[alias.asname or alias.name] = (origin, alias.name)
                        module.symbols.pop(alias.asname or alias.name, None)
            elif isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    module.imports[bound] = (alias.name if alias.asname else bound, None)
                    module.symbols.pop(bound, None)
            elif isinstance(stmt, ast.If):
                # Both branches; the later one wins, as at run time (`if TYPE_CHECKING: import X
                # else: X = Any` leaves X = Any, and argparse then sees Any).
                self._index(module, stmt.body)
                self._index(module, stmt.orelse)
            elif isinstance(stmt, ast.Try):
                self._index(module, stmt.body)
                for handler in stmt.handlers:
                    self._index(module, handler.body)

    def lookup(self, module: Module, name: str, depth: int = 0) -> Symbol | None:
        if depth > 25:
            return None
        if name in module.symbols:
            node = module.symbols[name]
            if isinstance(node, ast.ClassDef):
                return ClassRef(module, node)
            if isinstance(node, ast.FunctionDef):
                return FuncRef(module, node)
            if isinstance(node, ast.expr):
                return ValueRef(module, node)
            return None
        if name in module.imports:
            origin, attr = module.imports[name]
            return self.resolve_import(origin, attr, depth + 1)
        for origin in module.star_imports:
            target = self.module(origin)
            found = self.lookup(target, name, depth + 1) if target else None
            if found is not None:
                return found
        return None

    def resolve_import(self, origin: str, attr: str | None, depth: int = 0) -> Symbol | None:
        if attr is None:
            target = self.module(origin)
            return ModuleRef(target) if target else External(origin, "")
        submodule = self.module(f"{origin}.{attr}")
        if submodule is not None:
            return ModuleRef(submodule)
        target = self.module(origin)
        if target is None:
            return External(origin, attr)
        return self.lookup(target, attr, depth)


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level > 1:
        parts = parts[: -(level - 1)]
    return ".".join([*parts, module] if module else parts)


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class Hint:
    """One member of a field type's union, reduced to what argparse kwargs depend on."""

    kind: str  # bool int float str dict none list tuple set literal dataclass class any
    values: tuple[Any, ...] = ()  # literal values
    elems: frozenset[Hint] = frozenset()  # collection element hints
    arity: int | None = None  # fixed tuple length; None: variadic
    source: str = ""  # file defining the Literal


BUILTIN_KINDS = {"bool": "bool", "int": "int", "float": "float", "str": "str", "dict": "dict", "Dict": "dict"}
COLLECTIONS = {"list": "list", "List": "list", "tuple": "tuple", "Tuple": "tuple", "set": "set", "Set": "set"}
OPAQUE = {"Any", "Callable", "type", "Type", "Path", "object", "bytes"}


class TypeReader:
    """Evaluates annotation expressions to sets of Hints, following aliases across modules."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.unresolved: set[str] = set()

    def hints(self, module: Module, node: ast.expr | None, depth: int = 0) -> frozenset[Hint]:
        if node is None or depth > 30:
            return frozenset({Hint("any")})
        if isinstance(node, ast.Constant):
            if node.value is None:
                return frozenset({Hint("none")})
            if isinstance(node.value, str):  # a forward reference
                try:
                    inner = ast.parse(node.value, mode="eval").body
                except SyntaxError:
                    return frozenset({Hint("class")})
                return self.hints(module, inner, depth + 1)
            return frozenset({Hint("any")})
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.hints(module, node.left, depth + 1) | self.hints(module, node.right, depth + 1)
        if isinstance(node, ast.Name | ast.Attribute):
            return self._named(module, node, depth)
        if isinstance(node, ast.Subscript):
            return self._subscript(module, node, depth)
        return frozenset({Hint("any")})

    def _resolve_name(self, module: Module, node: ast.expr) -> tuple[str, Symbol | None]:
        if isinstance(node, ast.Name):
            return node.id, self.project.lookup(module, node.id)
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name):
                owner = self.project.lookup(module, base.id)
                if isinstance(owner, ModuleRef):
                    return node.attr, self.project.lookup(owner.module, node.attr)
                if isinstance(owner, External):
                    return node.attr, External(f"{owner.module}.{owner.name}".strip("."), node.attr)
            return node.attr, None
        return "", None

    def _named(self, module: Module, node: ast.expr, depth: int) -> frozenset[Hint]:
        name, symbol = self._resolve_name(module, node)
        if symbol is None or isinstance(symbol, External):
            if name == "None":
                return frozenset({Hint("none")})
            if name in BUILTIN_KINDS:
                return frozenset({Hint(BUILTIN_KINDS[name])})
            if name in COLLECTIONS:
                return frozenset({Hint(COLLECTIONS[name], arity=None)})
            if name in OPAQUE:
                return frozenset({Hint("class")})
            if symbol is None:
                self.unresolved.add(f"{module.path}:{name}")
            return frozenset({Hint("class")})  # an external class: argparse treats it as str
        if isinstance(symbol, ValueRef):
            return self.hints(symbol.module, symbol.node, depth + 1)
        if isinstance(symbol, ClassRef):
            return frozenset({self._class_hint(symbol)})
        return frozenset({Hint("class")})

    def _class_hint(self, ref: ClassRef) -> Hint:
        decorators = {_callee_name(d) for d in ref.node.decorator_list}
        if decorators & {"dataclass", "config", "pydantic_dataclass"}:
            return Hint("dataclass")
        bases = {_callee_name(b) for b in ref.node.bases}
        if "TypedDict" not in bases and bases & {"dict", "Dict"}:
            return Hint("dict")
        return Hint("class")

    def _subscript(self, module: Module, node: ast.Subscript, depth: int) -> frozenset[Hint]:
        head, _ = self._resolve_name(module, node.value)
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if head == "Optional":
            return self.hints(module, args[0], depth + 1) | {Hint("none")}
        if head == "Union":
            out: frozenset[Hint] = frozenset()
            for arg in args:
                out |= self.hints(module, arg, depth + 1)
            return out
        if head in {"Annotated", "SkipValidation", "Final", "Required", "NotRequired"}:
            return self.hints(module, args[0], depth + 1)
        if head == "Literal":
            return frozenset({self._literal(module, args, depth)})
        if head in COLLECTIONS:
            kind = COLLECTIONS[head]
            elems: frozenset[Hint] = frozenset()
            real = [a for a in args if not (isinstance(a, ast.Constant) and a.value is Ellipsis)]
            for arg in real:
                elems |= self.hints(module, arg, depth + 1)
            variadic = kind != "tuple" or len(real) != len(args)
            return frozenset({Hint(kind, elems=elems, arity=None if variadic else len(args))})
        if head in {"dict", "Dict"}:
            return frozenset({Hint("dict")})
        if head in {"ClassVar", "InitVar"}:
            return frozenset({Hint("skip")})
        return frozenset({Hint("class")})

    def _literal(self, module: Module, args: list[ast.expr], depth: int) -> Hint:
        values: list[Any] = []
        sources: list[str] = [module.path]
        for arg in args:
            if isinstance(arg, ast.Constant):
                values.append(arg.value)
                continue
            for inner in self.hints(module, arg, depth + 1):  # a nested Literal alias
                if inner.kind == "literal":
                    values.extend(inner.values)
                    sources.append(inner.source)
                else:
                    self.unresolved.add(f"{module.path}:Literal[{ast.unparse(arg)}]")
        unique = list(dict.fromkeys(values))
        return Hint("literal", values=tuple(unique), source=" ".join(dict.fromkeys(s for s in sources if s)))


def _callee_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


# --------------------------------------------------------------------------- get_kwargs emulation


@dataclass
class Features:
    """What this release's `_compute_kwargs` and parser do differently."""

    optional_str_bool: bool  # {bool, str, None} -> nargs="?" (value optional)
    literal_metavar: bool  # Literal | str -> metavar instead of choices
    set_collections: bool
    enable_disable: bool  # --enable-x also accepts --disable-x

    @staticmethod
    def detect(arg_utils: str, argparse_utils: str) -> Features:
        return Features(
            optional_str_bool="type_hints == {bool, str, type(None)}" in arg_utils,
            literal_metavar=bool(re.search(r'"metavar" if contains_type\(type_hints, str\)', arg_utils)),
            set_collections="contains_type(type_hints, set)" in arg_utils,
            enable_disable=bool(
                re.search(r'register\(\s*"action",\s*BooleanOptionalAction,\s*EnableDisableAction', argparse_utils)
            ),
        )


UNKNOWN = object()
BOOL_OPTIONAL = "BooleanOptionalAction"


def field_kwargs(hints: frozenset[Hint], features: Features) -> dict[str, Any]:
    """argparse kwargs for a config field, as vLLM's `_compute_kwargs` builds them (kind-relevant keys)."""
    kinds = {h.kind for h in hints}
    kwargs: dict[str, Any] = {}
    literals = [h for h in hints if h.kind == "literal"]
    if "dataclass" in kinds:
        kwargs["type"] = "json"
    elif features.optional_str_bool and kinds == {"bool", "str", "none"}:
        kwargs.update(type="str", nargs="?", const=True)
    elif "bool" in kinds:
        kwargs["action"] = BOOL_OPTIONAL
    elif literals:
        values = [v for h in literals for v in h.values]
        key = "metavar" if features.literal_metavar and "str" in kinds else "choices"
        kwargs[key] = list(values)
        kwargs["literal"] = values
        kwargs["literal_source"] = literals[0].source
    elif kinds & {"tuple", "list"} or (features.set_collections and "set" in kinds):
        coll = next(h for h in hints if h.kind in ("tuple", "list", "set"))
        kwargs["nargs"] = "+" if coll.arity is None else coll.arity
        elem_literals = [h for h in coll.elems if h.kind == "literal"]
        if elem_literals and "str" not in {h.kind for h in coll.elems}:
            kwargs["choices"] = [v for h in elem_literals for v in h.values]
    if "none" in kinds and "bool" not in kinds and kwargs.get("choices"):
        kwargs["choices"].append(None)  # optional_type: the token None means None
    return kwargs


@dataclass
class KwTable:
    """The dict `get_kwargs(SomeConfig)` returns: field name -> argparse kwargs."""

    owner: ClassRef
    specs: dict[str, dict[str, Any]]


@dataclass
class ArgRecord:
    option_strings: list[str]
    kwargs: dict[str, Any]
    path: str
    line: int
    field_source: str | None


class _Return(Exception):
    def __init__(self, value: Any) -> None:
        self.value = value


PARSER = object()


@dataclass
class Frame:
    module: Module
    env: dict[str, Any]
    owner: ClassRef | None = None  # class defining the running method (for super())
    dyn: ClassRef | None = None  # class bound to `cls`


class ParserInterpreter:
    """Runs `subparser_init`/`make_arg_parser`/`add_cli_args` abstractly and records add_argument calls."""

    def __init__(self, project: Project, types: TypeReader, features: Features) -> None:
        self.project = project
        self.types = types
        self.features = features
        self.args: list[ArgRecord] = []
        self.notes: list[str] = []
        self.field_defaults: dict[tuple[str, str], tuple[Any, str]] = {}
        self._depth = 0

    # -- dataclass fields
    def class_fields(self, ref: ClassRef) -> dict[str, tuple[Module, ast.AnnAssign]]:
        out: dict[str, tuple[Module, ast.AnnAssign]] = {}
        for base in ref.node.bases:
            base_ref = self._symbol(ref.module, base)
            if isinstance(base_ref, ClassRef):
                out.update(self.class_fields(base_ref))
        for stmt in ref.node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = (ref.module, stmt)
        return out

    def kw_table(self, ref: ClassRef) -> KwTable:
        specs: dict[str, dict[str, Any]] = {}
        for name, (module, stmt) in self.class_fields(ref).items():
            hints = self.types.hints(module, stmt.annotation)
            if any(h.kind == "skip" for h in hints):
                continue
            spec = field_kwargs(hints, self.features)
            spec["field_source"] = module.path
            default = _field_default(stmt.value)
            if default is not UNKNOWN:
                spec["default"] = default
            specs[name] = spec
        return KwTable(ref, specs)

    def _symbol(self, module: Module, node: ast.expr) -> Symbol | None:
        if isinstance(node, ast.Name):
            return self.project.lookup(module, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = self.project.lookup(module, node.value.id)
            if isinstance(owner, ModuleRef):
                return self.project.lookup(owner.module, node.attr)
        return None

    # -- functions
    def call(self, func: FuncRef, args: list[Any], kwargs: dict[str, Any], dyn: ClassRef | None) -> Any:
        if self._depth > 40:
            return UNKNOWN
        params = [a.arg for a in func.node.args.posonlyargs + func.node.args.args]
        decorators = {_callee_name(d) for d in func.node.decorator_list}
        env: dict[str, Any] = {}
        if func.owner is not None and "staticmethod" not in decorators and params:
            env[params[0]] = (dyn or func.owner) if "classmethod" in decorators else UNKNOWN
            params = params[1:]
        for name, value in zip(params, args, strict=False):
            env[name] = value
        env.update({k: v for k, v in kwargs.items() if k in params})
        for name in params:
            env.setdefault(name, UNKNOWN)
        frame = Frame(func.module, env, owner=func.owner, dyn=dyn or func.owner)
        self._depth += 1
        try:
            self.run_block(frame, func.node.body)
        except _Return as done:
            return done.value
        finally:
            self._depth -= 1
        return frame.env.get("__return__")

    def run_block(self, frame: Frame, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.run_stmt(frame, stmt)

    def run_stmt(self, frame: Frame, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Assign):
            value = self.eval(frame, stmt.value)
            for target in stmt.targets:
                self.assign(frame, target, value)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.assign(frame, stmt.target, self.eval(frame, stmt.value))
        elif isinstance(stmt, ast.Delete):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript):
                    container = self.eval(frame, target.value)
                    key = self.eval(frame, target.slice)
                    if isinstance(container, dict) and isinstance(key, str):
                        container.pop(key, None)
        elif isinstance(stmt, ast.Expr):
            self.eval(frame, stmt.value)
        elif isinstance(stmt, ast.If):
            # Both branches: the union of flags over platforms and options is what can be accepted.
            # A return inside a branch ends only that branch, so the code after the `if` still runs.
            for branch in (stmt.body, stmt.orelse):
                try:
                    self.run_block(frame, branch)
                except _Return as done:
                    frame.env["__return__"] = done.value
        elif isinstance(stmt, ast.For):
            self.run_for(frame, stmt)
        elif isinstance(stmt, ast.With):
            self.run_block(frame, stmt.body)
        elif isinstance(stmt, ast.Try):
            self.run_block(frame, stmt.body)
            self.run_block(frame, stmt.finalbody)
        elif isinstance(stmt, ast.Return):
            value = self.eval(frame, stmt.value) if stmt.value is not None else None
            if value is not UNKNOWN and value is not None:
                raise _Return(value)
        elif isinstance(stmt, ast.ImportFrom):
            module = frame.module
            package = module.name if module.path.endswith("__init__.py") else module.name.rpartition(".")[0]
            origin = _absolute(package, stmt.module, stmt.level)
            for alias in stmt.names:
                frame.env[alias.asname or alias.name] = self.project.resolve_import(origin, alias.name)

    def run_for(self, frame: Frame, stmt: ast.For) -> None:
        it = stmt.iter
        if (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Attribute)
            and it.func.attr == "items"
            and isinstance(stmt.target, ast.Tuple)
            and len(stmt.target.elts) == 2
        ):
            table = self.eval(frame, it.func.value)
            if isinstance(table, KwTable):
                for key, spec in list(table.specs.items()):
                    self.assign(frame, stmt.target.elts[0], key)
                    self.assign(frame, stmt.target.elts[1], spec)
                    self.run_block(frame, stmt.body)
                return
        values = self.eval(frame, it)
        if isinstance(values, list) and UNKNOWN not in values:
            for value in values:
                self.assign(frame, stmt.target, value)
                self.run_block(frame, stmt.body)
            return
        self.notes.append(f"{frame.module.path}:{stmt.lineno}: loop not followed")

    def assign(self, frame: Frame, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = value
        elif isinstance(target, ast.Subscript):
            container = self.eval(frame, target.value)
            key = self.eval(frame, target.slice)
            if isinstance(container, dict) and isinstance(key, str):
                container[key] = value
                if key == "choices" and "metavar" in container and value is not UNKNOWN:
                    container.pop("metavar", None)

    # -- expressions
    def eval(self, frame: Frame, node: ast.expr) -> Any:  # noqa: PLR0915
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            items: list[Any] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(frame, elt.value)
                    items.extend(inner if isinstance(inner, list) else [UNKNOWN])
                else:
                    items.append(self.eval(frame, elt))
            return items
        if isinstance(node, ast.Dict):
            merged: dict[str, Any] = {}
            for key_node, value_node in zip(node.keys, node.values, strict=True):
                value = self.eval(frame, value_node)
                if key_node is None:
                    if not isinstance(value, dict):
                        return UNKNOWN
                    merged.update(value)
                else:
                    key = self.eval(frame, key_node)
                    if not isinstance(key, str):
                        return UNKNOWN
                    merged[key] = value
            return merged
        if isinstance(node, ast.Name):
            if node.id in frame.env:
                return frame.env[node.id]
            symbol = self.project.lookup(frame.module, node.id)
            if isinstance(symbol, ValueRef):
                value = _literal_value(symbol.node)
                return value
            return symbol if symbol is not None else UNKNOWN
        if isinstance(node, ast.IfExp):
            test = self.eval(frame, node.test)
            if isinstance(test, bool):
                return self.eval(frame, node.body if test else node.orelse)
            return UNKNOWN
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            left, right = self.eval(frame, node.left), self.eval(frame, node.comparators[0])
            if UNKNOWN in (left, right) or isinstance(left, _AttrOf) or isinstance(right, _AttrOf):
                return UNKNOWN
            op = node.ops[0]
            try:
                if isinstance(op, ast.In | ast.NotIn):
                    return (left in right) == isinstance(op, ast.In)
                if isinstance(op, ast.Eq | ast.NotEq):
                    return (left == right) == isinstance(op, ast.Eq)
            except TypeError:
                return UNKNOWN
            return UNKNOWN
        if isinstance(node, ast.Attribute):
            if node.attr == BOOL_OPTIONAL:
                return BOOL_OPTIONAL
            if node.attr == "device_type" and _callee_name(node.value) == "current_platform":
                return "cuda"  # the vllm-openai images are CUDA builds
            owner = self.eval(frame, node.value)
            if isinstance(owner, ClassRef):
                return self._class_attr(owner, node.attr)
            if isinstance(owner, ModuleRef):
                symbol = self.project.lookup(owner.module, node.attr)
                return _literal_value(symbol.node) if isinstance(symbol, ValueRef) else symbol or UNKNOWN
            if isinstance(owner, _Super):
                for base in self._bases(owner.owner):
                    method = self._class_attr(base, node.attr)
                    if method is not UNKNOWN:
                        return _Bound(method, owner.dyn) if isinstance(method, FuncRef) else method
                return UNKNOWN
            if isinstance(owner, External) and owner.module == "argparse":
                return node.attr
            return _AttrOf(owner, node.attr)
        if isinstance(node, ast.Subscript):
            container = self.eval(frame, node.value)
            key = self.eval(frame, node.slice)
            if isinstance(container, KwTable) and isinstance(key, str):
                spec = container.specs.get(key)
                if spec is None:
                    self.notes.append(
                        f"{frame.module.path}:{node.lineno}: no field {key!r} in {container.owner.node.name}"
                    )
                    return UNKNOWN
                return spec
            if isinstance(container, dict) and isinstance(key, str):
                return container.get(key, UNKNOWN)
            return UNKNOWN
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.eval(frame, node.left), self.eval(frame, node.right)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(left, str) and isinstance(right, str):
                return left + right
            if isinstance(left, list):
                return [*left, UNKNOWN]
            return UNKNOWN
        if isinstance(node, ast.JoinedStr):
            parts: list[str] = []
            for value in node.values:
                part = self.eval(frame, value.value if isinstance(value, ast.FormattedValue) else value)
                if not isinstance(part, str):
                    return UNKNOWN
                parts.append(part)
            return "".join(parts)
        if isinstance(node, ast.Call):
            return self.eval_call(frame, node)
        if isinstance(node, ast.ListComp):
            return self.eval_enum_comprehension(frame, node)
        return UNKNOWN

    def eval_enum_comprehension(self, frame: Frame, node: ast.ListComp) -> Any:
        """`[f.value for f in SomeEnum]` (explicit choices of an enum's members)."""
        if len(node.generators) != 1 or node.generators[0].ifs:
            return UNKNOWN
        gen = node.generators[0]
        enum = self.eval(frame, gen.iter)
        if not (isinstance(enum, ClassRef) and isinstance(gen.target, ast.Name)):
            return UNKNOWN
        elt = node.elt
        if not (isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == gen.target.id):
            return UNKNOWN
        members = [
            (stmt.targets[0].id, _literal_value(stmt.value))
            for stmt in enum.node.body
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
        ]
        if elt.attr == "name":
            return [name for name, _ in members]
        if elt.attr == "value":
            return [value for _, value in members]
        return UNKNOWN

    def _class_attr(self, ref: ClassRef, name: str) -> Any:
        for stmt in ref.node.body:
            if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
                return FuncRef(ref.module, stmt, owner=ref)
        for base in self._bases(ref):
            found = self._class_attr(base, name)
            if found is not UNKNOWN:
                return found
        return UNKNOWN

    def _bases(self, ref: ClassRef) -> Iterator[ClassRef]:
        for base in ref.node.bases:
            symbol = self._symbol(ref.module, base)
            if isinstance(symbol, ClassRef):
                yield symbol

    def eval_call(self, frame: Frame, node: ast.Call) -> Any:
        func = node.func
        name = _callee_name(func)
        if isinstance(func, ast.Name) and func.id == "super":
            return _Super(frame.owner, frame.dyn) if frame.owner else UNKNOWN
        args = [self.eval(frame, a.value) if isinstance(a, ast.Starred) else self.eval(frame, a) for a in node.args]
        if name == "add_argument" and isinstance(func, ast.Attribute):
            self.record(frame, node)
            return UNKNOWN
        if name in {"add_argument_group", "add_parser", "add_mutually_exclusive_group"}:
            return PARSER
        if name == "get_kwargs" and args and isinstance(args[0], ClassRef):
            return self.kw_table(args[0])
        if name == "get_args" and node.args:
            hints = self.types.hints(frame.module, node.args[0])
            values = [v for h in hints if h.kind == "literal" for v in h.values]
            return values or UNKNOWN
        if name in {"list", "sorted"} and len(args) == 1 and isinstance(args[0], list):
            return sorted(args[0], key=str) if name == "sorted" else list(args[0])
        if isinstance(func, ast.Attribute):
            owner = self.eval(frame, func.value)
            if isinstance(owner, dict):
                key = args[0] if args else None
                if name == "pop" and isinstance(key, str):
                    return owner.pop(key, args[1] if len(args) > 1 else UNKNOWN)
                if name == "get" and isinstance(key, str):
                    return owner.get(key, args[1] if len(args) > 1 else None)
                return UNKNOWN
            if isinstance(owner, list):
                if name == "remove" and args:
                    if args[0] is UNKNOWN:
                        owner.append(UNKNOWN)  # removal of an unknown value: the set is no longer known
                    elif args[0] in owner:
                        owner.remove(args[0])
                elif name in {"append", "extend"} and args:
                    owner.extend(args[0] if name == "extend" and isinstance(args[0], list) else [args[0]])
                return None
            if (
                isinstance(owner, str)
                and name == "replace"
                and len(args) == 2
                and all(isinstance(a, str) for a in args)
            ):
                return owner.replace(args[0], args[1])
        target = self.eval(frame, func)
        if isinstance(target, _AttrOf) and isinstance(target.owner, ClassRef):
            target = self._class_attr(target.owner, target.attr)
        dyn = None
        if isinstance(target, _Bound):
            dyn = target.dyn
            target = target.func
        if isinstance(target, FuncRef) and _interesting(args):
            kwargs = {k.arg: self.eval(frame, k.value) for k in node.keywords if k.arg}
            if target.owner is not None and dyn is None:
                receiver = self.eval(frame, func.value) if isinstance(func, ast.Attribute) else None
                dyn = receiver if isinstance(receiver, ClassRef) else target.owner
            result = self.call(target, args, kwargs, dyn)
            return result if result is not None else UNKNOWN
        return UNKNOWN

    def record(self, frame: Frame, node: ast.Call) -> None:
        option_strings: list[str] = []
        for arg in node.args:
            value = self.eval(frame, arg.value if isinstance(arg, ast.Starred) else arg)
            values = value if isinstance(value, list) else [value]
            option_strings.extend(v for v in values if isinstance(v, str))
        if not any(s.startswith("-") for s in option_strings):
            return  # a positional (model_tag)
        kwargs: dict[str, Any] = {}
        field_source = None
        for keyword in node.keywords:
            value = self.eval(frame, keyword.value)
            if keyword.arg is None:
                if isinstance(value, dict):
                    kwargs.update(value)
                    field_source = value.get("field_source")
                else:
                    self.notes.append(f"{frame.module.path}:{node.lineno}: unknown **kwargs for {option_strings}")
            else:
                kwargs[keyword.arg] = value
                if keyword.arg == "choices":
                    kwargs.pop("metavar", None)
        self.args.append(ArgRecord(option_strings, kwargs, frame.module.path, node.lineno, field_source))


@dataclass(frozen=True)
class _Super:
    owner: ClassRef
    dyn: ClassRef | None


@dataclass(frozen=True)
class _Bound:
    func: FuncRef
    dyn: ClassRef | None


@dataclass(frozen=True)
class _AttrOf:
    owner: Any
    attr: str


def _interesting(args: list[Any]) -> bool:
    """Only calls handed the parser or a kwargs table can add or change arguments."""
    return any(a is PARSER or isinstance(a, KwTable) for a in args)


def _literal_value(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return UNKNOWN


def _field_default(node: ast.expr | None) -> Any:
    """A field's default when it is a literal (`= 0.9`, `Field(default=0.92, ...)`, `field(default=...)`)."""
    if node is None:
        return UNKNOWN
    if isinstance(node, ast.Call) and _callee_name(node) in {"Field", "field"}:
        for keyword in node.keywords:
            if keyword.arg == "default":
                return _literal_value(keyword.value)
        if node.args:
            return _literal_value(node.args[0])
        return UNKNOWN
    return _literal_value(node)


# --------------------------------------------------------------------------- results


@dataclass
class Arg:
    flag: str
    aliases: list[str]
    kind: str
    choices: list[str] | None
    path: str
    deprecated: bool
    default: Any
    literal: list[Any] | None
    literal_source: str | None
    field_source: str | None
    optional_value: bool = False


SWITCH_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


def to_arg(record: ArgRecord, features: Features) -> Arg:
    kw = record.kwargs
    action = kw.get("action")
    nargs = kw.get("nargs")
    if action in SWITCH_ACTIONS:
        kind = "switch"
    elif action == BOOL_OPTIONAL:
        kind = "bool_optional"
    elif nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        kind = "list"
    else:
        kind = "value"
    raw = kw.get("choices")
    choices: list[str] | None = None
    if isinstance(raw, list) and UNKNOWN not in raw:
        choices = list(dict.fromkeys("None" if c is None else str(c) for c in raw))
    longs = [s for s in record.option_strings if s.startswith("--")]
    flag = longs[0] if longs else record.option_strings[0]
    aliases = [s for s in record.option_strings if s != flag]
    if kind == "bool_optional" and features.enable_disable:
        for option in list(record.option_strings):
            for prefix, inverse in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
                if option.startswith(prefix):
                    aliases.append(inverse + option.removeprefix(prefix))
    literal = kw.get("literal")
    return Arg(
        flag=flag,
        aliases=aliases,
        kind=kind,
        choices=choices,
        path=record.path,
        deprecated=kw.get("deprecated") is True,
        default=kw.get("default", UNKNOWN),
        literal=list(literal) if isinstance(literal, list) else None,
        literal_source=kw.get("literal_source"),
        field_source=record.field_source,
        optional_value=nargs == "?",
    )


def extract(version: str, source: Source) -> tuple[list[Arg], dict[str, Any], list[str]]:
    """The `vllm serve` arguments of one release, its planner facts, and notes on what was not followed."""
    project = Project(source)
    arg_utils = source.read("vllm/engine/arg_utils.py") or ""
    argparse_utils = source.read("vllm/utils/argparse_utils.py") or source.read("vllm/utils/__init__.py") or ""
    features = Features.detect(arg_utils, argparse_utils)
    types = TypeReader(project)
    interp = ParserInterpreter(project, types, features)
    serve = project.module("vllm.entrypoints.cli.serve")
    if serve is None:
        raise SystemExit(f"{version}: vllm/entrypoints/cli/serve.py not found")
    entry = next(
        (
            FuncRef(serve, stmt, owner=ClassRef(serve, cls))
            for cls in serve.tree.body
            if isinstance(cls, ast.ClassDef)
            for stmt in cls.body
            if isinstance(stmt, ast.FunctionDef) and stmt.name == "subparser_init"
        ),
        None,
    )
    if entry is None:
        raise SystemExit(f"{version}: no subparser_init in {serve.path}")
    interp.call(entry, [PARSER], {}, None)
    args: dict[str, Arg] = {}
    for record in interp.args:
        arg = to_arg(record, features)
        args.setdefault(arg.flag, arg)  # argparse would refuse a second definition; keep the first
    notes = interp.notes + sorted(f"unresolved type name {n}" for n in types.unresolved)
    facts = planner_facts(version, list(args.values()), project, arg_utils, features)
    facts.update(server_facts(source))
    return list(args.values()), facts, notes


def environment(source: Source) -> tuple[list[str], dict[str, str]]:
    """The variables `vllm/envs.py` reads (its `environment_variables` table) and the removed ones it
    names with a migration hint (`removed_environment_variables`, where the release has it)."""
    text = source.read("vllm/envs.py") or ""
    names: list[str] = []
    removed: dict[str, str] = {}
    for node in ast.parse(text).body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if not isinstance(target, ast.Name) or not isinstance(value, ast.Dict):
            continue
        keys = [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        if target.id == "environment_variables":
            names = sorted(keys)
        elif target.id == "removed_environment_variables":
            for key, hint in zip(value.keys, value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    removed[key.value] = " ".join(str(_literal_text(hint)).split())
    return names, removed


def _literal_text(node: ast.expr) -> str:
    """A string constant, also one written as adjacent literals or an f-string's literal parts."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return ast.unparse(node)


CHECKPOINT_ROUTER = "vllm/entrypoints/serve/checkpoint/api_router.py"
SLEEP_ROUTERS = ("vllm/entrypoints/serve/dev/sleep/api_router.py", "vllm/entrypoints/serve/sleep/api_router.py")


def server_facts(source: Source) -> dict[str, Any]:
    """What the server and the `vllm` command offer beside `vllm serve`'s flags, each with its file."""
    facts: dict[str, Any] = {}
    main = source.read("vllm/entrypoints/cli/main.py") or ""
    subcommands = sorted(
        {m.replace("_", "-") for m in re.findall(r"vllm\.entrypoints\.cli\.(\w+)", main)} - {"main", "types"}
    )
    if subcommands:
        facts["subcommands"] = {"value": subcommands, "source": "vllm/entrypoints/cli/main.py"}
    checkpoint = source.read(CHECKPOINT_ROUTER) or ""
    routes = re.findall(r'@router\.(?:get|post)\(\s*"(/checkpoint/\w+)"', checkpoint)
    if routes:
        facts["checkpoint_routes"] = {"value": sorted(routes), "source": CHECKPOINT_ROUTER}
    for path in SLEEP_ROUTERS:
        sleep = source.read(path)
        if sleep is None:
            continue
        facts["sleep_answers_json"] = {
            "value": '{"status": "sleeping", "level": level}' in sleep,
            "source": path + " (/sleep's answer: JSON, or an empty 200)",
        }
        metrics = source.read(path.rsplit("/", 1)[0] + "/metrics.py") or ""
        if "vllm:sleep_mode_operation_duration_seconds" in metrics:
            facts["sleep_metrics"] = {
                "value": ["vllm:sleep_mode_operation_duration_seconds", "vllm:sleep_mode_operations_in_flight"],
                "source": path.rsplit("/", 1)[0] + "/metrics.py",
            }
        break
    loggers = source.read("vllm/v1/metrics/loggers.py") or ""
    if '"vllm:admission_rejections"' in loggers:
        facts["admission_rejections_metric"] = {"value": True, "source": "vllm/v1/metrics/loggers.py"}
    return facts


def planner_facts(
    version: str, args: list[Arg], project: Project, arg_utils: str, features: Features
) -> dict[str, Any]:
    """The value sets and defaults the planner uses, each with the wheel file it was read from."""
    by_flag = {a.flag: a for a in args}
    facts: dict[str, Any] = {}
    kv = by_flag.get("--kv-cache-dtype")
    if kv and kv.literal:
        facts["kv_cache_dtypes"] = {
            "value": kv.literal,
            "source": kv.literal_source,
            "argparse_choices": kv.choices is not None,
        }
    util = by_flag.get("--gpu-memory-utilization")
    if util and isinstance(util.default, float):
        facts["gpu_memory_utilization_default"] = {"value": util.default, "source": util.field_source}
    mml = by_flag.get("--max-model-len")
    if mml:
        auto = "human_readable_int_or_auto" in arg_utils
        facts["max_model_len_auto"] = {
            "value": auto,
            "source": "vllm/engine/arg_utils.py (_compute_kwargs: max_model_len -> human_readable_int_or_auto)"
            if auto
            else "vllm/engine/arg_utils.py (max_model_len parsed as an integer only)",
        }
    for flag, key in (
        ("--kv-offloading-backend", "kv_offloading_backends"),
        ("--spec-method", "speculative_methods"),
    ):
        arg = by_flag.get(flag)
        if arg and arg.literal:
            facts[key] = {"value": arg.literal, "source": arg.literal_source}
    if "speculative_methods" not in facts:
        methods = speculative_methods(project)
        if methods:
            facts["speculative_methods"] = methods
    if "--attention-backend" in by_flag:
        backends = attention_backends(project)
        if backends:
            facts["attention_backends"] = backends
    facts["bool_negation"] = {
        "value": "--no-X, and --enable-X/--disable-X pairs" if features.enable_disable else "--no-X",
        "source": "vllm/utils/argparse_utils.py (EnableDisableAction registered)"
        if features.enable_disable
        else "vllm/engine/arg_utils.py (argparse.BooleanOptionalAction)",
    }
    return facts


def speculative_methods(project: Project) -> dict[str, Any] | None:
    for name in ("vllm.config.speculative", "vllm.config"):
        module = project.module(name)
        if module is None:
            continue
        symbol = project.lookup(module, "SpeculativeMethod")
        if isinstance(symbol, ValueRef):
            hints = TypeReader(project).hints(symbol.module, symbol.node)
            values = [v for h in hints if h.kind == "literal" for v in h.values]
            if values:
                return {"value": values, "source": symbol.module.path}
    return None


def attention_backends(project: Project) -> dict[str, Any] | None:
    """Member names of AttentionBackendEnum (`--attention-backend` takes a member name, or auto)."""
    for name in (
        "vllm.v1.attention.backends.registry",
        "vllm.attention.backends.registry",
        "vllm.platforms.interface",
    ):
        module = project.module(name)
        if module is None:
            continue
        node = module.symbols.get("AttentionBackendEnum") or module.symbols.get("_Backend")
        if isinstance(node, ast.ClassDef):
            members = [
                t.id
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                for t in stmt.targets
                if isinstance(t, ast.Name) and not t.id.startswith("_")
            ]
            return {"value": members, "source": module.path}
    return None


# --------------------------------------------------------------------------- outputs


def catalogue_entry(
    version: str, wheel: str, digest: str, args: list[Arg], facts: dict[str, Any], *, source: Source
) -> dict[str, Any]:
    flags: dict[str, list[str]] = {}
    for arg in args:
        flags.setdefault(arg.path, []).extend([arg.flag, *arg.aliases])
    env, removed_env = environment(source)
    # Variables the release still reads but has deprecated for a config field (vllm/config/attention.py,
    # `_set_from_env_if_set(field, VARIABLE)`: "Please use --attention-config.FIELD ... instead").
    attention = source.read("vllm/config/attention.py") or ""
    successors = {
        variable: f"--attention-config.{name}"
        for name, variable in re.findall(r'_set_from_env_if_set\(\s*"(\w+)",\s*"(\w+)"', attention)
    }
    return {
        "wheel": wheel,
        "wheel_sha256": digest,
        "flags": {path: sorted(set(names)) for path, names in sorted(flags.items())},
        "deprecated_flags": sorted(a.flag for a in args if a.deprecated),
        "facts": facts,
        "env": env,
        "removed_env": removed_env,
        "env_successors": successors,
    }


# What replaces a `vllm serve` flag a release removed, as the last releases that had it said (their
# deprecation notices and field docs, file noted). A removed flag not listed here had no named successor.
FLAG_REPLACEMENTS: dict[str, str] = {
    # 0.17.1 vllm/config/cache.py: CPU swap space gone with the V0 engine; CPU KV offload replaced it.
    "--swap-space": "--kv-offloading-size (GiB of CPU memory for the KV cache in total; dankserve's kv_offload)",
    # 0.11.2 vllm/config/parallel.py: "Please use `eplb_config.X` instead."
    "--num-redundant-experts": "--eplb-config.num_redundant_experts",
    "--eplb-window-size": "--eplb-config.window_size",
    "--eplb-step-interval": "--eplb-config.step_interval",
    "--eplb-log-balancedness": "--eplb-config.log_balancedness",
    # 0.11.2 vllm/config/model.py: "Please use `pooler_config` instead."
    "--override-pooler-config": "--pooler-config",
    # 0.12.0 vllm/engine/arg_utils.py: "Please use `--mm-encoder-tp-mode data` instead."
    "--enable-multimodal-encoder-data-parallel": "--mm-encoder-tp-mode data",
    # 0.27.1 vllm/config/cache.py: without it the scales are loaded from the checkpoint (else 1.0).
    "--calculate-kv-scales": "the checkpoint's own k/v scales (loaded with --kv-cache-dtype fp8)",
}


def write_catalogue(entries: dict[str, dict[str, Any]], path: Path) -> None:
    ordered = dict(sorted(entries.items(), key=lambda item: _version_key(item[0])))
    header = {
        "generated_by": "scripts/gen_vllm_catalogue.py",
        "method": (
            "Static reading (ast) of each release wheel's Python files: the arguments that "
            "vllm/entrypoints/cli/serve.py ServeSubcommand.subparser_init adds through make_arg_parser, "
            "FrontendArgs.add_cli_args and (Async)EngineArgs.add_cli_args, with the kwargs vLLM's "
            "get_kwargs derives from the config dataclass fields. 'flags' maps each wheel file to the option "
            "strings it adds; 'facts' give the value sets and defaults the planner uses with their source file."
        ),
        "releases": list(ordered),
        "flag_replacements": FLAG_REPLACEMENTS,
    }
    lines = ["{"]
    for key, value in header.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(value)},")
    lines.append('  "versions": {')
    for i, (version, entry) in enumerate(ordered.items()):
        comma = "," if i < len(ordered) - 1 else ""
        lines.append(f"    {json.dumps(version)}: {json.dumps(entry, sort_keys=True)}{comma}")
    lines.append("  }")
    lines.append("}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def write_fake_args(version: str, args: list[Arg], wheel: str, path: Path) -> None:
    optional = ", ".join(sorted(a.flag for a in args if a.optional_value and a.kind == "value"))
    kv = next((a for a in args if a.flag == "--kv-cache-dtype"), None)
    payload: dict[str, Any] = {
        "vllm_version": version,
        "source": (
            f"scripts/gen_vllm_catalogue.py: static reading of {wheel} (vllm/entrypoints/cli/serve.py, "
            "vllm/entrypoints/common/cli_args.py, vllm/engine/arg_utils.py, vllm/config/*.py). "
            "argv is `[model_tag] [options]`: the model is the first positional. choices are argparse's own; "
            "null where argparse takes any value (e.g. --kv-cache-dtype: 0.33 validates it later, in CacheConfig, "
            "against dankserve/data/vllm_catalogue.json's kv_cache_dtypes). bool_optional also accepts --no-FLAG "
            "for the flag and each alias. These value flags may also stand bare (nargs='?'): "
            f"{optional or 'none'}. vLLM's parser also accepts --flag=value, underscores for dashes, "
            "unambiguous prefixes, and --json-flag.key value forms. kv_cache_dtypes: the values CacheConfig's "
            "cache_dtype validator accepts (the CacheDType Literal); any other --kv-cache-dtype fails there, "
            "after argparse. args are in vLLM's registration order."
        ),
        # The stand-in fails an unknown --kv-cache-dtype where 0.33 does (CacheConfig), not in argparse.
        "kv_cache_dtypes": {
            "value": kv.literal if kv is not None else None,
            "source": kv.literal_source if kv is not None else None,
        },
        # Registration order, as argparse keeps it: `non-default args:` lists values in this order.
        "args": [{"flag": a.flag, "kind": a.kind, "choices": a.choices, "aliases": a.aliases} for a in args],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


# --------------------------------------------------------------------------- checks against FACTS.md


FACTS_033_KV_DTYPES = [
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "octave_k3v4",
    "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit", "int4_per_token_head", "int8_per_token_head",
    "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
]  # fmt: skip


def check_against_facts(entries: dict[str, dict[str, Any]]) -> list[str]:
    """Disagreements between the extraction and the checked facts (empty when all agree)."""
    problems: list[str] = []

    def flags(version: str) -> set[str]:
        return {f for names in entries[version]["flags"].values() for f in names}

    if "0.33.0" in entries:
        got = entries["0.33.0"]["facts"].get("kv_cache_dtypes", {}).get("value")
        if got != FACTS_033_KV_DTYPES:
            problems.append(f"0.33.0 kv_cache_dtypes {got} != FACTS.md {FACTS_033_KV_DTYPES}")
        util = entries["0.33.0"]["facts"].get("gpu_memory_utilization_default", {}).get("value")
        if util != 0.92:
            problems.append(f"0.33.0 default gpu_memory_utilization {util} != 0.92")
        for flag in ("--kv-offloading-size", "--kv-offloading-backend", "--numa-bind", "--numa-bind-nodes",
                     "--numa-bind-cpus", "--cpu-offload-gb", "--cpu-offload-params", "--kv-cache-memory-bytes",
                     "--spec-method", "--spec-model", "--spec-tokens", "--speculative-config"):  # fmt: skip
            if flag not in flags("0.33.0"):
                problems.append(f"0.33.0 lacks {flag}")
        if "--swap-space" in flags("0.33.0"):
            problems.append("0.33.0 still has --swap-space")
    if "0.34.0" in entries:  # FACTS.md, "vLLM 0.27-0.34"
        entry = entries["0.34.0"]
        for flag in ("--enable-extensible-kv-cache", "--max-num-queued-reqs", "--max-num-queued-tokens"):
            if flag not in flags("0.34.0"):
                problems.append(f"0.34.0 lacks {flag}")
        for flag in ("--calculate-kv-scales", "--enable-bf16x3-router-gemm", "--max-num-partial-prefills",
                     "--max-long-partial-prefills", "--override-attention-dtype"):  # fmt: skip
            if flag in flags("0.34.0"):
                problems.append(f"0.34.0 still has {flag}")
        if "VLLM_USE_V2_MODEL_RUNNER" in entry["env"] or "VLLM_ENGINE_ITERATION_TIMEOUT_S" in entry["env"]:
            problems.append("0.34.0 still reads VLLM_USE_V2_MODEL_RUNNER or VLLM_ENGINE_ITERATION_TIMEOUT_S")
        if "download-kernels" not in entry["facts"].get("subcommands", {}).get("value", []):
            problems.append("0.34.0 lacks `vllm download-kernels`")
        if len(entry["facts"].get("checkpoint_routes", {}).get("value", [])) != 3:
            problems.append("0.34.0 lacks the /checkpoint routes")
    for version in entries:
        has_swap = "--swap-space" in flags(version)
        if _version_key(version) < (0, 18) and not has_swap:
            problems.append(f"{version} lacks --swap-space")
    return problems


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", nargs="+", default=list(RELEASES), help="releases to read (default: all)")
    parser.add_argument(
        "--source-cache",
        type=Path,
        default=None,
        help="keep each release's vllm/**/*.py under DIR/VERSION and reuse it on later runs",
    )
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE_PATH)
    parser.add_argument("--fake-args-dir", type=Path, default=FAKE_ARGS_DIR)
    options = parser.parse_args(argv)

    entries: dict[str, dict[str, Any]] = {}
    if options.catalogue.is_file() and set(options.versions) != set(RELEASES):
        entries = json.loads(options.catalogue.read_text())["versions"]  # partial run: update in place
    fake: dict[str, tuple[list[Arg], str]] = {}
    for version in options.versions:
        cached = options.source_cache / version if options.source_cache else None
        meta_file = cached / "wheel.json" if cached else None
        if cached and meta_file and meta_file.is_file():
            meta = json.loads(meta_file.read_text())
            source = Source(root=cached)
            took = 0.0
        else:
            with tempfile.TemporaryDirectory(prefix=f"vllm-{version}-") as tmp:
                wheel, took = download_wheel(version, Path(tmp))
                meta = {"wheel": wheel.name, "sha256": sha256(wheel), "bytes": wheel.stat().st_size}
                files = python_files(wheel)
                wheel.unlink()  # ~400 MB: gone before the next download
            if cached and meta_file:
                for rel, data in files.items():
                    (cached / rel).parent.mkdir(parents=True, exist_ok=True)
                    (cached / rel).write_bytes(data)
                meta_file.write_text(json.dumps(meta))
            source = Source(files=files)
        args, facts, notes = extract(version, source)
        entries[version] = catalogue_entry(version, meta["wheel"], meta["sha256"], args, facts, source=source)
        print(
            f"{version}: {len(args)} flags from {len(source.read_paths)} files"
            + (f", wheel {meta['bytes'] / 1e6:.0f} MB in {took:.1f} s" if took else " (cached sources)"),
            flush=True,
        )
        for note in notes:
            print(f"  note: {note}")
        if version in FAKE_VERSIONS:
            fake[version] = (args, meta["wheel"])

    write_catalogue(entries, options.catalogue)
    print(f"wrote {options.catalogue}")
    for version, (fake_args, wheel_name) in fake.items():
        path = options.fake_args_dir / f"vllm_args_{'.'.join(version.split('.')[:2])}.json"
        write_fake_args(version, fake_args, wheel_name, path)
        print(f"wrote {path}")

    print("\nplanner flags per release (+ present, - absent):")
    print("version   " + " ".join(f.removeprefix("--")[:12].ljust(12) for f in PLANNER_FLAGS))
    for version in sorted(entries, key=_version_key):
        present = {f for names in entries[version]["flags"].values() for f in names}
        print(f"{version:<9} " + " ".join(("+" if f in present else "-").ljust(12) for f in PLANNER_FLAGS))

    problems = check_against_facts(entries)
    for problem in problems:
        print(f"DISAGREES WITH FACTS.md: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    shutil.disk_usage(tempfile.gettempdir())  # fail early on a missing temp dir
    sys.exit(main())
