"""Where dankserve reaches a vLLM server: a TCP host and port, or a unix socket in a directory only the
daemon's user may enter (issue 38: vLLM's key guards only `/v1`, so whoever can connect to a backend
reaches `/sleep`, `/collective_rpc` and the LoRA routes). The one owner of how a connection to a backend
is made: the probes' http.client, the sleep routes' httpx; the gateway's aiohttp picks its connector by
the same type."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass
from pathlib import Path

import httpx

UNIX_PATH_MAX = 107
"""The longest path a unix socket may have on Linux (sun_path is 108 bytes, the last one NUL)."""


def connect_host(bind_host: str) -> str:
    """Where to connect to a server bound to `bind_host` (a wildcard bind answers on loopback)."""
    if bind_host in ("0.0.0.0", "", "*"):
        return "127.0.0.1"
    if bind_host == "::":
        return "::1"
    return bind_host


@dataclass(frozen=True)
class TcpAddress:
    """A server listening on `host:port` (any local user can connect, and beyond loopback others too)."""

    host: str
    port: int

    def url(self, path: str = "") -> str:
        host = connect_host(self.host)
        return f"http://[{host}]:{self.port}{path}" if ":" in host else f"http://{host}:{self.port}{path}"

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class UnixAddress:
    """A server listening on the unix socket `path` (vLLM's `--uds`)."""

    path: Path

    def url(self, path: str = "") -> str:
        """The URL a client asks for: the host part only names the Host header, the socket is the address."""
        return f"http://localhost{path}"

    def __str__(self) -> str:
        return f"unix:{self.path}"


BackendAddress = TcpAddress | UnixAddress


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a unix socket (the standard library has none)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def http_connection(address: BackendAddress, timeout: float) -> http.client.HTTPConnection:
    """An unopened http.client connection to the server."""
    if isinstance(address, UnixAddress):
        return UnixHTTPConnection(address.path, timeout)
    return http.client.HTTPConnection(connect_host(address.host), address.port, timeout=timeout)


def httpx_client(address: BackendAddress, headers: dict[str, str], timeout: float) -> httpx.Client:
    """An httpx client whose relative URLs reach the server (a unix socket through httpx's own transport;
    an explicit transport also keeps the environment's proxies out of a loopback call)."""
    if isinstance(address, UnixAddress):
        transport = httpx.HTTPTransport(uds=str(address.path))
        return httpx.Client(transport=transport, base_url=address.url(), headers=headers, timeout=timeout)
    return httpx.Client(base_url=address.url(), headers=headers, timeout=timeout)


def endpoint(address: BackendAddress) -> str:
    """The server's OpenAI base as `status` shows it: a URL, or the socket (only the daemon's user opens it)."""
    return address.url("/v1") if isinstance(address, TcpAddress) else str(address)
