"""The gateway's client sessions to the servers: one over TCP, one per unix socket (issue 38: a server behind
the gateway listens on its private socket, and aiohttp's UnixConnector serves one path)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from dankserve.backend_address import BackendAddress, TcpAddress

# An idle connection is dropped before vLLM drops it (uvicorn's timeout_keep_alive, VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
# 5 s by default): reusing one the server is closing fails the request. It also leaves the server with no
# idle connection of the gateway's when a snapshot is captured (dankserve/snapshot/tcp.py).
KEEPALIVE_S = 4.0


class Upstreams:
    """The sessions, opened with the gateway's application and closed with it; a socket's on its first request
    (a few: one per deployment)."""

    def __init__(self) -> None:
        self._tcp: aiohttp.ClientSession | None = None
        self._sockets: dict[Path, aiohttp.ClientSession] = {}

    async def open(self) -> None:
        self._tcp = _session(aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, enable_cleanup_closed=True))

    async def close(self) -> None:
        if self._tcp is not None:
            await self._tcp.close()
        for session in self._sockets.values():
            await session.close()
        self._sockets.clear()

    def session(self, address: BackendAddress) -> aiohttp.ClientSession:
        """The session that reaches `address`: the TCP one, or its socket's own."""
        if isinstance(address, TcpAddress):
            assert self._tcp is not None, "the gateway's application has not started"
            return self._tcp
        found = self._sockets.get(address.path)
        if found is None:
            connector = aiohttp.UnixConnector(str(address.path), limit=0, keepalive_timeout=KEEPALIVE_S)
            found = self._sockets[address.path] = _session(connector)
        return found


def _session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
    )
