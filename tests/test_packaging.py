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
