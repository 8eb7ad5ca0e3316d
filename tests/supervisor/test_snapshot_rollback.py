"""The snapshot kept for an upgrade's rollback (issue 41), against a real store on disk: the verdict keeps the
old image's snapshot aside as NAME@previous only while a switched upgrade can roll back to it, takes it back
when a plan it is valid for boots, and deletes it once no upgrade rolls back to it; `snapshot = "off"` and
`dankserve snapshot rm NAME` delete it with NAME's. (The rollback's restore itself runs through the real daemon:
tests/supervisor/test_daemon_snapshot_restarts.py.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.process import ProcessRecord, ProcessRuntime
from dankserve.snapshot import criu, store
from dankserve.snapshot.gpu_stand_in import StandInGpuCheckpoint
from dankserve.snapshot.key import SnapshotKey
from dankserve.supervisor.worker import snapshots
from tests.supervisor.test_snapshot_verdict import _edge

pytestmark = pytest.mark.skipif(
    criu.criu_path() is None or os.geteuid() != 0, reason="the verdict asks CRIU first: needs it and root"
)
OLD = "sha256:" + "0" * 64


def _write(root: Path, name: str, key: SnapshotKey) -> None:
    """A ready entry captured from `key` as a capture writes it (its manifest names the owning deployment)."""
    owner = store.owner(name)
    (root / name / "images").mkdir(parents=True, mode=0o700)
    record = ProcessRecord(owner, 4242, 1.0, ("vllm", "serve"), {}, 1.0)
    manifest = {
        "schema": store.MANIFEST_SCHEMA,
        "deployment": owner,
        "captured_at": 1.0,
        "last_used": 1.0,
        "key": snapshots._key_json(key),
        "pids": [4242],
        "holders": [],
        "canary_ids": [1, 2],
        "record": record.to_json(),
        "sleeps": False,
    }
    (root / name / store.MANIFEST).write_text(json.dumps(manifest))


class Setup:
    def __init__(self, tmp_path: Path) -> None:
        self.edge, self.dep, self.plan = _edge(tmp_path, StandInGpuCheckpoint(tmp_path / "records"))
        self.runtime = ProcessRuntime(tmp_path / "procs")
        self.root = tmp_path / "state" / "snapshots"
        self.verdict("sha256:new")  # the store's root made, the key of the new image known
        key = self.edge._key
        assert key is not None
        self.new_key = key
        self.old_key = dataclasses.replace(key, image_digest=OLD)

    def verdict(self, digest: str, *, switched: bool = False, **changes: Any) -> Any:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        plan = dataclasses.replace(self.plan, **changes) if changes else self.plan
        return self.edge.verdict(self.dep, self.runtime, plan, digest, "0.33.0", upgrade_switched=switched)

    def names(self) -> dict[str, str]:
        return {e.deployment: e.state for e in store.list_entries(self.root)}


def test_a_switched_upgrade_keeps_the_old_images_snapshot_aside_then_the_rollback_takes_it_back(
    tmp_path: Path,
) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat", s.old_key)
    verdict = s.verdict("sha256:new", switched=True)
    assert verdict.state == "absent" and "chat@previous" in verdict.reason
    assert s.names() == {"chat@previous": "ready"}, "kept, its manifest still naming chat"
    _write(s.root, "chat", s.new_key)  # the new image captured
    assert s.verdict("sha256:new", switched=True).state == "ready"
    assert s.names() == {"chat": "ready", "chat@previous": "ready"}
    rolled_back = s.verdict(OLD)
    assert rolled_back.state == "ready" and "kept from before the upgrade" in rolled_back.reason
    assert s.names() == {"chat": "ready"}
    captured = snapshots.read_captured(s.root / "chat")
    assert captured is not None and captured.key.image_digest == OLD


def test_the_kept_snapshot_goes_once_no_upgrade_rolls_back_to_it(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat@previous", s.old_key)
    _write(s.root, "chat", s.new_key)
    assert s.verdict("sha256:new", switched=True).state == "ready"
    assert "chat@previous" in s.names(), "the switched upgrade can still roll back"
    assert s.verdict("sha256:new").state == "ready"  # the upgrade final (e.g. a reload naming the new image)
    assert s.names() == {"chat": "ready"}


def test_a_later_upgrade_supersedes_the_kept_snapshot(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat@previous", dataclasses.replace(s.old_key, image_digest="sha256:" + "1" * 64))
    _write(s.root, "chat", s.old_key)
    assert s.verdict("sha256:new", switched=True).state == "absent"
    kept = snapshots.read_captured(s.root / "chat@previous")
    assert kept is not None and kept.key.image_digest == OLD, "the image just left is the one kept"
    assert s.names() == {"chat@previous": "ready"}


def test_a_snapshot_invalid_for_another_reason_than_the_image_is_deleted_even_when_switched(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat", s.new_key)
    verdict = s.verdict("sha256:new", switched=True, argv=("o/m", "--max-num-seqs", "8"))
    assert verdict.state == "absent" and verdict.discarded == "the plan's arguments changed since the capture"
    assert s.names() == {}


def test_a_corrupt_kept_snapshot_is_deleted(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    (s.root / "chat@previous").mkdir(mode=0o700)
    (s.root / "chat@previous" / "manifest.json").write_text("{not json")
    assert s.verdict("sha256:new", switched=True).state == "absent"
    assert s.names() == {}


def test_snapshot_off_deletes_the_kept_one_too(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat@previous", s.old_key)
    _write(s.root, "chat", s.new_key)
    verdict = s.edge.verdict(s.dep.model_copy(update={"snapshot": "off"}), s.runtime, s.plan, "sha256:new", "0.33.0")
    assert verdict.state == "off" and s.names() == {}


def test_snapshot_rm_deletes_a_deployments_kept_snapshot_with_its_own(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat@previous", s.old_key)
    _write(s.root, "chat", s.new_key)
    config = tmp_path / "dankserve.toml"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(config), "snapshot", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    listed = json.loads(cli("list", "--json").stdout)["snapshots"]
    assert {e["deployment"]: e["state"] for e in listed} == {"chat": "ready", "chat@previous": "ready"}
    assert "chat@previous" in cli("list").stdout
    done = cli("rm", "chat@previous")
    assert done.returncode == 0 and s.names() == {"chat": "ready"}, done.stderr
    _write(s.root, "chat@previous", s.old_key)
    done = cli("rm", "chat")
    assert done.returncode == 0 and "chat, chat@previous" in done.stdout and s.names() == {}
    assert cli("rm", "chat").returncode == 2


def test_the_kept_snapshot_counts_in_the_disk_budget(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "chat@previous", s.old_key)
    (s.root / "chat@previous" / "images" / "pages.img").write_bytes(b"\0" * 4096)
    assert store.evict(s.root, max_bytes=1024, keep="chat") == ("chat@previous",)


def test_a_kept_entry_whose_manifest_names_another_deployment_is_corrupt(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    _write(s.root, "other@previous", s.old_key)
    (s.root / "other@previous").rename(s.root / "chat@previous")
    entry = store.read_entry(s.root, "chat@previous")
    assert entry.state == "corrupt" and "not a manifest of this deployment" in (entry.reason or "")
