"""Security: a hostile Hub (or the mirror HF_ENDPOINT names) cannot make `dankserve pull` or the
daemon's own download write outside the HF cache, nor count bytes other than the listed ones as a
complete file; its failures, and the network's, end in exit 3 with the reason and the fix, never
an internal error; a pull from a shell leaves the cache owner-only.

The Hub is the stand-in (dankserve/testing/hub.py) on loopback, a repo's `misbehaviour` making it
hostile; the pull is the real `dankserve pull` (and the real daemon) through the real
huggingface_hub client.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dankserve.testing.hub import Misbehaviour, StandInHub
from tests.harness.daemon import free_port, process_deployment, running_daemon
from tests.harness.faults import fill, small_tmpfs
from tests.harness.hub import SMALL_CONFIG, hub_env
from tests.harness.modes import modes_not_private
from tests.harness.wait import holds_within

pytestmark = pytest.mark.slow

WEIGHTS = bytes(range(256)) * 3 + bytes(232)  # 1000 bytes
MIB = 1 << 20


def weights_repo(hub: StandInHub, tmp_path: Path, **misbehaviour: Any) -> str:
    """A repo of this test with one LFS file, model.safetensors (1000 bytes), misbehaving as told."""
    repo = f"hostile/{tmp_path.name}"
    hub.add_file(repo, "model.safetensors", WEIGHTS, lfs=True)
    hub.repos[repo].misbehaviour = Misbehaviour(**misbehaviour)
    return repo


def victim(tmp_path: Path) -> Path:
    """A file outside the HF cache where a hostile answer would put the repo's file."""
    path = tmp_path / "victim" / "model.safetensors"
    path.parent.mkdir()
    path.write_text("precious")
    return path


def untouched(path: Path) -> bool:
    return not path.is_symlink() and path.read_text() == "precious"


def pull(
    hub: StandInHub, tmp_path: Path, model: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "dankserve.toml"
    config.write_text("")
    config.chmod(0o600)
    environ = {**os.environ, **hub_env(hub, tmp_path), **(env or {})}
    for key in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN", "NOTIFY_SOCKET"):
        environ.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), "pull", "--model", model, "-q"],
        capture_output=True,
        text=True,
        env=environ,
        timeout=180,
        check=False,
    )


def refused(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit 3 with each fragment in the message, and no traceback."""
    assert done.returncode == 3, done.stdout + done.stderr
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert "fix:" in done.stderr


def pull_recorded(tmp_path: Path) -> bool:
    pulls = tmp_path / "state" / "pulls"
    return pulls.is_dir() and any(pulls.iterdir())


@pytest.mark.parametrize("commit", ["../../../../victim", "{victim}"], ids=["relative", "absolute"])
def test_a_commit_id_that_is_a_path_writes_nothing_outside_the_cache(
    hub: StandInHub, tmp_path: Path, commit: str
) -> None:
    """A `sha` of `../..` or an absolute path: exit 3 naming the commit id; the file it aimed at is untouched."""
    target = victim(tmp_path)
    repo = weights_repo(hub, tmp_path, commit=commit.format(victim=target.parent))
    refused(pull(hub, tmp_path, repo), "the commit id", "not 40 hex digits", "HF_ENDPOINT")
    assert untouched(target)
    assert not pull_recorded(tmp_path)


def test_the_daemon_refuses_a_commit_id_that_is_a_path_and_keeps_running(hub: StandInHub, tmp_path: Path) -> None:
    """The daemon planning and downloading (`download = true`, no model_facts) from a Hub whose `sha` is a path:
    it starts, reports the refusal on the deployment, boots nothing, and writes nothing outside the cache."""
    target = victim(tmp_path)
    repo = f"hostile/{tmp_path.name}"
    hub.add_model(repo, SMALL_CONFIG, {"w": ("BF16", [1])})
    hub.repos[repo].misbehaviour = Misbehaviour(commit="../../../../victim")
    deployment = process_deployment(free_port(), model=repo, download=True)
    del deployment["model_facts"]
    with running_daemon(tmp_path, {"chat": deployment}, extra_env={"HF_ENDPOINT": hub.url}) as daemon:
        chat = daemon.wait_for("chat", lambda d: "not 40 hex digits" in (d["message"] or ""), timeout=30)
        assert chat["boots"] == 0
        assert daemon.proc is not None and daemon.proc.poll() is None
    assert untouched(target)


NAMES = [
    ("absolute", "{victim}"),
    ("dot-dot", "../../../../../victim/model.safetensors"),
    ("nul", "a\x00b.json"),
    ("backslash", "a\\b.json"),
    ("dot", "./model.json"),
]


@pytest.mark.parametrize("name", [n for _, n in NAMES], ids=[i for i, _ in NAMES])
def test_a_file_name_that_is_not_a_plain_relative_path_is_refused(hub: StandInHub, tmp_path: Path, name: str) -> None:
    """A listed name that is absolute, climbs with `..`, or holds a NUL, a backslash or a `.` segment: exit 3
    naming the file name, before anything is downloaded; the file it aimed at is untouched."""
    target = victim(tmp_path)
    repo = weights_repo(hub, tmp_path)
    hub.add_file(repo, name.format(victim=target), b"hostile")
    refused(pull(hub, tmp_path, repo), "the file name", "HF_ENDPOINT")
    assert untouched(target)
    assert not list((tmp_path / "hf").rglob("*.incomplete"))


def test_an_etag_that_is_not_a_plain_name_is_refused(hub: StandInHub, tmp_path: Path) -> None:
    """A 300-character ETag (it would name the blob): exit 3 naming the ETag, not an internal error."""
    repo = weights_repo(hub, tmp_path, etag="e" * 300)
    refused(pull(hub, tmp_path, repo), "ETag", "not a plain name")


@pytest.mark.parametrize("length_header", [True, False], ids=["content-length", "until-close"])
def test_a_body_longer_than_listed_is_never_written_past_the_listed_size(
    hub: StandInHub, tmp_path: Path, length_header: bool
) -> None:
    """The server sends 64 MiB for a 1000-byte file (announced, or until it closes): exit 3, and no file in
    the cache ever holds more than the 1000 listed bytes."""
    repo = weights_repo(hub, tmp_path, body_bytes=64 * MIB, length_header=length_header)
    refused(pull(hub, tmp_path, repo), "the 1000 bytes the repo lists" if not length_header else "the repo lists")
    sizes = [p.stat().st_size for p in (tmp_path / "hf").rglob("*") if p.is_file() and not p.is_symlink()]
    assert max(sizes, default=0) <= len(WEIGHTS)
    assert not pull_recorded(tmp_path)


def test_an_oversized_leftover_and_an_honest_416_do_not_count_as_complete(hub: StandInHub, tmp_path: Path) -> None:
    """A 5 MB `.incomplete` left for a 1000-byte file (the Hub answers its range 416): it is discarded and the
    file downloaded again, with the listed bytes."""
    repo = weights_repo(hub, tmp_path)
    sha256 = hub.repos[repo].files["model.safetensors"].sha256
    blobs = tmp_path / "hf" / "hub" / f"models--{repo.replace('/', '--')}" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{sha256}.incomplete").write_bytes(b"\xee" * 5_000_000)
    done = pull(hub, tmp_path, repo)
    assert done.returncode == 0, done.stdout + done.stderr
    snapshot = next((blobs.parent / "snapshots").iterdir())
    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


def test_a_head_without_size_and_a_short_body_do_not_count_as_complete(hub: StandInHub, tmp_path: Path) -> None:
    """A HEAD naming no size and a GET of 500 of the listed 1000 bytes: exit 3 saying so, no pull record, no
    file in the snapshot; the next pull (the Hub honest again) completes it."""
    repo = weights_repo(hub, tmp_path, head_without_size=True, body_bytes=500)
    refused(pull(hub, tmp_path, repo), "after 500 of the 1000 bytes", "resumes")
    assert not pull_recorded(tmp_path)
    assert not list((tmp_path / "hf").rglob("snapshots/*/model.safetensors"))
    hub.repos[repo].misbehaviour = Misbehaviour()
    done = pull(hub, tmp_path, repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert next((tmp_path / "hf").rglob("snapshots/*/model.safetensors")).read_bytes() == WEIGHTS


def test_bytes_that_do_not_match_the_listed_sha256_are_refused(hub: StandInHub, tmp_path: Path) -> None:
    """1000 bytes of the listed size but another sha256 (an LFS file): exit 3 naming both hashes; nothing kept."""
    repo = weights_repo(hub, tmp_path, corrupt=True)
    refused(pull(hub, tmp_path, repo), "sha256", hub.repos[repo].files["model.safetensors"].sha256 or "")
    kept = [p for p in (tmp_path / "hf").rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert kept == []
    assert not pull_recorded(tmp_path)


# --- the network's and the disk's failures: each its message, its fix, exit 3 ------------------------------


def test_a_stalled_download_exits_3_naming_the_stall_and_the_timeout(hub: StandInHub, tmp_path: Path) -> None:
    """100 bytes, then silence: after HF_HUB_DOWNLOAD_TIMEOUT seconds, exit 3 saying it stalled and what to set."""
    repo = weights_repo(hub, tmp_path, stall_after=100)
    done = pull(hub, tmp_path, repo, env={"HF_HUB_DOWNLOAD_TIMEOUT": "2"})
    refused(done, "stalled", "HF_HUB_DOWNLOAD_TIMEOUT", "resumes")


@pytest.mark.parametrize(
    ("location", "expected"),
    [("http://127.0.0.1:{closed}/blob", "Connection refused"), ("file:///etc/passwd", "not an http(s) URL")],
    ids=["refused", "not-http"],
)
def test_a_redirect_that_cannot_be_followed_exits_3_with_the_reason(
    hub: StandInHub, tmp_path: Path, location: str, expected: str
) -> None:
    """The CDN redirect to a closed port, or to a file: URL: exit 3 with the reason, nothing read or written."""
    repo = weights_repo(hub, tmp_path, redirect_to=location.format(closed=free_port()))
    refused(pull(hub, tmp_path, repo), expected)


def test_the_disk_margin_holds_while_writing(hub: StandInHub, tmp_path: Path) -> None:
    """The disk fills while a pull writes (another writer takes it all): the pull stops with exit 3 naming the
    disk and the fix, not an internal error at ENOSPC."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    repo = f"hostile/{tmp_path.name}"
    hub.add_large_file(repo, "model.safetensors", 24 * MIB)
    hub.repos[repo].bytes_per_second = 4 * MIB
    with small_tmpfs(tmp_path / "disk", size=f"{1024 + 48}m") as disk:  # room for the file and the 1 GiB margin
        env = {**os.environ, **hub_env(hub, tmp_path), "DANKSERVE_HF_CACHE_DIR": str(disk / "hf")}
        env.pop("NOTIFY_SOCKET", None)
        config = tmp_path / "dankserve.toml"
        config.write_text("")
        config.chmod(0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dankserve", "--config", str(config), "pull", "--model", repo, "-q"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            # the transfer writes 8 MiB at a time: the first write has landed, two are to come
            started = holds_within(lambda: any(p.stat().st_size for p in disk.rglob("*.incomplete")), timeout=30)
            assert started, proc.communicate(timeout=60)
            filler = fill(disk)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        filler.unlink()
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), "hf_cache_dir to a larger one")


# --- a pull from a shell ------------------------------------------------------------------------------------


def test_a_pull_from_a_shell_leaves_the_hf_cache_owner_only(hub: StandInHub, tmp_path: Path) -> None:
    """`dankserve pull` under a login shell's umask 022: every dir it made is 0700 and every file 0600."""
    repo = weights_repo(hub, tmp_path)
    old_umask = os.umask(0o022)
    try:
        done = pull(hub, tmp_path, repo)
    finally:
        os.umask(old_umask)
    assert done.returncode == 0, done.stdout + done.stderr
    assert modes_not_private(tmp_path / "hf") == []
    assert modes_not_private(tmp_path / "state") == []
