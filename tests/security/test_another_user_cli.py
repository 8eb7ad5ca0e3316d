"""The CLI run by another local user against a daemon's state dir (0700, root's), as a person on a shared box
would: each command says whose files they are and to run it as that user (exit 3), never a traceback, a
"not running" it cannot know, an empty log read as "no logs", or a fix that deletes root's snapshots.
Found using it (issue 41's closing round): `snapshot list` was an "internal error", `down` said "dankserve
is not running" of a daemon it could not see, `logs` printed nothing with exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dankserve.errors import NotTheDaemonsUser
from dankserve.logsources import journal_available
from dankserve.snapshot.store import MANIFEST, read_entry, store_root, write_manifest
from dankserve.supervisor.instance import LOCK_NAME
from dankserve.testing.config_file import write_config
from tests.harness.cli import REPO
from tests.harness.users import unprivileged_user

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def box() -> Iterator[tuple[Path, Run]]:
    """A root-owned 0700 state dir with a lock, a snapshot and a daemon.log, a config the user may read, and
    the CLI run as the tests' unprivileged user."""
    user = unprivileged_user()
    with tempfile.TemporaryDirectory() as top:  # pytest's tmp_path is root's alone: the user could not reach it
        Path(top).chmod(0o755)
        state = Path(top) / "state"
        state.mkdir(mode=0o700)
        (state / LOCK_NAME).touch(mode=0o600)
        (state / "daemon.log").write_text("2026-12-06 00:00:00 root's secret line\n")
        store = store_root(state)
        store.mkdir(mode=0o700)
        (store / "a" / "images").mkdir(parents=True)
        write_manifest(store, "a", {"captured_at": 1.0, "last_used": 1.0, "last_restore_seconds": None})
        config = write_config(
            Path(top) / "dankserve.toml",
            {"state_dir": str(state), "cache_dir": top, "hf_cache_dir": top},
            {"a": {"model": "o/m", "runtime": "process"}},
        )
        config.chmod(0o644)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
        env["PYTHONPATH"] = str(REPO)

        def as_user(*args: str) -> subprocess.CompletedProcess[str]:
            argv = user.argv([sys.executable, "-m", "dankserve", "--config", str(config), *args])
            return subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/", timeout=120, check=False)

        yield state, as_user
        assert (store / "a" / MANIFEST).is_file() and read_entry(store, "a").state == "ready"  # nothing touched


def _told_to_run_as_the_daemons_user(done: subprocess.CompletedProcess[str], problem: str) -> None:
    assert done.returncode == 3, done.stdout + done.stderr
    assert problem in done.stderr, done.stderr
    assert f"fix: {NotTheDaemonsUser.FIX}" in done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["snapshot", "list"], "the snapshot store {state}/snapshots cannot be read by uid"),
        (["snapshot", "list", "--json"], "the snapshot store {state}/snapshots cannot be read by uid"),
        (["snapshot", "rm", "a"], "the snapshot store {state}/snapshots cannot be read by uid"),
        (["down"], "cannot tell whether a daemon runs: {state}/daemon.lock is closed to uid"),
        (["status"], "cannot reach the daemon's control socket {state}/control.sock: permission denied"),
        (["restart", "a"], "cannot reach the daemon's control socket"),
        (["logs", "--previous", "a"], "cannot read the daemon's logs: its state dir {state} is closed to uid"),
    ],
)
def test_a_closed_state_dir(box: tuple[Path, Run], args: list[str], problem: str) -> None:
    state, as_user = box
    _told_to_run_as_the_daemons_user(as_user(*args), problem.format(state=state))


def test_logs_of_a_closed_state_dir_read_the_journal_alone_or_say_why_nothing(box: tuple[Path, Run]) -> None:
    state, as_user = box
    done = as_user("logs")
    assert "secret line" not in done.stdout
    if journal_available():
        assert done.returncode == 0, done.stderr
        assert f"note: {state} is closed to uid" in done.stderr and "the journal's lines only" in done.stderr
    else:
        _told_to_run_as_the_daemons_user(done, f"its state dir {state} is closed to uid")


def test_an_open_state_dir_with_roots_private_store_and_lock(box: tuple[Path, Run]) -> None:
    """The state dir readable (0755), the store and the lock root's own: the fix never says to delete them."""
    state, as_user = box
    state.chmod(0o755)
    for args in (["snapshot", "list"], ["snapshot", "rm", "a"]):
        done = as_user(*args)
        _told_to_run_as_the_daemons_user(done, f"the snapshot store {state}/snapshots belongs to uid 0, not")
        assert "rm -rf" not in done.stderr
    _told_to_run_as_the_daemons_user(as_user("down"), f"{state}/daemon.lock is closed to uid")
