"""What dankserve says of a config file it will not trust (issue 39, low): the rule it checks (writable by its
owner only, owned by root or the reading user; 0644 is fine, 0600 is not required), and whom the file decides
for: the user who runs dankserve, not "root" when someone else runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dankserve.testing import HOSTS_DIR
from tests.harness.cli import REPO
from tests.harness.users import LocalUser, unprivileged_user

DEPLOYMENT = '[deployments.chat]\nmodel = "m"\n[deployments.chat.model_facts]\nparameter_bytes = 2_000_000_000\n'
HOST = HOSTS_DIR / "h200x2-vm-real.json"


def _plan(config: Path, argv_prefix: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [*argv_prefix, sys.executable, "-m", "dankserve", "--config", str(config), "plan", "--hardware", str(HOST)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=120,
        check=False,
    )


def test_a_group_writable_config_of_another_user_names_that_user_and_a_0644_one_is_accepted() -> None:
    user = unprivileged_user()
    with tempfile.TemporaryDirectory() as top:  # pytest's tmp_path is root's alone: the user could not reach it
        Path(top).chmod(0o755)
        home = Path(top) / "home"
        home.mkdir()
        os.chown(home, user.uid, user.gid)
        _check(home, user)


def _check(home: Path, user: LocalUser) -> None:
    config = home / "dankserve.toml"
    config.write_text(DEPLOYMENT)
    os.chown(config, user.uid, user.gid)
    config.chmod(0o664)

    refused = _plan(config, user.argv([]))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"config file {config} is writable by its group (mode 0664)" in refused.stderr
    assert f"decides what dankserve runs as you (uid {user.uid})" in refused.stderr and "as root" not in refused.stderr
    assert "writable by its owner only (0600, 0640 or 0644 are fine)" in refused.stderr
    assert f"fix: chmod go-w {config} && chown {user.uid} {config}" in refused.stderr

    config.chmod(0o644)
    accepted = _plan(config, user.argv([]))
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
