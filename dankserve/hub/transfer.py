"""The byte transfer of a pull: one ranged GET of a file's CDN location into its `.incomplete` blob.

huggingface_hub resolves the file (ETag, size, location: `get_hf_file_metadata`); the bytes
then come through the standard library's `http.client` reading straight into a reused buffer
(`readinto`), which keeps up with curl on a fast link where httpx's streaming, parsing in
Python, reaches about half of it (bench/hub_pull.py). With a proxy configured (`HTTPS_PROXY`,
`HTTP_PROXY`, `ALL_PROXY`) huggingface_hub's own `http_get` is used instead, since it honours
proxies and this does not.
"""

from __future__ import annotations

import http.client
import os
import ssl
from collections.abc import Mapping
from typing import BinaryIO
from urllib.parse import urljoin, urlsplit

from dankserve.errors import HubUnreachable

BUFFER_BYTES = 8 << 20
TIMEOUT_SECONDS = 60.0
MAX_REDIRECTS = 5
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def proxied(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(name) for name in PROXY_VARIABLES)


def download(url: str, out: BinaryIO, *, headers: Mapping[str, str], expected_size: int | None) -> None:
    """Append the rest of `url` to `out` (from `out.tell()`), following redirects; the size is checked."""
    if proxied():
        from huggingface_hub.file_download import http_get

        http_get(url, out, resume_size=out.tell(), headers=dict(headers), expected_size=expected_size)
        return
    start = out.tell()
    if expected_size is not None and start == expected_size:
        return
    send = dict(headers)
    if start:
        send["Range"] = f"bytes={start}-"
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        connection = _connect(parts.scheme, parts.hostname or "", parts.port)
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
            if response.status == 416 and expected_size is not None and start >= expected_size:
                return
            if response.status == 200 and start:
                out.seek(0)  # the server ignored the range: start over
                out.truncate()
            elif response.status not in (200, 206):
                raise HubUnreachable(
                    f"GET {parts.scheme}://{parts.netloc}{parts.path} answered HTTP {response.status}",
                    fix="run the pull again later; it resumes where it stopped",
                )
            _copy(response, out)
        finally:
            connection.close()
        break
    else:
        raise HubUnreachable(f"more than {MAX_REDIRECTS} redirects from {url}", fix="check HF_ENDPOINT")
    if expected_size is not None and out.tell() != expected_size:
        raise HubUnreachable(
            f"{url} ended after {out.tell()} of {expected_size} bytes",
            fix="run the pull again; it resumes where it stopped",
        )


def _connect(scheme: str, host: str, port: int | None) -> http.client.HTTPConnection:
    if scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=TIMEOUT_SECONDS, context=ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=TIMEOUT_SECONDS)


def _copy(response: http.client.HTTPResponse, out: BinaryIO) -> None:
    buffer = memoryview(bytearray(BUFFER_BYTES))
    while True:
        count = response.readinto(buffer)
        if not count:
            break
        out.write(buffer[:count])
        out.flush()  # the progress reader sees the file grow
