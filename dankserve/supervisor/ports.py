"""Whether a deployment's port is already taken before its boot starts, and by whom."""

from __future__ import annotations

import contextlib
import socket

from dankserve.backend_address import BackendAddress, UnixAddress, connect_host


def port_holder(address: BackendAddress, timeout: float = 0.5) -> str | None:
    """Who listens on the TCP port where the server will bind ("pid 12 (python3 -m http.server 80)"), or None.

    A connection that is accepted means another server answers there: a new boot would fail to
    bind, or (worse) its /health would be answered by the other one. A private socket is the
    deployment's own (in its 0700 directory; the runtime replaces a stale one): nothing to check.
    """
    if isinstance(address, UnixAddress):
        return None
    host, port = address.host, address.port
    try:
        with socket.create_connection((connect_host(host), port), timeout=timeout):
            pass
    except OSError:
        return None
    return _listener(port) or "another process (not visible from here)"


def _listener(port: int) -> str | None:
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(conn.pid)
                    return f"pid {conn.pid} ({' '.join(proc.cmdline())[:120] or proc.name()})"
                return f"pid {conn.pid}"
    return None
