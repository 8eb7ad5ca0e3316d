"""Issue 39.9 through the real `dankserve install`: the unit reads the config install wrote (`--config-dir`),
its `Documentation=` names only what install puts in place, and an installation under /tmp (which the
unit, with PrivateTmp=yes, does not see) is refused; a config there is warned about."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.cli import dankserve_cli
from tests.harness.installs import checkout_outside_tmp, make_installation

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _install(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ("--unit-dir", str(tmp_path / "units"), "--man-dir", str(tmp_path / "man"), "--no-enable", *extra)
    return dankserve_cli(tmp_path / "unused.toml", "install", *args)


def _exec_start(unit: Path) -> list[str]:
    line = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))


@checkout_outside_tmp()
@needs_analyze
def test_the_unit_reads_the_config_install_wrote(tmp_path: Path) -> None:
    config_dir = tmp_path / "etc dir"
    done = _install(tmp_path, "--config-dir", str(config_dir))
    assert done.returncode == 0, done.stderr
    written = config_dir / "dankserve.toml"
    assert f"wrote {written}" in done.stdout and written.is_file()
    assert "PrivateTmp=yes and will not see" in done.stderr  # pytest's tmp_path is under /tmp
    for name, verb in (("dankserve.service", "run"), ("dankserve-auto-update.service", "upgrade")):
        unit = tmp_path / "units" / name
        words = _exec_start(unit)
        assert words[1:4] == ["--config", str(written), verb], words
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
        )
        assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr


@checkout_outside_tmp()
def test_documentation_names_only_what_install_puts_in_place(tmp_path: Path) -> None:
    assert _install(tmp_path).returncode == 0
    for unit in (tmp_path / "units").iterdir():
        for line in unit.read_text().splitlines():
            if not line.startswith("Documentation="):
                continue
            for reference in line.removeprefix("Documentation=").split():
                page = re.fullmatch(r"man:([a-z-]+)\((\d)\)", reference)
                assert page, f"{unit.name}: {reference} is no man page install writes"
                assert (tmp_path / "man" / f"{page[1]}.{page[2]}").is_file(), reference


def test_an_installation_under_tmp_is_refused(tmp_path: Path) -> None:
    """A checkout and venv under /tmp: the unit's private /tmp is empty, so ExecStart= would name nothing."""
    if os.geteuid() != 0:
        pytest.skip("root's units: run as root")
    installation = make_installation(tmp_path / "checkout")
    done = installation.run(
        "--config", str(tmp_path / "c.toml"), "install", "--unit-dir", str(tmp_path / "units"), "--no-enable"
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{installation.executable} is under /tmp or /var/tmp" in done.stderr and "PrivateTmp" in done.stderr
    assert not (tmp_path / "units").exists()
