"""The import graph: no cycle between modules or packages, and every package imports only what
docs/ARCHITECTURE.md's direction table allows; the runtime imports nothing of what decides.

Every import counts: at module level, inside functions (a lazy import is still a dependency) and
under TYPE_CHECKING (a type is one too)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dankserve"
RUNTIME = PACKAGE / "runtime"
ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
FORBIDDEN = ("dankserve.supervisor", "dankserve.plan", "dankserve.planning", "dankserve.state", "dankserve.host")
TABLE = re.compile(r"<!-- import-directions:begin.*?-->(.*?)<!-- import-directions:end -->", re.S)


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def modules() -> dict[str, Path]:
    """Every module of dankserve by its dotted name (a package by its __init__)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _targets(module: str, path: Path) -> Iterator[str]:
    """The dotted names each import of `module` reaches (`from a import b`: a.b, which may be a name in a)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            yield from (f"{base}.{alias.name}" for alias in node.names)


def module_graph() -> dict[str, set[str]]:
    """module -> the dankserve modules it imports (a name resolves to the innermost module holding it)."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        reached = {resolve(target) for target in _targets(module, path)}
        graph[module] = {r for r in reached if r is not None and r not in (module, "dankserve")}
    return graph


def unit(module: str) -> str:
    """The package a module belongs to: `supervisor` for dankserve.supervisor.machine.driver, `state` for
    dankserve.state."""
    return module.split(".")[1]


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        if module == "dankserve":
            continue
        graph.setdefault(unit(module), set()).update(unit(t) for t in imported if unit(t) != unit(module))
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def documented_directions() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's direction table: `| `package` | `a`, `b` |` rows (`-` for none)."""
    match = TABLE.search(ARCHITECTURE.read_text())
    assert match is not None, "docs/ARCHITECTURE.md has no import-directions table"
    table: dict[str, set[str]] = {}
    for line in match.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        for package in re.findall(r"`([\w.]+)`", cells[0]):
            table[package] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return table


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: str(p.relative_to(RUNTIME)))
def test_runtime_modules_import_no_decision_or_state_module(path: Path) -> None:
    """runtime/**/*.py imports none of supervisor, plan, planning, state or host (DESIGN.md's directions)."""
    bad = {name for name in imported_modules(path) if name.startswith(FORBIDDEN)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_no_module_imports_itself_back() -> None:
    """No cycle between modules, counting imports inside functions and under TYPE_CHECKING."""
    assert cycles(module_graph()) == []


def test_no_package_imports_itself_back() -> None:
    """No cycle between packages (a top-level module counts as one), counting every import."""
    assert cycles(package_graph()) == []


def test_every_package_imports_what_the_architecture_doc_draws() -> None:
    """Each package's imports are exactly the arrows docs/ARCHITECTURE.md's direction table draws for it."""
    documented = documented_directions()
    actual = package_graph()
    assert sorted(documented) == sorted(actual), "a package missing from (or extra in) the table"
    wrong = {
        package: {"undocumented": sorted(actual[package] - arrows), "not imported": sorted(arrows - actual[package])}
        for package, arrows in documented.items()
        if arrows != actual[package]
    }
    assert not wrong, f"docs/ARCHITECTURE.md's import directions are not the imports: {wrong}"


SUPERVISOR = PACKAGE / "supervisor"
WINGS = re.compile(r"<!-- supervisor-directions:begin.*?-->(.*?)<!-- supervisor-directions:end -->", re.S)
TOP_LEVEL_MODULES = 20


def wing(module: str) -> str | None:
    """The wing of a supervisor module (`fleet` for dankserve.supervisor.fleet.coordinator), or the top-level
    module's own name (`records`); None outside the supervisor and for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["dankserve", "supervisor"] or len(parts) < 3:
        return None
    return parts[2]


def wing_graph() -> dict[str, set[str]]:
    """wing or top-level module of supervisor/ -> the others it imports."""
    graph: dict[str, set[str]] = {}
    for module, imported in module_graph().items():
        own = wing(module)
        if own is None:
            continue
        reached = {wing(target) for target in imported}
        graph.setdefault(own, set()).update(w for w in reached if w is not None and w != own)
    return graph


def documented_wing_directions() -> dict[str, set[str]]:
    """docs/ARCHITECTURE.md's supervisor-directions table, read like the package table."""
    match = WINGS.search(ARCHITECTURE.read_text())
    assert match is not None, "docs/ARCHITECTURE.md has no supervisor-directions table"
    table: dict[str, set[str]] = {}
    for line in match.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        for name in re.findall(r"`([\w.]+)`", cells[0]):
            table[name] = set(re.findall(r"`([\w.]+)`", cells[1]))
    return table


def test_the_supervisor_has_at_most_20_modules_at_its_top_level() -> None:
    """supervisor/ is wings (folders) over a shared ground: at most 20 .py files directly in it, __init__ counted."""
    top = sorted(path.name for path in SUPERVISOR.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules at supervisor/'s top level: {top}"


def test_no_supervisor_wing_imports_itself_back() -> None:
    """No cycle between the supervisor's wings and top-level modules, counting every import."""
    assert cycles(wing_graph()) == []


def test_every_supervisor_wing_imports_what_the_architecture_doc_draws() -> None:
    """Each wing's (and top-level module's) imports among the others are exactly the arrows of
    docs/ARCHITECTURE.md's supervisor-directions table: an import against the arrows fails here."""
    documented = documented_wing_directions()
    actual = wing_graph()
    assert sorted(documented) == sorted(actual), "a wing or top-level module missing from (or extra in) the table"
    wrong = {
        name: {"undocumented": sorted(actual[name] - arrows), "not imported": sorted(arrows - actual[name])}
        for name, arrows in documented.items()
        if arrows != actual[name]
    }
    assert not wrong, f"docs/ARCHITECTURE.md's supervisor directions are not the imports: {wrong}"


def test_an_import_against_the_arrows_is_caught() -> None:
    """The check is not vacuous: a worker importing the control wing would be both undocumented and a cycle."""
    graph = {name: set(arrows) for name, arrows in wing_graph().items()}
    graph["worker"].add("control")
    assert any({"worker", "control"} <= set(component) for component in cycles(graph))
    assert "control" not in documented_wing_directions()["worker"]
