"""The reason a failed `criu restore` gives (dankserve/snapshot/criu.py): the restored task's own error,
said in the user's terms where it is one a restore meets in practice (no CRIU needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dankserve.snapshot.criu import _reason

RLIMIT = "Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted"
SUMMARY = "Error (criu/cr-restore.c:1265): 29618 exited, status=1\nError (criu/cr-restore.c:2331): Restoring FAILED."


@pytest.mark.parametrize(
    ("task_error", "said"),
    [
        (
            " 29618: Error (criu/files-reg.c:2175): File tmp/x/server.log has bad size 9379 (expect 8407)",
            "the file /tmp/x/server.log changed size since the capture",
        ),
        ("Error (criu/cr-restore.c:1237): Can't fork for 28373: File exists", "pid 28373 is taken by another process"),
        (" 77: Error (criu/files-reg.c:2100): Can't open file dev/shm/seg on restore", "the file /dev/shm/seg is gone"),
        (" 77: Error (criu/x.c:1): something new", "77: Error (criu/x.c:1): something new"),
    ],
)
def test_the_cause_is_named_not_criu_s_summary(tmp_path: Path, task_error: str, said: str) -> None:
    log = tmp_path / "restore.log"
    log.write_text(f"{RLIMIT}\n(00.1) info\n{task_error}\n{SUMMARY}\n")
    reason = _reason(log, "")
    assert said in reason
    assert "RLIMIT" not in reason and "status=1" not in reason


def test_without_a_log_the_output_is_read(tmp_path: Path) -> None:
    assert "taken" in _reason(tmp_path / "none.log", "Error (criu/cr-restore.c:1237): Can't fork for 5: File exists")


def test_a_link_remap_in_the_way_of_a_dump_is_named_before_criu_s_last_error(tmp_path: Path) -> None:
    """A `link_remap.N` left in /dev/shm (a failed restore's, another dump's) fails a dump with "File exists";
    CRIU's last error line ("Collect mappings ... failed") says nothing of it."""
    log = tmp_path / "dump.log"
    log.write_text(
        f"{RLIMIT}\nWarn  (criu/files-reg.c:1881): Can't link  -> ./dev/shm/link_remap.44\n"
        "Error (criu/files-reg.c:1159): Can't link remap to /dev/shm/sem.RUGAxW: File exists\n"
        "Error (criu/cr-dump.c:1440): Collect mappings (pid: 329454) failed with -1\n"
        "Error (criu/cr-dump.c:1975): Dumping FAILED.\n"
    )
    reason = _reason(log, "")
    assert reason.startswith("a link_remap file another dump or a failed restore left in /dev/shm is in the way")
    assert "/dev/shm/sem.RUGAxW" in reason


def test_a_full_disk_is_named_not_the_parasite_line_after_it(tmp_path: Path) -> None:
    """The dump.log of the H100 run (session 18, docs/hardware/h100x1-snapshot/8b-daemon-dump-enospc.log): the
    last error line ("Can't dump page with parasite") hid the cause."""
    log = tmp_path / "dump.log"
    log.write_text(
        f"{RLIMIT}\nWarn  (compel/arch/x86/src/lib/infect.c:419): Will restore 788 with interrupted system call\n"
        "Error (criu/page-xfer.c:263): page-xfer: Unable to spice data: No space left on device\n"
        "Error (criu/mem.c:718): Can't dump page with parasite\nError (criu/cr-dump.c:1975): Dumping FAILED.\n"
    )
    reason = _reason(log, "")
    assert reason.startswith("the disk holding the snapshot store is full")
    assert "No space left on device" in reason and "parasite" not in reason
