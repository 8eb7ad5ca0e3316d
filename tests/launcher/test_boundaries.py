"""The launcher runs in the image's own Python: it may import the standard library and itself only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

LAUNCHER = Path(__file__).resolve().parents[2] / "dankserve" / "launcher"


def test_the_launcher_imports_only_the_standard_library() -> None:
    """Every import in dankserve/launcher is a standard-library module or a relative import of its own."""
    for path in sorted(LAUNCHER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level > 0:
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{path.name} imports {name}"


def test_the_launcher_parses_as_python_3_10() -> None:
    """No syntax newer than the oldest Python a vLLM image may have (3.10)."""
    for path in sorted(LAUNCHER.glob("*.py")):
        ast.parse(path.read_text(), str(path), feature_version=(3, 10))
