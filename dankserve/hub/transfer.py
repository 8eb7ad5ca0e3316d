"""The byte transfer of a pull: one ranged GET of a file's CDN location into its `.incomplete` blob.

huggingface_hub resolves the file (ETag, size, location: `get_hf_file_metadata`); the bytes
then come through the standard library's `http.client` reading straight into a reused buffer
(`readinto`), which keeps up with curl on a fast link where httpx's streaming, parsing in
Python, reaches about half of it (bench/hub_pull.py). With a proxy configured (`HTTPS_PROXY`,
`HTTP_PROXY`, `ALL_PROXY`) huggingface_hub's own `http_get` is used instead, since it honours
proxies and this does not.

Either way the bytes go through a `BlobWriter`: it never writes past the size the repo's
listing gives (a server sending more is refused before the excess reaches the disk), stops
when the disk's free space would fall into the margin a pull keeps free, and hashes what it
writes so the caller can compare the sha256 the listing gives. Network failures (a stall past
`HF_HUB_DOWNLOAD_TIMEOUT`, a refused connection, a redirect to something that is not HTTP) are
HubUnreachable and a full disk DiskSpaceShortfall, each with its fix: never a traceback.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import ssl
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import BinaryIO, cast
from urllib.parse import urljoin, urlsplit

from dankserve.errors import DiskSpaceShortfall, EnvironmentUnusable, HubAnswerRefused, HubUnreachable
from dankserve.hub.download import size_text

BUFFER_BYTES = 8 << 20
TIMEOUT_SECONDS = 60.0
"""Per read: a server that sends nothing for this long is given up on (HF_HUB_DOWNLOAD_TIMEOUT overrides)."""
MAX_REDIRECTS = 5
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
RESUME_FIX = "run the pull again; it resumes where it stopped"


def proxied(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(name) for name in PROXY_VARIABLES)


def read_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds a read may wait: HF_HUB_DOWNLOAD_TIMEOUT (huggingface_hub's setting) when it is a positive number."""
    env = os.environ if environ is None else environ
    try:
        value = float(env.get("HF_HUB_DOWNLOAD_TIMEOUT", ""))
    except ValueError:
        return TIMEOUT_SECONDS
    return value if value > 0 else TIMEOUT_SECONDS


class BlobWriter:
    """One `.incomplete` blob as it grows: at most `size` bytes, never into the disk margin, hashed.

    `out` is the blob opened for reading and writing; what it holds already is kept (and hashed)
    when it is not longer than `size`, else it is emptied: a leftover larger than the file is not
    part of it. Its own OSErrors are raised as DankserveErrors, so any OSError around it is the
    network's.
    """

    def __init__(self, out: BinaryIO, *, size: int, margin: int, name: str) -> None:
        self.out = out
        self.size = size
        self.margin = margin
        self.name = name
        self.digest = hashlib.sha256()
        with disk_errors(self.name):
            held = out.seek(0, os.SEEK_END)
            if held > size:
                self.restart()
            else:
                out.seek(0)
                for block in iter(lambda: out.read(BUFFER_BYTES), b""):
                    self.digest.update(block)

    @property
    def missing(self) -> int:
        return self.size - self.out.tell()

    def tell(self) -> int:
        return self.out.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.out.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """Only to empty the blob (huggingface_hub's http_get, when a server ignored the Range)."""
        if (self.out.tell() if size is None else size) != 0:
            raise ValueError("a blob is only ever emptied")
        self.restart()
        return 0

    def restart(self) -> None:
        with disk_errors(self.name):
            self.out.seek(0)
            self.out.truncate()
        self.digest = hashlib.sha256()

    def write(self, data: bytes | memoryview) -> int:
        if len(data) > self.missing:
            raise HubAnswerRefused(
                f"the server sent more than the {self.size} bytes the repo lists for {self.name}",
                fix="check that HF_ENDPOINT names the Hugging Face Hub or a mirror you trust; "
                "nothing past the listed size was written",
            )
        with disk_errors(self.name):
            info = os.fstatvfs(self.out.fileno())
            free = info.f_bavail * info.f_frsize
            if free - len(data) < self.margin:
                raise DiskSpaceShortfall(
                    f"the disk of the HF cache came within {size_text(self.margin)} of full while writing "
                    f"{self.name} ({size_text(free)} free, {size_text(self.missing)} still to come)",
                    fix="free space on that disk (or set hf_cache_dir to a larger one), then pull again: it resumes",
                )
            self.out.write(data)
            self.out.flush()  # the progress reader sees the file grow
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        with disk_errors(self.name):
            self.out.flush()


@contextmanager
def disk_errors(name: str) -> Iterator[None]:
    """An OSError of a file in the HF cache as the DankserveError it is (a full disk above all)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskSpaceShortfall(
                f"the disk of the HF cache is full: writing {name} failed ({exc.strerror})",
                fix="free space on that disk (or set hf_cache_dir to a larger one), then pull again: it resumes",
            ) from None
        raise EnvironmentUnusable(
            f"cannot write {name} into the HF cache: {exc.strerror or exc}",
            fix="check that hf_cache_dir is on a writable, healthy file system",
        ) from None


def download(url: str, blob: BlobWriter, *, headers: Mapping[str, str]) -> None:
    """Append the rest of `url` to the blob (from what it holds), following redirects, up to its size."""
    if proxied():
        from huggingface_hub.file_download import http_get

        start = blob.tell()
        try:
            http_get(url, cast(BinaryIO, blob), resume_size=start, headers=dict(headers), expected_size=blob.size)
        except OSError as exc:  # huggingface_hub's own consistency check is an OSError too
            raise HubUnreachable(f"fetching {blob.name} through the proxy failed: {exc}", fix=RESUME_FIX) from None
        return
    start = blob.tell()
    if start == blob.size:
        return
    send = dict(headers)
    if start:
        send["Range"] = f"bytes={start}-"
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        where = f"{parts.scheme}://{parts.netloc}{parts.path}"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HubUnreachable(
                f"{blob.name} was redirected to {url[:200]!r}, which is not an http(s) URL; it was not followed",
                fix="check that HF_ENDPOINT names the Hugging Face Hub or a mirror you trust",
            )
        try:
            connection = _connect(parts.scheme, parts.hostname, parts.port)
            try:
                connection.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=send)
                response = connection.getresponse()
                if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                    target = urljoin(url, response.getheader("Location") or "")
                    if urlsplit(target).netloc != parts.netloc:
                        send.pop("authorization", None)
                        send.pop("Authorization", None)
                    url = target
                    continue
                if response.status == 200 and start:
                    blob.restart()  # the server ignored the range: start over
                elif response.status == 416:
                    raise HubUnreachable(
                        f"GET {where} refused bytes {start}- (HTTP 416): the server has fewer bytes of "
                        f"{blob.name} than the {blob.size} the repo lists",
                        fix=RESUME_FIX,
                    )
                elif response.status not in (200, 206):
                    raise HubUnreachable(f"GET {where} answered HTTP {response.status}", fix=RESUME_FIX)
                _copy(response, blob, where)
            finally:
                connection.close()
        except TimeoutError:
            raise HubUnreachable(
                f"GET {where} stalled: nothing arrived for {read_timeout():.0f} s "
                f"({size_text(blob.tell())} of {size_text(blob.size)} of {blob.name} are kept)",
                fix=RESUME_FIX + "; on a slow link set HF_HUB_DOWNLOAD_TIMEOUT to more seconds",
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            detail = (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
            raise HubUnreachable(
                f"GET {where} failed: {detail} ({size_text(blob.tell())} of {size_text(blob.size)} of {blob.name} "
                "are kept)",
                fix=RESUME_FIX + " (check the network, a firewall, or HF_ENDPOINT)",
            ) from None
        break
    else:
        raise HubUnreachable(f"more than {MAX_REDIRECTS} redirects from {url}", fix="check HF_ENDPOINT")
    if blob.missing:
        raise HubUnreachable(
            f"{where} ended after {blob.tell()} of the {blob.size} bytes of {blob.name}",
            fix=RESUME_FIX,
        )


def _connect(scheme: str, host: str, port: int | None) -> http.client.HTTPConnection:
    timeout = read_timeout()
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _copy(response: http.client.HTTPResponse, blob: BlobWriter, where: str) -> None:
    """The body into the blob; a body announced or sent longer than what the blob lacks is refused."""
    if response.length is not None and response.length > blob.missing:
        raise HubAnswerRefused(
            f"GET {where} announced {response.length} bytes where {blob.name} lacks only {blob.missing} "
            f"of the {blob.size} the repo lists",
            fix="check that HF_ENDPOINT names the Hugging Face Hub or a mirror you trust; nothing was written",
        )
    buffer = memoryview(bytearray(BUFFER_BYTES))
    while True:
        # one byte more than is missing: a server sending past the size is caught before it is written
        count = response.readinto(buffer[: min(BUFFER_BYTES, blob.missing + 1)])
        if not count:
            break
        blob.write(buffer[:count])
