"""pyproject.toml as setuptools reads it (issue 39, low): the license is an SPDX string, which setuptools 77 and
later take without the "`project.license` as a TOML table is deprecated" warning every build printed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def test_the_license_is_an_spdx_string_and_setuptools_new_enough_to_read_it() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    (setuptools,) = [r for r in PYPROJECT["build-system"]["requires"] if r.startswith("setuptools")]
    match = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert match is not None and int(match.group(1)) >= 77, setuptools


def test_dankserve_testing_reads_nothing_under_tests_and_ships_its_recorded_hosts() -> None:
    """`dankserve.testing` serves the demo, try-it and users' own tests from an installed package: it imports
    nothing from `tests`, names no path under it, and its recorded hosts are package data."""
    import ast

    from dankserve.testing import HOSTS_DIR, recorded_host_names

    package = Path(__file__).resolve().parents[1] / "dankserve"
    for module in (package / "testing").rglob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert (node.module or "").split(".")[0] != "tests", f"{module} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] != "tests" for a in node.names), f"{module} imports tests"
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # a path built with / "tests"
                parts = [n.value for n in (node.left, node.right) if isinstance(n, ast.Constant)]
                assert "tests" not in parts, f"{module} builds a path under tests/"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith(("tests/", "./tests/")), (module, node.value)
    assert HOSTS_DIR.is_relative_to(package) and recorded_host_names()
    shipped = PYPROJECT["tool"]["setuptools"]["package-data"]["dankserve"]
    assert f"{HOSTS_DIR.relative_to(package).as_posix()}/*.json" in shipped
