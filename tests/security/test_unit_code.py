"""Issue 38.5: the root unit and the daily auto-update service must not run code another user can change.

`dankserve install` wrote `ExecStart=` to whatever venv ran it, and the documented by-hand path was
`make setup` as a login user (an editable install): that user then ran code as root at the next start.
Each test makes an installation of its own (tests/harness/installs.py), gives part of it to another
local user (or opens it to them), and runs the real `dankserve install` and `dankserve doctor` from it.
Issue 38.12: an ExecStart= path with blanks or `%` is quoted, one word as systemd reads it."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.testing import HOSTS_DIR
from tests.harness.installs import REPO, Installation, checkout_outside_tmp, chown_tree, make_installation
from tests.harness.users import LocalUser, unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the checks are about root's units: run as root")


@pytest.fixture
def place() -> Iterator[Path]:
    """A root-owned 0755 directory outside /tmp (the unit's PrivateTmp would hide /tmp), with a blank in its
    name so every ExecStart= path needs quoting."""
    (REPO / "build").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="unit code %i ", dir=REPO / "build"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _install(installation: Installation, target: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return installation.run(
        "--config",
        str(target / "etc" / "dankserve.toml"),
        "install",
        *("--unit-dir", str(target / "units"), "--man-dir", str(target / "man"), "--no-enable"),
        *extra,
    )


def _refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 3, done.stdout + done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def _exec_start(unit: Path) -> list[str]:
    line = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))


def test_a_venv_a_login_user_owns_is_refused(place: Path, tmp_path: Path) -> None:
    """`make setup` as a login user: the venv (interpreter link, site-packages, script) is theirs."""
    user = unprivileged_user()
    installation = make_installation(place)
    chown_tree(installation.venv, user.uid, user.gid)
    done = _install(installation, tmp_path)
    _refused(done, f"{installation.venv}", f"owned by uid {user.uid}, not root", "sudo make -C /opt/dankserve setup")
    assert not (tmp_path / "units" / "dankserve.service").exists()


def test_an_editable_source_a_login_user_owns_is_refused(place: Path, tmp_path: Path) -> None:
    """A root-owned venv whose editable install points at a checkout the login user owns."""
    user = unprivileged_user()
    installation = make_installation(place)
    chown_tree(installation.source, user.uid, user.gid)
    _refused(_install(installation, tmp_path), f"{installation.source}", f"owned by uid {user.uid}, not root")


def test_a_directory_above_the_installation_that_others_may_write_is_refused(place: Path, tmp_path: Path) -> None:
    installation = make_installation(place)
    place.chmod(0o777)
    _refused(_install(installation, tmp_path), f"{place} is writable by others (mode 0777)")


def test_one_group_writable_module_in_site_packages_is_refused(place: Path, tmp_path: Path) -> None:
    installation = make_installation(place)
    planted = installation.site_packages / "sitecustomize.py"
    planted.write_text("")
    os.chown(planted, 0, 100)
    planted.chmod(0o664)
    _refused(_install(installation, tmp_path), f"{planted} is writable by its group (gid 100)")


def test_the_other_user_really_could_change_the_code_the_unit_runs(place: Path, tmp_path: Path) -> None:
    """What the refusal prevents: with the flag, install goes ahead (warning), and the other user then
    rewrites the script root's unit would run."""
    user = unprivileged_user()
    installation = make_installation(place)
    chown_tree(installation.venv, user.uid, user.gid)
    done = _install(installation, tmp_path, "--allow-untrusted-code")
    assert done.returncode == 0, done.stderr
    assert "warning: the units run" in done.stderr and f"owned by uid {user.uid}" in done.stderr
    assert _exec_start(tmp_path / "units" / "dankserve.service")[0] == str(installation.executable)
    _as(user, "sh", "-c", f"echo '# theirs' >> '{installation.executable}'")
    assert "# theirs" in installation.executable.read_text()


def test_doctor_fails_on_code_others_can_change_and_passes_once_root_owns_it(place: Path, tmp_path: Path) -> None:
    user = unprivileged_user()
    installation = make_installation(place)
    config = tmp_path / "dankserve.toml"
    config.write_text("")
    config.chmod(0o600)
    hardware = HOSTS_DIR / "h200x1-vm.json"
    chown_tree(installation.source, user.uid, user.gid)
    doctor = installation.run("--config", str(config), "doctor", "--hardware", str(hardware))
    assert doctor.returncode == 3, doctor.stdout + doctor.stderr
    assert "[fail] code the unit runs" in doctor.stdout and f"owned by uid {user.uid}" in doctor.stdout
    warned = installation.run("--config", str(config), "doctor", "--hardware", str(hardware), "--allow-untrusted-code")
    assert "[warn] code the unit runs" in warned.stdout, warned.stdout
    chown_tree(installation.source, 0, 0)
    doctor = installation.run("--config", str(config), "doctor", "--hardware", str(hardware))
    assert "[ok  ] code the unit runs" in doctor.stdout, doctor.stdout


@checkout_outside_tmp()
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_a_root_owned_installation_at_a_path_with_blanks_installs_and_verifies(place: Path, tmp_path: Path) -> None:
    """Root's own installation installs; its ExecStart= (a blank and a `%` in the path) is one quoted word
    that systemd-analyze verify accepts as an executable."""
    installation = make_installation(place)
    done = _install(installation, tmp_path)
    assert done.returncode == 0, done.stderr
    for name in ("dankserve.service", "dankserve-auto-update.service"):
        unit = tmp_path / "units" / name
        assert _exec_start(unit)[:3] == [str(installation.executable), "--config", str(tmp_path / "etc/dankserve.toml")]
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, check=False
        )
        assert verify.returncode == 0 and verify.stderr.strip() == "", verify.stderr


def _as(user: LocalUser, *command: str) -> None:
    subprocess.run(user.argv(command), check=True, capture_output=True, timeout=30)
