"""A dankserve installation of its own for `dankserve install` tests: a venv (made by the standard library's
venv, no pip) whose site-packages points at a copy of this checkout's source (as `make setup`'s editable
install does) and at the test run's own dependencies, with a `dankserve` console script."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Installation:
    venv: Path
    source: Path
    """The checkout copy the venv imports dankserve from (package, units/, config/)."""

    @property
    def executable(self) -> Path:
        return self.venv / "bin" / "dankserve"

    @property
    def site_packages(self) -> Path:
        found = sorted((self.venv / "lib").glob("python3*/site-packages"))
        return found[0]

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`dankserve ARGS...` from this installation, without this shell's PYTHONPATH (as a unit runs it)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DANKSERVE_CONFIG")}
        return subprocess.run(
            [str(self.executable), *args], capture_output=True, text=True, timeout=timeout, check=False, env=env
        )


def make_installation(place: Path) -> Installation:
    """A venv at place/venv importing dankserve from place/src (a copy of the checkout's package and templates)."""
    source = place / "src"
    source.mkdir(parents=True)
    shutil.copytree(REPO / "dankserve", source / "dankserve", ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("units", "config"):
        shutil.copytree(REPO / part, source / part)
    venv = place / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True, timeout=120)
    installation = Installation(venv, source)
    deps = sysconfig.get_paths()["purelib"]  # this test run's own dependencies (click, pydantic ...)
    (installation.site_packages / "deps.pth").write_text(f"{deps}\n")
    (installation.site_packages / "__editable__.dankserve.pth").write_text(f"{source}\n")
    python = f"{venv}/bin/python"
    # As pip writes it: a `#!` line ends at a blank, so such an interpreter is started through /bin/sh.
    trampoline = f"#!/bin/sh\n'''exec' {shlex.quote(python)} \"$0\" \"$@\"\n' '''\n"
    start = trampoline if " " in python else f"#!{python}\n"
    installation.executable.write_text(f"{start}import sys\nfrom dankserve.cli.main import main\nsys.exit(main())\n")
    installation.executable.chmod(0o755)
    return installation


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """`chown -R uid:gid top` (links themselves, never what they name)."""
    os.chown(top, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def checkout_outside_tmp() -> pytest.MarkDecorator:
    """Skip a test that installs units running this checkout's code when the checkout is under /tmp: the unit
    (PrivateTmp=yes) could not see that code, so `install` refuses it, rightly (tests/cli/test_install_paths.py
    covers that refusal). CI's clone and `make test` from a usual checkout run these."""
    from dankserve.cli.install import under_private_tmp

    return pytest.mark.skipif(
        under_private_tmp(REPO), reason=f"the checkout {REPO} is under /tmp, which a PrivateTmp=yes unit cannot see"
    )
