"""room.py: the image's estimate from /proc and the pure verdict on it."""

from __future__ import annotations

from pathlib import Path

from dankserve.snapshot.room import GIB, shortfall, tree_image_bytes


def test_the_estimate_counts_anonymous_and_shared_memory_not_file_pages(tmp_path: Path) -> None:
    for pid, anon, shmem in ((7, 1000, 24), (9, 3, 0)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_bytes(
            f"Name:\tx\nVmRSS:\t99999 kB\nRssAnon:\t{anon} kB\nRssFile:\t55555 kB\nRssShmem:\t{shmem} kB\n".encode()
        )
    assert tree_image_bytes([7, 9, 11], proc=tmp_path) == (1000 + 24 + 3) * 1024, "a gone pid counts nothing"


def test_hostile_status_lines_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_bytes(b"RssAnon:\n" + b"RssAnon:\t-5 kB\nRssShmem:\tlots kB\n" + b"x" * 10**6)
    assert tree_image_bytes([7], proc=tmp_path) == 0


def test_the_verdict_names_the_budget_or_the_free_space_and_keeps_a_margin() -> None:
    fs = 100 * GIB
    assert shortfall(4 * GIB, 50 * GIB, fs, 64 * GIB) is None
    over = shortfall(74 * GIB, 500 * GIB, fs, 64 * GIB)
    assert over is not None and "about 74.0 GiB" in over and "over snapshot_max_bytes (64.0 GiB)" in over
    full = shortfall(40 * GIB, 44 * GIB, fs, None)
    assert full is not None and "has 44.0 GiB free and 5.0 GiB stay free" in full, "5% of 100 GiB kept free"
    assert shortfall(2 * GIB, 4 * GIB + 1, 10 * GIB, None) is None, "at least 2 GiB kept free"
    assert shortfall(2 * GIB + 1, 4 * GIB, 10 * GIB, None) is not None
