"""The runtime executes what it is handed: it imports nothing of the supervisor, planner, state or host."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[2] / "dankserve" / "runtime"
FORBIDDEN = ("dankserve.supervisor", "dankserve.plan", "dankserve.planning", "dankserve.state", "dankserve.host")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: str(p.relative_to(RUNTIME)))
def test_runtime_modules_import_no_decision_or_state_module(path: Path) -> None:
    """runtime/**/*.py imports none of supervisor, plan, planning, state or host (DESIGN.md's directions)."""
    bad = {name for name in imported_modules(path) if name.startswith(FORBIDDEN)}
    assert not bad, f"{path.name} imports {sorted(bad)}"
