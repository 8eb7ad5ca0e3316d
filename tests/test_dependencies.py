"""The base install declares every third-party package that dankserve imports at run time."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Imported only where an optional extra is installed (cluster: Ray; snapshot: cuda-bindings, imported on
# the first GPU checkpoint action) or inside shipped test helpers.
OPTIONAL = {"ray", "cuda"}


def imported_top_level_modules(package: Path) -> dict[str, Path]:
    """Each absolutely imported top-level module of the package's code (dankserve/testing left out)."""
    found: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        if "testing" in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path)
    return found


def declared_distributions() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in project["dependencies"]}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """Each third-party module imported under dankserve/ (but dankserve/testing) comes from a package in
    [project.dependencies], so `pip install .` without extras can run every command."""
    declared = declared_distributions()
    owners = packages_distributions()
    missing = []
    for module, where in sorted(imported_top_level_modules(REPO / "dankserve").items()):
        if module in sys.stdlib_module_names or module == "dankserve" or module in OPTIONAL:
            continue
        distributions = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if not distributions & declared:
            missing.append(f"{module} (imported in {where.relative_to(REPO)}; from {sorted(distributions)})")
    assert not missing, "imported but not in [project.dependencies]: " + "; ".join(missing)
