"""Downloading a model's files into the HF cache through huggingface_hub, with progress.

The repo's file list and sizes come from `model_info(files_metadata=True)` at one commit;
complete files are found with `try_to_load_from_cache` and skipped; the free disk is checked
against what is left to fetch (exit 3 naming the shortfall). Each missing file is resolved with
`get_hf_file_metadata` (ETag, size, the CDN location) and fetched (`transfer.download`) into
`blobs/ETAG.incomplete` from the size already there (a Range request): an interrupted pull
resumes where it stopped. (`hf_hub_download` of huggingface_hub 2.x writes to a
fresh temporary file each time, so it cannot resume across processes.) The blob then gets its
name and the snapshot its relative symlink: the cache layout huggingface_hub and vLLM read.
Progress is read from the blobs being written, so it needs no hook into huggingface_hub. Finally `refs/REVISION`
names the commit, as huggingface_hub and vLLM expect, and a record of the pull under the state
dir lets the daemon see a complete model without asking the Hub again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dankserve.errors import ConfigError, DiskSpaceShortfall, HubAnswerRefused
from dankserve.hub.access import HubAccess
from dankserve.hub.answers import (
    checked_commit,
    etag_problem,
    expected_size,
    file_name_problem,
    refusal,
    sha256_problem,
)
from dankserve.hub.download import (
    DISK_MARGIN_BYTES,
    Progress,
    ProgressMeter,
    PullPlan,
    RemoteFile,
    choose_files,
    disk_shortfall,
    plan_pull,
    size_text,
)
from dankserve.hub.remote import HUB_TIMEOUT_SECONDS, hub_errors, offline_error
from dankserve.hub.transfer import disk_errors

ProgressCallback = Callable[[Progress], None]
PROGRESS_INTERVAL_SECONDS = 0.5


@dataclass(frozen=True)
class PullResult:
    """What a pull did."""

    model: str
    commit: str
    files: int
    fetched_files: int
    total_bytes: int
    fetched_bytes: int
    seconds: float
    snapshot: Path


def repo_folder(access: HubAccess, model: str) -> Path:
    return access.cache_dir / ("models--" + model.replace("/", "--"))


def partial_bytes(folder: Path) -> int:
    """Bytes in `.incomplete` blobs (interrupted or running downloads)."""
    blobs = folder / "blobs"
    total = 0
    for path in blobs.glob("*.incomplete") if blobs.is_dir() else ():
        try:
            total += path.stat().st_size
        except OSError:
            continue  # finished and renamed meanwhile
    return total


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds `path` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def survey(access: HubAccess, model: str, revision: str | None) -> tuple[str, PullPlan]:
    """The commit and what is left to fetch of it (every name, size and hash of the listing checked first)."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    if access.offline:
        raise offline_error(access, model, revision)
    api = HfApi(endpoint=access.endpoint, token=access.token)
    with hub_errors(access, model, revision):
        info = api.model_info(model, revision=revision, files_metadata=True, timeout=HUB_TIMEOUT_SECONDS)
    commit = checked_commit(access.endpoint, model, revision, info.sha)
    listed = [
        listed_file(access, model, s.rfilename, s.size, s.lfs.sha256 if s.lfs else None) for s in info.siblings or ()
    ]
    wanted = choose_files(listed)
    complete = []
    for f in wanted:
        cached = try_to_load_from_cache(model, f.path, cache_dir=access.cache_dir, revision=commit)
        if isinstance(cached, str) and Path(cached).stat().st_size == f.size:
            complete.append(f.path)
    return commit, plan_pull(wanted, complete, partial_bytes(repo_folder(access, model)))


def listed_file(access: HubAccess, model: str, name: str, size: int | None, sha256: str | None) -> RemoteFile:
    """One entry of the repo's listing, when its name can be a path under the snapshot and it has a size."""
    what = f"the file name {name[:200]!r}"
    problem = file_name_problem(name)
    if problem is None:
        checked = expected_size(size, None)
        if isinstance(checked, str):
            problem = checked
        else:
            size = checked
            problem = sha256_problem(sha256)
    if problem is not None or size is None:
        raise refusal(access.endpoint, model, what, problem or "no size")
    return RemoteFile(name, size, sha256)


def check_disk(access: HubAccess, model: str, plan: PullPlan) -> None:
    """Enough free disk for what is left (plus a margin), else exit 3 naming the shortfall."""
    free = free_bytes(access.cache_dir)
    short = disk_shortfall(plan.bytes_to_fetch, free)
    if short:
        raise DiskSpaceShortfall(
            f"{model} needs {size_text(plan.bytes_to_fetch)} more in {access.cache_dir} "
            f"(+ {size_text(DISK_MARGIN_BYTES)} kept free) but the disk has {size_text(free)} free: "
            f"{size_text(short)} short",
            fix=f"free {size_text(short)} there, or set hf_cache_dir to a larger disk",
        )


def pull(
    access: HubAccess,
    model: str,
    revision: str | None,
    on_progress: ProgressCallback | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> PullResult:
    """Download what is missing of a model; report progress every half second."""
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()
    started = clock()
    if revision is not None and (problem := file_name_problem(revision)) is not None:
        raise ConfigError(
            f"revision {revision[:200]!r} of {model} cannot name a ref in the HF cache: {problem}",
            fix="set revision to a branch, tag or commit of the repo (e.g. main, v1.0, refs/pr/1)",
        )
    commit, plan = survey(access, model, revision)
    check_disk(access, model, plan)
    folder = repo_folder(access, model)
    with disk_errors(str(folder)):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    meter = ProgressMeter(plan.total_bytes)
    finished = [plan.complete_bytes]
    stop = threading.Event()

    def report() -> None:
        if on_progress is not None and plan.missing:
            on_progress(meter.sample(clock(), min(plan.total_bytes, finished[0] + partial_bytes(folder))))

    def reporter() -> None:
        while not stop.wait(PROGRESS_INTERVAL_SECONDS):
            report()

    thread = threading.Thread(target=reporter, name=f"pull-progress-{model}", daemon=True)
    report()
    thread.start()
    try:
        with hub_errors(access, model, revision):
            for f in plan.missing:
                fetch_file(access, model, commit, f, folder)
                finished[0] += f.size
    finally:
        stop.set()
        thread.join()
    report()
    with disk_errors("refs/" + (revision or "main")):
        write_ref(folder, revision or "main", commit)
    remember_pull(access, model, revision, commit, {f.path: f.size for f in plan.wanted})
    return PullResult(
        model=model,
        commit=commit,
        files=len(plan.wanted),
        fetched_files=len(plan.missing),
        total_bytes=plan.total_bytes,
        fetched_bytes=plan.bytes_to_fetch,
        seconds=clock() - started,
        snapshot=folder / "snapshots" / commit,
    )


def pull_record(access: HubAccess, model: str, revision: str | None) -> Path:
    key = hashlib.sha256(f"{access.endpoint}\n{model}\n{revision or 'main'}".encode()).hexdigest()[:32]
    return access.facts_dir.parent / "pulls" / f"{key}.json"


def complete_locally(access: HubAccess, model: str, revision: str | None) -> bool:
    """Whether the files of the last complete pull are all still in the cache, at their sizes."""
    try:
        record = json.loads(pull_record(access, model, revision).read_text(encoding="utf-8"))
        snapshot = access.cache_dir / ("models--" + model.replace("/", "--")) / "snapshots" / record["commit"]
        return all((snapshot / path).stat().st_size == size for path, size in record["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def remember_pull(access: HubAccess, model: str, revision: str | None, commit: str, files: dict[str, int]) -> None:
    path = pull_record(access, model, revision)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pull-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"model": model, "revision": revision, "commit": commit, "files": files}, out)
        os.replace(tmp, path)
    except OSError:
        return  # the next boot asks the Hub again


def fetch_file(access: HubAccess, model: str, commit: str, f: RemoteFile, folder: Path) -> Path:
    """One file into the cache layout, resuming its `.incomplete` blob; returns the snapshot path.

    The blob counts as complete only at the listed size and, for an LFS file, with the listed
    sha256. Every directory is made (0700) below `folder` without following a symlink, and only
    an entry of the snapshot itself is ever replaced.
    """
    from filelock import FileLock
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    from dankserve.hub.transfer import BlobWriter, download

    url = hf_hub_url(model, f.path, revision=commit, endpoint=access.endpoint)
    meta = get_hf_file_metadata(url, token=access.token)
    problem = etag_problem(meta.etag)
    size = expected_size(f.size, meta.size)
    if isinstance(size, str):
        problem = problem or size
    if problem is not None or isinstance(size, str):
        raise refusal(access.endpoint, model, f"{f.path} (ETag {str(meta.etag)[:100]!r})", problem or "")
    etag = str(meta.etag)
    with disk_errors(f.path):
        *parents, name = f.path.split("/")
        blobs = dir_under(folder, "blobs")
        pointer = dir_under(folder, "snapshots", commit, *parents) / name
    blob = blobs / etag
    with FileLock(str(blobs / f"{etag}.lock"), mode=0o600):  # another pull of the same blob waits, then finds it done
        if not (_is_plain_file(blob) and blob.stat().st_size == size):
            partial = blobs / f"{etag}.incomplete"
            headers = build_hf_headers(token=access.token)
            if urlsplit(meta.location).netloc != urlsplit(url).netloc:
                headers.pop("authorization", None)  # a CDN: the token stays with the Hub
            with disk_errors(f.path):
                fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "r+b") as out:
                writer = BlobWriter(out, size=size, margin=DISK_MARGIN_BYTES, name=f"{model}/{f.path}")
                try:
                    download(meta.location, writer, headers=headers)
                except HubAnswerRefused:
                    partial.unlink(missing_ok=True)  # what a refused answer sent is not kept for a resume
                    raise
                digest = writer.digest.hexdigest()
            if f.sha256 is not None and digest != f.sha256:
                partial.unlink(missing_ok=True)
                problem = f"their sha256 is {digest}, the listing's {f.sha256}"
                raise refusal(access.endpoint, model, f"{size} bytes of {f.path}", problem)
            with disk_errors(f.path):
                os.replace(partial, blob)
    with disk_errors(f.path):
        _replace_entry(pointer)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    return pointer


def dir_under(base: Path, *segments: str) -> Path:
    """`base/SEGMENT/...`, each directory made 0700 when absent; a symlink or a file on the way is refused.

    The names come from the Hub's answer (checked to be plain segments); refusing symlinks keeps
    whatever else sits in the cache from steering a write out of it."""
    current = base
    for segment in segments:
        current = current / segment
        with contextlib.suppress(FileExistsError):
            current.mkdir(mode=0o700)
        if not stat.S_ISDIR(current.lstat().st_mode):
            raise HubAnswerRefused(
                f"{current} in the HF cache is a symlink or a file where a directory belongs; dankserve does "
                "not write through it",
                fix=f"remove {current} (and check who else can write {base})",
            )
    return current


def _is_plain_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _replace_entry(pointer: Path) -> None:
    """Remove a snapshot entry before it is linked again; a directory there is refused, never emptied."""
    try:
        info = pointer.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise HubAnswerRefused(
            f"{pointer} in the HF cache is a directory where the file belongs",
            fix=f"remove {pointer}, then pull again",
        )
    pointer.unlink()


def write_ref(folder: Path, revision: str, commit: str) -> None:
    """`refs/REVISION` -> commit, so the cache resolves the revision offline (not for a commit itself)."""
    if revision == commit:
        return
    *parents, name = revision.split("/")
    ref = dir_under(folder, "refs", *parents) / name
    try:
        if ref.read_text(encoding="utf-8").strip() == commit:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=ref.parent, prefix=".ref-")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(commit)
    os.replace(tmp, ref)
