"""Rules the suite keeps about itself: no test waits with a bare `time.sleep` (docs/TESTING.md, "Waiting in tests").

A wait for something polls it (`wait_until`); time that is the point of a test is said as such (`hold_for`,
`stays_true`, `first_problem`), all in tests/harness/wait.py. A sleep inside the source of a child process
(a string the test runs) is that child's behaviour, not a wait of the test, and is not a call here.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

WAITING_HELPERS = TESTS / "harness"
"""Where sleeping is allowed: the wait helpers themselves and the harness's own retry loops."""

NOT_YET_CONVERTED: dict[str, str] = {}
"""Files (relative to tests/) still allowed bare sleeps, with why. Keep it short: an entry whose file no longer
sleeps fails the rule too, so the list only shrinks."""


def bare_sleeps(source: str) -> list[int]:
    """The lines of `time.sleep(...)` calls (also `sleep(...)` imported from time) in a module's source."""
    tree = ast.parse(source)
    from_time = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "time"
        for alias in node.names
        if alias.name == "sleep"
    }
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "sleep"
            and isinstance(func.value, ast.Name)
            and func.value.id == "time"
        ) or (isinstance(func, ast.Name) and func.id in from_time):
            lines.append(node.lineno)
    return sorted(lines)


def test_bare_sleeps_are_found_as_calls_only() -> None:
    """Calls through the module or a `from time import sleep` count; a child's source in a string does not."""
    source = (
        "import time\nfrom time import sleep as nap\n"
        "time.sleep(1)\nnap(2)\nCHILD = 'import time; time.sleep(60)'\nasleep = 'time.sleep(3)'\n"
    )
    assert bare_sleeps(source) == [3, 4]


def test_no_test_waits_with_a_bare_sleep() -> None:
    """Outside tests/harness, a test polls for what it waits for, or says why time itself is the point."""
    found = {}
    for path in sorted(TESTS.rglob("*.py")):
        if path.is_relative_to(WAITING_HELPERS):
            continue
        lines = bare_sleeps(path.read_text())
        if lines:
            found[path.relative_to(TESTS).as_posix()] = lines
    offending = {name: lines for name, lines in found.items() if name not in NOT_YET_CONVERTED}
    assert not offending, (
        f"bare time.sleep in tests: {offending}; wait for the thing with tests.harness.wait.wait_until, or, where "
        "the time itself is the scenario, use hold_for(seconds, why) / stays_true(...) (docs/TESTING.md)"
    )
    stale = sorted(set(NOT_YET_CONVERTED) - set(found))
    assert not stale, f"these files no longer sleep: take them off NOT_YET_CONVERTED in {Path(__file__).name}: {stale}"
