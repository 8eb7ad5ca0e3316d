"""Security: the daemon keeps its state and caches only in directories of its own. A state dir (or
cache dir, or HF cache) that another user owns or may write is refused at start with exit 3 naming
it and the fix, before anything is written there; nothing is written through a symlink there.

Round 2 found a root daemon writing its pid through a symlink an unprivileged user had planted in
a state dir the user owned (into a root-owned file), the user free to rename `state.json`, and a
`state_dir` that was a symlink into a shared 1777 directory chmod-ed to 0700. The user is made in
the test (useradd); the daemon is a real `dankserve run` with the stand-in as a process server.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.testing.config_file import write_config
from tests.harness.daemon import free_port, process_deployment, write_host
from tests.harness.users import unprivileged_user

pytestmark = pytest.mark.slow


def run_daemon(tmp_path: Path, **dirs: str) -> subprocess.CompletedProcess[str]:
    """`dankserve run` with these dirs; a daemon that starts (the old behaviour) is stopped after 20 s."""
    settings = {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache"),
        "hf_cache_dir": str(tmp_path / "hf"),
        "vllm_version": "0.33.0",
        **dirs,
    }
    config = write_config(tmp_path / "dankserve.toml", settings, {"chat": process_deployment(free_port())})
    env = {**os.environ}
    env.pop("NOTIFY_SOCKET", None)
    argv = [sys.executable, "-m", "dankserve", "--config", str(config), "run"]
    argv += ["--hardware", str(write_host(tmp_path / "host.json"))]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        err = "the daemon started\n" + err
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_a_state_dir_of_another_user_is_refused_and_its_symlinks_not_written_through(tmp_path: Path) -> None:
    """The user's state dir holding their symlink daemon.pid.tmp -> a root-owned file: exit 3 naming the state
    dir; the root-owned file keeps its content and the user's state.json is not touched."""
    user = unprivileged_user()
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "daemon.pid.tmp").symlink_to(victim)
    (state / "state.json").write_text("{}")
    for path in (state, state / "state.json"):
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    done = run_daemon(tmp_path)
    assert done.returncode == 3, done.stderr
    assert f"state_dir {state} is owned by uid {user.uid}" in done.stderr and "fix: chown" in done.stderr
    assert victim.read_text() == "precious\n"
    assert (state / "state.json").read_text() == "{}" and not (state / "daemon.pid").exists()


def test_a_state_dir_linked_into_a_shared_sticky_dir_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    """state_dir a symlink to a 1777 directory: exit 3 naming it as writable by others; its mode stays 1777."""
    unprivileged_user()  # root only: the shared dir is root's, as /tmp is
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (tmp_path / "state").symlink_to(shared)
    done = run_daemon(tmp_path)
    assert done.returncode == 3, done.stderr
    assert "is writable by its group and others (mode 1777)" in done.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []


@pytest.mark.parametrize("key", ["cache_dir", "hf_cache_dir"])
def test_a_cache_dir_another_user_owns_is_refused(tmp_path: Path, key: str) -> None:
    """The compile cache or the HF cache owned by another user (they could swap what the server loads):
    exit 3 naming the key."""
    user = unprivileged_user()
    cache = tmp_path / "theirs"
    cache.mkdir()
    os.chown(cache, user.uid, user.gid)
    done = run_daemon(tmp_path, **{key: str(cache)})
    assert done.returncode == 3, done.stderr
    assert f"{key} {cache} is owned by uid {user.uid}" in done.stderr


def test_a_group_writable_hf_cache_is_refused(tmp_path: Path) -> None:
    """An HF cache its group may write (mode 0775): exit 3 naming the mode."""
    unprivileged_user()
    cache = tmp_path / "shared-hf"
    cache.mkdir()
    cache.chmod(0o775)
    done = run_daemon(tmp_path, hf_cache_dir=str(cache))
    assert done.returncode == 3, done.stderr
    assert "hf_cache_dir" in done.stderr and "writable by its group (mode 0775)" in done.stderr
