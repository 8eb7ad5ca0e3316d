"""The pid waits around a restore with host pids (dankserve/snapshot/steps.py): what a failed `criu restore`
made is ended, a stranger holding one of the tree's pids never is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dankserve.processes import gone_or_zombie
from dankserve.snapshot.steps import end_failed_restore, free_pids
from tests.harness.wait import wait_until

TREE = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\ntime.sleep(60)\n"


def _tree() -> tuple[subprocess.Popen[bytes], int]:
    """A leader of its own process group with one forked child: (leader, child pid)."""
    leader = subprocess.Popen([sys.executable, "-c", TREE], start_new_session=True)
    children = Path(f"/proc/{leader.pid}/task/{leader.pid}/children")
    found = wait_until(lambda: children.read_text().split(), 10, what="the forked child")
    return leader, int(found[0])


def test_a_failed_restores_tree_is_ended_and_a_stranger_left_alone() -> None:
    leader, child = _tree()
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        end_failed_restore([leader.pid, child, stranger.pid], wait_s=10)
        assert gone_or_zombie(leader.pid) and gone_or_zombie(child), "nothing of the tree runs"
        assert stranger.poll() is None, "the stranger holding a pid is untouched"
        leader.wait(10)
        assert stranger.pid in free_pids([leader.pid, child, stranger.pid], wait_s=10), "it holds its pid: at once"
    finally:
        stranger.kill()
        stranger.wait()
        leader.kill()
        leader.wait()


def test_no_pids_is_nothing_to_do() -> None:
    end_failed_restore([])
    assert free_pids([]) == []
