"""Tests for dankserve.cli.install: the installed unit verifies cleanly and is hardened."""

import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dankserve.cli.install import UNIT_TEMPLATE, command, dankserve_executable, render_unit
from tests.harness.installs import checkout_outside_tmp

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _installed_unit(tmp_path: Path) -> Path:
    result = CliRunner().invoke(
        command,
        [
            *("--unit-dir", str(tmp_path / "units"), "--config-dir", str(tmp_path / "etc")),
            *("--man-dir", str(tmp_path / "man"), "--no-enable"),
        ],
    )
    assert result.exit_code == 0, result.output
    return tmp_path / "units" / "dankserve.service"


def test_exec_start_points_at_this_installation() -> None:
    """The rendered unit runs this installation's dankserve."""
    text = render_unit(UNIT_TEMPLATE.read_text(), "/opt/x/bin/dankserve")
    assert "ExecStart=/opt/x/bin/dankserve run\n" in text


@checkout_outside_tmp()
def test_install_writes_unit_and_private_example_config(tmp_path: Path) -> None:
    """install writes the unit and an example config readable by root only, keeping an existing one."""
    unit = _installed_unit(tmp_path)
    config = tmp_path / "etc" / "dankserve.toml"
    assert unit.is_file()
    assert config.stat().st_mode & 0o777 == 0o600
    config.write_text("# mine\n")
    _installed_unit(tmp_path)
    assert config.read_text() == "# mine\n"


@checkout_outside_tmp()
@needs_analyze
def test_installed_unit_verifies_silently(tmp_path: Path) -> None:
    """systemd-analyze verify prints nothing for the installed unit."""
    unit = _installed_unit(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
    )
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr


@checkout_outside_tmp()
@needs_analyze
def test_installed_unit_exposure_is_at_most_4_5(tmp_path: Path) -> None:
    """systemd-analyze security rates the installed unit at 4.5 or lower."""
    unit = _installed_unit(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)], capture_output=True, text=True, check=False
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert match, done.stdout[-500:] + done.stderr
    assert float(match.group(1)) <= 4.5


def test_executable_is_found() -> None:
    """The dankserve script of the running venv is found."""
    assert Path(dankserve_executable()).name == "dankserve"


def test_the_unit_raises_the_descriptor_limit() -> None:
    """The unit gives the daemon room for many descriptors (a peer holding connections must not cause EMFILE)."""
    match = re.search(r"^LimitNOFILE=(\d+)$", UNIT_TEMPLATE.read_text(), re.MULTILINE)
    assert match and int(match.group(1)) >= 65536


@checkout_outside_tmp()
def test_install_writes_a_man_page_for_every_command(tmp_path: Path) -> None:
    """`dankserve install` writes dankserve.1 naming every command, and each command's page naming the command
    and each of its options."""
    from dankserve.cli.main import COMMANDS, cli

    _installed_unit(tmp_path)
    man = tmp_path / "man"
    top = (man / "dankserve.1").read_text()
    for name in COMMANDS:
        page = (man / f"dankserve-{name}.1").read_text()
        assert f".B dankserve {name.replace('-', chr(92) + '-')}" in page
        assert f"dankserve\\-{name.replace('-', chr(92) + '-')}" in top
        command_ = cli.get_command(click.Context(cli), name)
        assert command_ is not None
        for param in command_.params:
            if isinstance(param, click.Option):
                assert param.opts[-1].replace("-", "\\-") in page, (name, param.opts)


def test_without_a_checkout_the_unit_and_example_come_from_the_packages_share_dir(tmp_path: Path) -> None:
    """A plain `pip install .` has no units/ or config/ beside the package: their copies under share/dankserve."""
    from dankserve.cli.install import shipped

    shared = tmp_path / "share"
    assert shipped(tmp_path / "absent" / "units" / "dankserve.service", shared) == shared / "dankserve.service"
    assert shipped(UNIT_TEMPLATE, shared) == UNIT_TEMPLATE  # the checkout's own file first


@checkout_outside_tmp()
def test_install_writes_the_daily_auto_update_timer_and_its_service(tmp_path: Path) -> None:
    """The timer fires daily with a randomized delay (as podman-auto-update.timer); its service runs this
    installation's `dankserve upgrade --auto`."""
    unit = _installed_unit(tmp_path)
    timer = (unit.parent / "dankserve-auto-update.timer").read_text()
    service = (unit.parent / "dankserve-auto-update.service").read_text()
    assert "OnCalendar=daily\n" in timer and re.search(r"^RandomizedDelaySec=\d+$", timer, re.MULTILINE)
    config = tmp_path / "etc" / "dankserve.toml"
    assert f"ExecStart={dankserve_executable()} --config {config} upgrade --auto\n" in service


@checkout_outside_tmp()
@needs_analyze
def test_installed_auto_update_units_verify_silently(tmp_path: Path) -> None:
    """systemd-analyze verify prints nothing for the timer and its service."""
    unit = _installed_unit(tmp_path)
    names = ("dankserve-auto-update.timer", "dankserve-auto-update.service")
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(unit.parent / n) for n in names)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.stdout.strip() == "" and done.stderr.strip() == "", done.stdout + done.stderr
