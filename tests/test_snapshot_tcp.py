"""dankserve/snapshot/tcp.py: a server tree's connections with a peer outside it (what a capture waits out).

Pure: the /proc/net/tcp{,6} tables read (IPv4, IPv6, IPv4-mapped), the tree's own loopback pairs told from
a client's. Real: a server process (the tree) with a client in this process (outside it) and a connection
to itself (inside), read from /proc; `wait_quiet` until the server closes its idle connection, and the
connections that stay when it never does.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

from dankserve.snapshot import tcp
from tests.harness.wait import wait_until

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(local: str, remote: str, state: str, inode: int) -> str:
    queues = "00000000:00000000 00:00000000 00000000     0        0"
    return f"   0: {local} {remote} {state} {queues} {inode} 1 0 100 0 0 10 0\n"


def test_the_tables_are_read_with_addresses_in_host_order_and_listening_sockets_left_out() -> None:
    text = HEADER + _row("0100007F:1F40", "00000000:0000", "0A", 11)  # 127.0.0.1:8000, listening
    text += _row("0100007F:1F40", "0100007F:D431", "01", 12)  # 127.0.0.1:8000 <- 127.0.0.1:54321
    text += _row("0100007F:9C40", "0100007F:1F40", "06", 0)  # time-wait: no socket holds it
    text += "   1: garbage\n"
    (conn, waiting) = tcp.parse_table(text)
    assert conn == tcp.Connection(("127.0.0.1", 8000), ("127.0.0.1", 54321), "established", 12)
    assert waiting.state == "time-wait" and waiting.inode == 0
    assert conn.show() == "127.0.0.1:54321 -> 127.0.0.1:8000 (established)"


def test_ipv6_and_ipv4_mapped_addresses_compare_as_the_connection_s_other_end_sees_them() -> None:
    mapped = "0000000000000000FFFF00000100007F:1F40"  # ::ffff:127.0.0.1:8000
    loop6 = "00000000000000000000000001000000:0050"  # ::1:80
    (a, b) = tcp.parse_table(HEADER + _row(mapped, loop6, "01", 5) + _row(loop6, mapped, "08", 6))
    assert a.local == ("127.0.0.1", 8000) and a.remote == ("::1", 80)
    assert b.state == "close-wait" and b.show().startswith("127.0.0.1:8000 -> [::1]:80")


def test_outside_keeps_the_tree_s_connections_whose_peer_is_not_the_tree_s_own() -> None:
    server_side = tcp.Connection(("127.0.0.1", 8000), ("127.0.0.1", 50000), "established", 1)
    engine_a = tcp.Connection(("127.0.0.1", 40000), ("127.0.0.1", 40001), "established", 2)
    engine_b = tcp.Connection(("127.0.0.1", 40001), ("127.0.0.1", 40000), "established", 3)
    clients_end = tcp.Connection(("127.0.0.1", 50000), ("127.0.0.1", 8000), "established", 4)  # not the tree's
    found = tcp.outside([server_side, engine_a, engine_b, clients_end], {1, 2, 3})
    assert found == [server_side]
    assert tcp.outside([engine_a, engine_b], {2, 3}) == [], "both ends in the tree: restored whole"


def test_wait_quiet_polls_until_none_are_left_or_the_time_is_up() -> None:
    conn = tcp.Connection(("127.0.0.1", 8000), ("127.0.0.1", 50000), "established", 1)
    now = [0.0]
    answers = [[conn], [conn], []]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    def read(pid: int) -> list[tcp.Connection]:
        return answers.pop(0)

    assert tcp.wait_quiet(7, 8.0, read=read, clock=lambda: now[0], sleep=sleep) == []
    stays = tcp.wait_quiet(7, 1.0, read=lambda pid: [conn], clock=lambda: now[0], sleep=sleep)
    assert stays == [conn]
    reason = tcp.describe([conn] * 5)
    assert "5 client connection(s)" in reason and "and 2 more" in reason and "127.0.0.1:50000" in reason


SERVER = textwrap.dedent(
    """
    import socket, sys, threading, time
    idle = float(sys.argv[1])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    # a loopback pair of the tree's own, as vLLM's engine keeps one (both ends restored together)
    inner = socket.socket()
    inner.bind(("127.0.0.1", 0))
    inner.listen()
    left = socket.create_connection(inner.getsockname())
    right, _ = inner.accept()
    print(listener.getsockname()[1], flush=True)
    def serve(conn):
        conn.settimeout(idle if idle > 0 else None)
        try:
            conn.recv(1)
        except OSError:
            pass
        conn.close()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    """
)


@contextmanager
def _server(idle_seconds: float) -> Iterator[tuple[int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(idle_seconds)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait(10)


def _accepted(pid: int) -> list[tcp.Connection]:
    """The tree's connections once the server accepted the client's (until then it sits in the listening
    socket's queue, no descriptor of the tree's)."""
    return wait_until(lambda: tcp.read_outside(pid) or None, 10, 0.01, what="the client's connection accepted")


def test_a_client_s_idle_connection_is_found_then_waited_out_when_the_server_closes_it() -> None:
    with _server(0.5) as (pid, port):
        assert tcp.read_outside(pid) == [], "the tree's own loopback pair is not a client's"
        client = socket.create_connection(("127.0.0.1", port))
        try:
            mine = client.getsockname()
            found = _accepted(pid)
            assert [(c.remote, c.local[1]) for c in found] == [((mine[0], mine[1]), port)]
            assert tcp.wait_quiet(pid, 10.0) == [], "the server closed it idle"
        finally:
            client.close()


def test_a_connection_the_server_keeps_open_stays_and_is_named() -> None:
    with _server(0) as (pid, port):
        client = socket.create_connection(("127.0.0.1", port))
        try:
            _accepted(pid)
            left = tcp.wait_quiet(pid, 0.3)
            assert len(left) == 1 and left[0].local[1] == port
            assert f":{client.getsockname()[1]} -> 127.0.0.1:{port}" in tcp.describe(left)
        finally:
            client.close()
