"""The files a snapshot keeps beside its images (dankserve/snapshot/shm.py): the link-remap files CRIU's
dump made of the tree's deleted /dev/shm files, found by inode (only this dump's), names checked as hostile
input, put back with their mode, and those a failed restore did not consume deleted (never another's)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from dankserve.snapshot import shm


def test_a_mapped_deleted_file_is_found_by_inode_and_only_its_link_remap_is_this_dump_s(tmp_path: Path) -> None:
    held = tmp_path / "sem.tmp"
    held.write_bytes(b"\0" * 32)
    with held.open("r+b") as handle:
        mapped = mmap.mmap(handle.fileno(), 32)
        os.link(held, tmp_path / "link_remap.7")  # as CRIU's --link-remap does at the dump
        os.link(held, tmp_path / "sem.final")  # the name glibc's sem_open links it to
        held.unlink()
        (tmp_path / "link_remap.8").write_bytes(b"another tree's")
        try:
            inodes = shm.deleted_inodes([os.getpid()], tmp_path)
            assert (tmp_path / "link_remap.7").stat().st_ino in inodes
            assert shm.link_remaps(inodes, tmp_path) == ("link_remap.7",), "not another dump's"
        finally:
            mapped.close()


@pytest.mark.parametrize("name", ["link_remap.1", "link_remap.123456789012"])
def test_link_remap_names(name: str) -> None:
    assert shm.is_link_remap(name)


@pytest.mark.parametrize("name", ["link_remap.", "link_remap.x", "link_remap.1/..", "xlink_remap.1", "link_remap.1e3"])
def test_what_is_not_a_link_remap_name(name: str) -> None:
    assert not shm.is_link_remap(name)


def test_put_back_keeps_the_mode_and_a_failed_restore_s_leftovers_go_but_not_another_s(tmp_path: Path) -> None:
    saved, target = tmp_path / "saved", tmp_path / "shm"
    saved.mkdir()
    target.mkdir()
    for name in ("link_remap.3", "link_remap.4", "seg"):
        (saved / name).write_bytes(name.encode())
        (saved / name).chmod(0o644)
    put = shm.put_back(["link_remap.3", "link_remap.4", "seg"], saved, target)
    assert set(put) == {"link_remap.3", "link_remap.4"}, "only link-remaps are cleared after a restore"
    assert ((target / "seg").stat().st_mode & 0o777) == 0o644, "CRIU checks the mode it saw"
    (target / "link_remap.3").unlink()  # consumed by a restore
    (target / "link_remap.4").unlink()
    (target / "link_remap.4").write_bytes(b"another dump's, made since")
    shm.clear_remaps(put, target)
    assert (target / "link_remap.4").read_bytes() == b"another dump's, made since"
    put = shm.put_back(["link_remap.3"], saved, target)
    shm.clear_remaps(put, target)  # a failed restore did not consume it
    assert not (target / "link_remap.3").exists()


def test_a_hostile_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a shared-memory segment"):
        shm.put_back(["../etc"], tmp_path, tmp_path)


def test_turns_are_taken_one_at_a_time_on_the_host(tmp_path: Path) -> None:
    """Two dumps at once would meet each other's `link_remap.N`: the second waits for the first."""
    import threading

    from tests.harness.wait import stays_true, wait_until

    order: list[str] = []
    release = threading.Event()

    def first() -> None:
        with shm.turn(shm=tmp_path):
            order.append("first in")
            release.wait(30)
            order.append("first out")

    def second() -> None:
        wait_until(lambda: order, 30, what="the first turn")
        with shm.turn(shm=tmp_path):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    stays_true(lambda: "second in" not in order, 0.5, what="the second turn waiting")
    release.set()
    for t in threads:
        t.join(30)
    assert order == ["first in", "first out", "second in"]


def test_a_turn_held_too_long_fails_with_the_reason(tmp_path: Path) -> None:
    import fcntl

    from dankserve.errors import EnvironmentUnusable

    with (tmp_path / shm.TURN_FILE).open("w") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(EnvironmentUnusable, match="another capture or restore held"), shm.turn(0.2, tmp_path):
            pass


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a file of another uid")
def test_a_turn_file_another_local_user_made_is_refused_not_waited_on(tmp_path: Path) -> None:
    """/dev/shm is world-writable: a file another user planted (to hold the lock forever) is refused."""
    from dankserve.errors import EnvironmentUnusable

    planted = tmp_path / shm.TURN_FILE
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)
    with pytest.raises(EnvironmentUnusable, match="belongs to uid 65534") as refused, shm.turn(5, tmp_path):
        pass
    assert "remove" in (refused.value.fix or "")
    planted.unlink()
    planted.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvironmentUnusable, match="cannot open"), shm.turn(5, tmp_path):
        pass


def test_an_unfinished_dumps_link_remaps_are_deleted_by_its_noted_inodes_only(tmp_path: Path) -> None:
    """A daemon killed between the dump and the manifest: the entry's note names the tree's deleted inodes, and
    only the link-remap files of those go (another dump's, of another inode, stays; so do other files)."""
    dev = tmp_path / "shm"
    entry = tmp_path / "entry"
    dev.mkdir()
    entry.mkdir()
    (dev / "sem.ours").write_bytes(b"x")
    (dev / "sem.theirs").write_bytes(b"y")
    os.link(dev / "sem.ours", dev / "link_remap.3")
    os.link(dev / "sem.theirs", dev / "link_remap.4")
    shm.note_dump(entry, frozenset({(dev / "sem.ours").stat().st_ino}))
    assert (entry / shm.DUMP_NOTE).stat().st_mode & 0o777 == 0o600
    assert shm.clear_left_dump(entry, dev) == ("link_remap.3",)
    assert sorted(p.name for p in dev.iterdir()) == ["link_remap.4", "sem.ours", "sem.theirs"]
    shm.dump_noted(entry)
    assert not (entry / shm.DUMP_NOTE).exists() and shm.clear_left_dump(entry, dev) == ()


@pytest.mark.parametrize("note", [b"garbage", b'{"a": 1}', b"[true]", b'["1"]', b"[" + b"1," * 40000 + b"1]"])
def test_a_hostile_dump_note_is_ignored(tmp_path: Path, note: bytes) -> None:
    dev = tmp_path / "shm"
    dev.mkdir()
    (dev / "link_remap.1").write_bytes(b"x")
    (tmp_path / shm.DUMP_NOTE).write_bytes(note.replace(b"1", str((dev / "link_remap.1").stat().st_ino).encode(), 1))
    assert shm.clear_left_dump(tmp_path, dev) == ()
    assert (dev / "link_remap.1").exists()


def test_a_dump_note_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    dev = tmp_path / "shm"
    dev.mkdir()
    (dev / "link_remap.1").write_bytes(b"x")
    (tmp_path / "elsewhere").write_text(f"[{(dev / 'link_remap.1').stat().st_ino}]")
    (tmp_path / shm.DUMP_NOTE).symlink_to(tmp_path / "elsewhere")
    assert shm.clear_left_dump(tmp_path, dev) == ()
