"""Size limits (issue 27): no module in dankserve/ over 700 lines and no class over 300, tables of data
aside."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 700
CLASS_LINES = 300
DATA_TABLES = {"dankserve/bootlog/patterns.py"}
"""Tables of data (vLLM's log patterns per era): long by nature, no logic to split."""


def sizes() -> dict[str, int]:
    """Lines of every module of dankserve (by path) and of every class (path::Class)."""
    out: dict[str, int] = {}
    for path in sorted((ROOT / "dankserve").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        source = path.read_text()
        out[name] = source.count("\n")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                out[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_module_or_class_is_over_its_limit() -> None:
    """Modules stay within 700 lines and classes within 300."""
    over = {}
    for name, lines in sizes().items():
        limit = CLASS_LINES if "::" in name else MODULE_LINES
        if lines > limit and name not in DATA_TABLES:
            over[name] = lines
    assert over == {}, f"over the size limits (module {MODULE_LINES}, class {CLASS_LINES} lines): {over}"
