"""A stand-in Hugging Face Hub: a small real HTTP server serving the routes `huggingface_hub` calls.

Tests, benchmarks and the demo point `HF_ENDPOINT` at it and run the real `huggingface_hub`
client code unchanged. Routes (as huggingface_hub 1.x/2.x calls them, see its `hf_api.py`,
`file_download.py` and `utils/_http.py`):

- `GET /api/models/ORG/NAME[/revision/REV]` (`model_info`, `repo_info`; `?blobs=True` adds sizes
  and LFS facts to `siblings`),
- `GET /api/models/ORG/NAME/tree/REV[/PATH]` (`list_repo_tree`, used by `snapshot_download`),
- `HEAD|GET /ORG/NAME/resolve/REV/FILE` (`get_hf_file_metadata`, `hf_hub_download`,
  `parse_safetensors_file_metadata`): `ETag`, `X-Repo-Commit`, `Content-Length`; LFS files
  (safetensors) answer `302` with `X-Linked-Size`, `X-Linked-Etag` and a `Location` on another
  host name (`localhost` for `127.0.0.1`), as the Hub sends its CDN, where `GET` serves `Range`
  requests with `206`.

Errors carry the Hub's `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`,
`GatedRepo`), which huggingface_hub turns into its typed errors. A gated repo answers only a
request with `Authorization: Bearer <token>`; a slow repo sends its files at a set byte rate.
Every request is recorded (`requests`) so tests can see Range headers and counts.

A repo's `misbehaviour` makes it a hostile Hub or mirror for the security tests: a commit id
that is a path, ETags that are not names, HEADs without a size, bodies longer, shorter or other
than the listing says, a stall, a redirect elsewhere. File names are the repo's to choose too
(`add_file` takes any name: the bytes are stored under a hash of it).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_TOKEN = "hf_standin_token"
STALL_SECONDS = 120.0
"""How long a stalling answer (Misbehaviour.stall_after) keeps its connection open and silent."""
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1}


@dataclass(frozen=True)
class HubFile:
    """One file of a repo, its bytes on disk."""

    path: str
    data: Path
    size: int
    git_oid: str
    sha256: str | None = None
    """Set for LFS files (weights): the Hub serves them through its CDN."""


@dataclass
class Misbehaviour:
    """What a hostile Hub (or mirror) answers instead of the truth; every field off by default."""

    commit: str | None = None
    """The commit id it names (`sha`, `X-Repo-Commit`); requests for that revision reach the real commit."""
    etag: str | None = None
    """The ETag (and `X-Linked-Etag`) of every file."""
    head_without_size: bool = False
    """HEAD answers name no size (no `Content-Length`, no `X-Linked-Size`)."""
    body_bytes: int | None = None
    """A GET sends this many bytes (the file's, then filler) as a complete answer, whatever the file's size."""
    length_header: bool = True
    """With body_bytes: send a Content-Length (else none, and the connection closes after the body)."""
    corrupt: bool = False
    """A GET sends other bytes than the file's, of the same length (their sha256 is not the listed one)."""
    stall_after: int | None = None
    """A GET sends this many bytes of the file, then nothing, keeping the connection open."""
    redirect_to: str | None = None
    """Where an LFS file's resolve redirects instead of the CDN."""


@dataclass
class HubRepo:
    """A model repo: files at one commit, named revisions, access and speed."""

    repo_id: str
    commit: str
    files: dict[str, HubFile] = field(default_factory=dict)
    revisions: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    bytes_per_second: float | None = None
    misbehaviour: Misbehaviour = field(default_factory=Misbehaviour)

    @property
    def answered_commit(self) -> str:
        return self.misbehaviour.commit if self.misbehaviour.commit is not None else self.commit


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    range: str | None
    authorization: str | None


def safetensors_bytes(tensors: Mapping[str, tuple[str, Sequence[int]]]) -> tuple[bytes, int]:
    """A safetensors header for `tensors` (name -> (dtype, shape)) and the size of the data after it."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for dim in shape:
            count *= dim
        size = count * SAFETENSORS_DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes
    return struct.pack("<Q", len(raw)) + raw, offset


class StandInHub:
    """The server and its repos; files live under `root`."""

    def __init__(self, root: Path, token: str = DEFAULT_TOKEN) -> None:
        self.root = root
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ content

    def add_file(self, repo_id: str, path: str, content: bytes, *, lfs: bool = False) -> HubFile:
        """A file given by its bytes."""
        target = self._file_path(repo_id, path)
        target.write_bytes(content)
        return self._register(repo_id, path, target, lfs=lfs)

    def add_model(
        self,
        repo_id: str,
        config: Mapping[str, Any],
        tensors: Mapping[str, tuple[str, Sequence[int]]],
        *,
        shards: int = 1,
        gated: bool = False,
        bytes_per_second: float | None = None,
        revisions: Sequence[str] = (),
        extra_files: Mapping[str, bytes] | None = None,
    ) -> HubRepo:
        """A model repo: config.json, tokenizer files and safetensors weights (zeros, written sparse).

        With several shards, tensors are split round-robin and `model.safetensors.index.json`
        lists them with `metadata.total_size`, as `transformers` writes it.
        """
        repo = self.repos.setdefault(repo_id, HubRepo(repo_id, commit=_commit_of(repo_id)))
        repo.gated, repo.bytes_per_second = gated, bytes_per_second
        self.add_file(repo_id, "config.json", json.dumps(config, indent=2).encode())
        self.add_file(repo_id, "tokenizer_config.json", b'{"model_max_length": 4096}')
        self.add_file(repo_id, "generation_config.json", b"{}")
        for name, content in (extra_files or {}).items():
            self.add_file(repo_id, name, content)
        names = list(tensors)
        groups = [names[i::shards] for i in range(shards)]
        weight_map: dict[str, str] = {}
        total = 0
        for i, group in enumerate(groups):
            filename = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            header, data_size = safetensors_bytes({n: tensors[n] for n in group})
            target = self._file_path(repo_id, filename)
            with target.open("wb") as out:
                out.write(header)
                out.truncate(len(header) + data_size)
            oid = _zeros_sha256(header, data_size)
            self._register(repo_id, filename, target, lfs=True, digest=oid)
            weight_map.update(dict.fromkeys(group, filename))
            total += data_size
        if shards > 1:
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            self.add_file(repo_id, "model.safetensors.index.json", json.dumps(index).encode())
        for name in revisions:
            repo.revisions[name] = repo.commit
        return repo

    def add_adapter(
        self, repo_id: str, *, rank: int = 8, target_modules: Sequence[str] = ("q_proj", "v_proj"), layers: int = 2
    ) -> HubRepo:
        """A PEFT LoRA adapter repo: adapter_config.json and adapter_model.safetensors (zeros, A and B per module)."""
        repo = self.repos.setdefault(repo_id, HubRepo(repo_id, commit=_commit_of(repo_id)))
        config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(target_modules)}
        self.add_file(repo_id, "adapter_config.json", json.dumps(config).encode())
        tensors = {
            f"base_model.model.model.layers.{i}.self_attn.{m}.lora_{ab}.weight": (
                "BF16",
                [rank, 64] if ab == "A" else [64, rank],
            )
            for i in range(layers)
            for m in target_modules
            for ab in "AB"
        }
        header, data_size = safetensors_bytes(tensors)
        target = self._file_path(repo_id, "adapter_model.safetensors")
        with target.open("wb") as out:
            out.write(header)
            out.truncate(len(header) + data_size)
        self._register(repo_id, "adapter_model.safetensors", target, lfs=True, digest=_zeros_sha256(header, data_size))
        return repo

    def add_large_file(self, repo_id: str, path: str, size: int) -> HubFile:
        """An LFS file of `size` bytes of a repeating pattern (for throughput measurements); a
        `.safetensors` one starts with a valid header of one U8 tensor filling the rest."""
        target = self._file_path(repo_id, path)
        head = b""
        if path.endswith(".safetensors"):
            data_size = size
            for _ in range(3):  # the header's length depends on the digits of the data size
                head, _ = safetensors_bytes({"weight": ("U8", [data_size])})
                data_size = size - len(head)
        block = hashlib.sha256(path.encode()).digest() * 32768  # 1 MiB
        digest = hashlib.sha256(head)
        with target.open("wb") as out:
            out.write(head)
            left = size - len(head)
            while left > 0:
                piece = block[: min(left, len(block))]
                out.write(piece)
                digest.update(piece)
                left -= len(piece)
        return self._register(repo_id, path, target, lfs=True, digest=digest.hexdigest())

    def _file_path(self, repo_id: str, path: str) -> Path:
        """Where a file's bytes are kept: under a hash of its name, which may be anything a hostile repo lists."""
        self.repos.setdefault(repo_id, HubRepo(repo_id, commit=_commit_of(repo_id)))
        target = (
            self.root / repo_id.replace("/", "--") / hashlib.sha1(path.encode("utf-8", "surrogatepass")).hexdigest()
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def _register(self, repo_id: str, path: str, data: Path, *, lfs: bool, digest: str | None = None) -> HubFile:
        size = data.stat().st_size
        if lfs and digest is None:
            digest = _sha256_file(data)
        git_oid = hashlib.sha1(f"{repo_id}/{path}/{size}/{digest}".encode()).hexdigest()
        hub_file = HubFile(path, data, size, git_oid, digest)
        repo = self.repos[repo_id]
        repo.files[path] = hub_file
        # a new commit for new content (a client's cache keyed by commit must not serve old files)
        content = "".join(f"{f.path}:{f.git_oid}\n" for f in sorted(repo.files.values(), key=lambda f: f.path))
        old = repo.commit
        repo.commit = hashlib.sha1(f"{repo_id}\n{content}".encode()).hexdigest()
        repo.revisions = {name: repo.commit if commit == old else commit for name, commit in repo.revisions.items()}
        return hub_file

    # ------------------------------------------------------------------ server

    @property
    def url(self) -> str:
        """The endpoint for HF_ENDPOINT."""
        assert self._server is not None, "the stand-in Hub is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self, port: int = 0) -> str:
        """Listen on loopback (a free port unless given); returns the endpoint URL."""
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="stand-in-hub", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def resolve(self, repo: HubRepo, revision: str) -> str | None:
        """The commit a revision names, or None when the repo has no such revision."""
        if revision in ("main", repo.commit, repo.answered_commit):
            return repo.commit
        return repo.revisions.get(revision)


@contextmanager
def stand_in_hub(root: Path, token: str = DEFAULT_TOKEN) -> Iterator[StandInHub]:
    """A started stand-in Hub, stopped on exit."""
    hub = StandInHub(root, token)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def _commit_of(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()


HASHED_ZEROS_MAX = 64 << 20


def _zeros_sha256(header: bytes, data_size: int) -> str:
    """The listed sha256 of a safetensors file of `header` then zeros: the true one up to HASHED_ZEROS_MAX
    bytes of data; beyond, one named by the header and size (hashing a sparse 60 GB file would not do), so
    such weights serve planning, and a pull of them is refused by its sha256 check."""
    if data_size <= HASHED_ZEROS_MAX:
        return hashlib.sha256(header + bytes(data_size)).hexdigest()
    return hashlib.sha256(header + str(data_size).encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# matched on the path as sent (a revision's '/' is %2F there), each part unquoted after
API_MODEL = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
API_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
CDN = re.compile(r"^/cdn/(?P<repo>[^/]+/[^/]+)/(?P<path>.+)$")
RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    hub: StandInHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `hub.requests`
        return

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    # ------------------------------------------------------------------ dispatch

    def _serve(self, *, head: bool) -> None:
        split = urlsplit(self.path)
        raw = split.path
        self.hub.record(
            RecordedRequest(self.command, unquote(raw), self.headers.get("Range"), self.headers.get("Authorization"))
        )
        query = parse_qs(split.query)

        def part(match: re.Match[str], name: str) -> str:
            return unquote(match[name] or "")

        if match := API_TREE.match(raw):
            self._tree(part(match, "repo"), part(match, "rev"), part(match, "path"))
        elif match := API_MODEL.match(raw):
            self._model_info(part(match, "repo"), part(match, "rev") or "main", blobs=bool(query.get("blobs")))
        elif match := RESOLVE.match(raw):
            self._resolve(part(match, "repo"), part(match, "rev"), part(match, "path"), head=head)
        elif match := CDN.match(raw):
            self._cdn(part(match, "repo"), part(match, "path"), head=head)
        else:
            self._error(404, "RepoNotFound", "Not Found")

    def _access(self, repo_id: str, revision: str | None) -> tuple[HubRepo, str] | None:
        """The repo and commit, or None after answering with the Hub's error."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            self._error(
                401, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated."
            )
            return None
        if self.hub.resolve(repo, revision or "main") is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, repo.answered_commit

    # ------------------------------------------------------------------ routes

    def _model_info(self, repo_id: str, revision: str, *, blobs: bool) -> None:
        access = self._access(repo_id, revision)
        if access is None:
            return
        repo, commit = access
        siblings = []
        for f in repo.files.values():
            sibling: dict[str, Any] = {"rfilename": f.path}
            if blobs:
                sibling["size"] = f.size
                sibling["blobId"] = f.git_oid
                if f.sha256:
                    sibling["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(sibling)
        body = {
            "_id": commit[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
            "usedStorage": sum(f.size for f in repo.files.values()),
        }
        self._json(body, commit)

    def _tree(self, repo_id: str, revision: str, prefix: str) -> None:
        access = self._access(repo_id, revision)
        if access is None:
            return
        repo, commit = access
        entries = []
        for f in repo.files.values():
            if prefix and not f.path.startswith(prefix.rstrip("/") + "/"):
                continue
            entry: dict[str, Any] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.path}
            if f.sha256:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            entries.append(entry)
        self._json(entries, commit)

    def _resolve(self, repo_id: str, revision: str, path: str, *, head: bool) -> None:
        access = self._access(repo_id, revision)
        if access is None:
            return
        repo, commit = access
        hub_file = repo.files.get(path)
        if hub_file is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", commit=commit)
            return
        hostile = repo.misbehaviour
        if hub_file.sha256 is not None:  # LFS: the Hub redirects to its CDN, a different host
            host = self.headers.get("Host", "127.0.0.1").replace("127.0.0.1", "localhost")
            self.send_response(302)
            self.send_header("Location", hostile.redirect_to or f"http://{host}/cdn/{repo_id}/{quote(path)}")
            self.send_header("X-Repo-Commit", commit)
            self.send_header("X-Linked-Etag", f'"{hostile.etag or hub_file.sha256}"')
            if not hostile.head_without_size:
                self.send_header("X-Linked-Size", str(hub_file.size))
            self.send_header("ETag", f'"{hostile.etag or hub_file.git_oid}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._file(repo, hub_file, commit, f'"{hostile.etag or hub_file.git_oid}"', head=head)

    def _cdn(self, repo_id: str, path: str, *, head: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        hub_file = repo.files.get(path) if repo is not None else None
        if repo is None or hub_file is None or hub_file.sha256 is None:
            self._error(404, "EntryNotFound", "no such object")
            return
        self._file(repo, hub_file, repo.answered_commit, f'"{repo.misbehaviour.etag or hub_file.sha256}"', head=head)

    # ------------------------------------------------------------------ responses

    def _file(self, repo: HubRepo, hub_file: HubFile, commit: str, etag: str, *, head: bool) -> None:
        start, end = 0, hub_file.size - 1
        status = 200
        wanted = self.headers.get("Range")
        if wanted and (match := RANGE.match(wanted.strip())):
            first, last = match.groups()
            if first:
                start = int(first)
                end = min(int(last), hub_file.size - 1) if last else hub_file.size - 1
            elif last:  # a suffix: the last N bytes
                start = max(0, hub_file.size - int(last))
            if start >= hub_file.size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{hub_file.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        length = end - start + 1
        hostile = repo.misbehaviour
        if not head and (hostile.body_bytes is not None or hostile.corrupt or hostile.stall_after is not None):
            self._misbehave(hostile, hub_file, start=start, length=length, status=status, etag=etag, commit=commit)
            return
        self.send_response(status)
        if not (head and hostile.head_without_size):
            self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self._send_file_headers(status, etag, commit, f"bytes {start}-{end}/{hub_file.size}")
        if head:
            return
        try:
            with hub_file.data.open("rb") as f:
                if repo.bytes_per_second is None:
                    self.wfile.flush()
                    self.connection.sendfile(f, start, length)
                else:
                    self._send_slowly(f, start, length, repo.bytes_per_second)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_file_headers(self, status: int, etag: str, commit: str, content_range: str) -> None:
        """The headers every file answer ends with (Content-Range on a 206), then the blank line."""
        self.send_header("ETag", etag)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/octet-stream")
        if status == 206:
            self.send_header("Content-Range", content_range)
        self.end_headers()

    def _misbehave(
        self, wrong: Misbehaviour, hub_file: HubFile, *, start: int, length: int, status: int, etag: str, commit: str
    ) -> None:
        """A GET answered the hostile way its repo's misbehaviour says."""
        with hub_file.data.open("rb") as f:
            f.seek(start)
            body = f.read(length)
        if wrong.corrupt:
            body = bytes(b ^ 0xFF for b in body)
        if wrong.body_bytes is not None:
            body = (body + b"x" * max(0, wrong.body_bytes - len(body)))[: wrong.body_bytes]
        self.send_response(status)
        if wrong.body_bytes is None or wrong.length_header:
            self.send_header("Content-Length", str(len(body) if wrong.body_bytes is not None else length))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self._send_file_headers(status, etag, commit, f"bytes {start}-{start + length - 1}/{hub_file.size}")
        try:
            if wrong.stall_after is not None:
                self.wfile.write(body[: wrong.stall_after])
                self.wfile.flush()
                time.sleep(STALL_SECONDS)
                self.close_connection = True
                return
            self.wfile.write(body)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _send_slowly(self, f: Any, start: int, length: int, rate: float) -> None:
        f.seek(start)
        chunk = max(1, int(rate / 20))  # twenty writes a second
        began = time.monotonic()
        sent = 0
        while sent < length:
            block = f.read(min(chunk, length - sent))
            self.wfile.write(block)
            self.wfile.flush()
            sent += len(block)
            ahead = sent / rate - (time.monotonic() - began)
            if ahead > 0:
                time.sleep(ahead)

    def _json(self, body: Any, commit: str) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str, *, commit: str | None = None) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)
