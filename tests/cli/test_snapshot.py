"""`dankserve snapshot list|rm` through the real CLI, and the store's edge against hostile contents:
a corrupt, truncated or huge manifest, symlinks, a store open to others; LRU eviction; atomic manifests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.errors import EnvironmentUnusable, InvalidInput
from dankserve.snapshot.store import (
    MANIFEST,
    evict,
    list_entries,
    read_entry,
    record_restore,
    remove,
    store_root,
    write_manifest,
)
from dankserve.testing.config_file import write_config


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = write_config(
        tmp_path / "dankserve.toml",
        {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)},
        {"a": {"model": "o/m", "runtime": "process"}},
    )
    env = {k: v for k, v in os.environ.items() if k != "DANKSERVE_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), "snapshot", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def capture(root: Path, name: str, *, size: int = 100, used: float = 1000.0) -> None:
    (root / name / "images").mkdir(parents=True)
    (root / name / "images" / "pages-1.img").write_bytes(b"x" * size)
    write_manifest(root, name, {"captured_at": used, "last_used": used, "last_restore_seconds": None})


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "state").mkdir(mode=0o700)
    r = store_root(tmp_path / "state")
    r.mkdir(mode=0o700)
    return r


def test_list_and_rm_through_the_cli(tmp_path: Path, root: Path) -> None:
    capture(root, "a", size=4096)
    (root / "half" / "images").mkdir(parents=True)  # a capture killed before its manifest
    done = cli(tmp_path, "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["deployment"]: r for r in json.loads(done.stdout)["snapshots"]}
    assert rows["a"]["state"] == "ready" and rows["a"]["bytes"] >= 4096 and rows["a"]["captured_at"]
    assert rows["half"]["state"] == "incomplete"
    listed = cli(tmp_path, "list").stdout.splitlines()
    assert listed[0].split() == ["DEPLOYMENT", "STATE", "SIZE", "CAPTURED", "LAST", "RESTORE", "PATH"]
    assert [line.split()[:2] for line in listed[1:]] == [["a", "ready"], ["half", "incomplete"]]
    assert cli(tmp_path, "rm", "a").returncode == 0 and not (root / "a").exists()
    gone = cli(tmp_path, "rm", "a")
    assert gone.returncode == 2 and "no snapshot of 'a'" in gone.stderr and "Traceback" not in gone.stderr
    assert cli(tmp_path, "rm", "../state").returncode == 2


def test_list_without_a_store_is_empty(tmp_path: Path) -> None:
    done = cli(tmp_path, "list", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["snapshots"] == []


def test_a_store_open_to_others_is_refused_with_exit_3(tmp_path: Path, root: Path) -> None:
    root.chmod(0o755)
    done = cli(tmp_path, "list")
    assert done.returncode == 3 and "0755" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(EnvironmentUnusable):
        list_entries(root)


def test_a_symlinked_store_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    state = tmp_path / "s"
    state.mkdir()
    store_root(state).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(EnvironmentUnusable):
        list_entries(store_root(state))


@pytest.mark.parametrize(
    "manifest",
    [
        b"{",
        b"",
        b"[]",
        b'{"schema": 1, "deployment": "other"}',
        b'{"schema":1,"deployment":"a","captured_at":"x"}',
        b"[" * 100_000,
        b'{"schema":1,"deployment":"a","captured_at":1e400,"last_used":1}',
    ],
)
def test_corrupt_or_truncated_manifests_are_corrupt_not_a_crash(root: Path, manifest: bytes) -> None:
    capture(root, "a")
    (root / "a" / MANIFEST).write_bytes(manifest)
    entry = read_entry(root, "a")
    assert entry.state == "corrupt" and entry.reason


def test_huge_manifest_and_symlinks_are_never_followed(root: Path, tmp_path: Path) -> None:
    capture(root, "a")
    with (root / "a" / MANIFEST).open("wb") as f:
        f.truncate(10 << 20)
    assert read_entry(root, "a").state == "corrupt"
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "keep").write_text("x")
    (root / "link").symlink_to(secret)
    assert read_entry(root, "link").state == "corrupt"
    capture(root, "b")
    (root / "b" / "images" / "out").symlink_to(secret)
    assert remove(root, "link") and remove(root, "b")
    assert (secret / "keep").exists()


def test_rm_refuses_names_that_leave_the_store(root: Path) -> None:
    for bad in ("..", "a/b", ".hidden", ""):
        with pytest.raises(InvalidInput):
            remove(root, bad)


def test_restore_recorded_and_lru_eviction(root: Path) -> None:
    capture(root, "old", size=1000, used=1.0)
    capture(root, "new", size=1000, used=3.0)
    capture(root, "mid", size=1000, used=2.0)
    record_restore(root, "old", seconds=1.5, now=4.0)  # a restore makes it the most recently used
    assert read_entry(root, "old").last_restore_seconds == 1.5
    (root / "half").mkdir()  # incomplete: goes first
    assert evict(root, max_bytes=3000, incoming_bytes=1500) == ("half", "mid", "new")
    assert [e.deployment for e in list_entries(root)] == ["old"]


def test_the_manifest_is_written_atomically(root: Path) -> None:
    capture(root, "a")
    assert not list((root / "a").glob(".*.tmp"))
    assert (root / "a" / MANIFEST).stat().st_mode & 0o777 == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_entries_and_stores_of_another_owner_are_not_trusted(root: Path) -> None:
    capture(root, "a")
    os.chown(root / "a", 12345, 12345)
    entry = read_entry(root, "a")
    assert entry.state == "corrupt" and "uid 12345" in (entry.reason or "")
    capture(root, "b")
    os.chown(root / "b" / MANIFEST, 12345, 12345)
    assert read_entry(root, "b").state == "corrupt"
    os.chown(root, 12345, 12345)
    with pytest.raises(EnvironmentUnusable, match="uid 12345"):
        list_entries(root)
