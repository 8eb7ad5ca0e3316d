"""A server tree's TCP connections whose peer is outside the tree (issue 41, docs/snapshots.md).

CRIU saves every connected socket of a dumped tree (`--tcp-established`) and at each restore puts it back
by binding its own address and connecting to its peer's in repair mode. A client's connection is dead by
then, and once another connection of the host holds the same address pair, the restore fails ("Can't
connect inet socket back: Cannot assign requested address"): found by driving the daemon with a client
polling the server straight through its port during the capture; the second restore of that snapshot
failed. The engine's own loopback connections (both ends in the tree) are restored whole and kept.

So the capture waits, with the server asleep, until no connection of the tree has its peer outside it
(vLLM closes an idle keep-alive connection after 5 s, `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), and the capture
fails (the server serves on) when one stays. `parse_table` and `outside` are pure; `read_outside` reads
/proc.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dankserve.host.gpu_processes import process_tree

Endpoint = tuple[str, int]

# /proc/net/tcp's `st` column (include/net/tcp_states.h): a listening or closed socket has no peer.
_NO_PEER = {"0A", "07"}
_STATES = {
    "01": "established",
    "02": "syn-sent",
    "03": "syn-recv",
    "04": "fin-wait-1",
    "05": "fin-wait-2",
    "06": "time-wait",
    "08": "close-wait",
    "09": "last-ack",
    "0B": "closing",
}
QUIET_TIMEOUT_S = 8.0
"""vLLM's idle keep-alive (5 s) and a margin."""


@dataclass(frozen=True, slots=True)
class Connection:
    local: Endpoint
    remote: Endpoint
    state: str
    inode: int

    def show(self) -> str:
        return f"{_show(self.remote)} -> {_show(self.local)} ({self.state})"


def _show(endpoint: Endpoint) -> str:
    host, port = endpoint
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _endpoint(text: str) -> Endpoint:
    """`0100007F:1F40` (IPv4) or 32 hex digits (IPv6), each 32-bit word in host (little-endian) order; an
    IPv4-mapped IPv6 address is shown as IPv4, so both ends of one connection compare equal."""
    address, _, port = text.partition(":")
    raw = bytes.fromhex(address)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip), int(port, 16)


def parse_table(text: str) -> list[Connection]:
    """The connected sockets of a /proc/net/tcp or tcp6 table (listening and closed ones left out; a line
    that does not parse is skipped: the kernel's format is the only writer, but it is read, not trusted)."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3].upper() in _NO_PEER:
            continue
        with contextlib.suppress(ValueError):
            state = _STATES.get(fields[3].upper(), fields[3])
            found.append(Connection(_endpoint(fields[1]), _endpoint(fields[2]), state, int(fields[9])))
    return found


def outside(connections: Iterable[Connection], inodes: set[int]) -> list[Connection]:
    """The tree's connections (its sockets' inodes) whose peer is not one of the tree's own sockets."""
    ours = [c for c in connections if c.inode in inodes and c.inode != 0]
    ends = {c.local for c in ours}
    return [c for c in ours if c.remote not in ends]


def _socket_inodes(pids: Sequence[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("socket:["):
                        inodes.add(int(target[8:-1]))
    return inodes


def read_outside(root_pid: int) -> list[Connection]:
    """The connections with a peer outside the tree rooted at `root_pid` (read in the tree's network
    namespace: a container's is its own)."""
    pids = process_tree(root_pid)
    inodes = _socket_inodes(pids)
    connections: list[Connection] = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            connections += parse_table(Path(f"/proc/{root_pid}/net/{table}").read_text())
    return outside(connections, inodes)


def wait_quiet(
    root_pid: int,
    timeout_s: float = QUIET_TIMEOUT_S,
    *,
    read: Callable[[int], list[Connection]] = read_outside,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Connection]:
    """Until the tree has no connection with an outside peer, or `timeout_s`: those that stayed."""
    deadline = clock() + timeout_s
    while True:
        left = read(root_pid)
        if not left or clock() >= deadline:
            return left
        sleep(0.05)


def describe(connections: Sequence[Connection]) -> str:
    shown = ", ".join(c.show() for c in connections[:3])
    more = f" and {len(connections) - 3} more" if len(connections) > 3 else ""
    return (
        f"{len(connections)} client connection(s) to the server stayed open ({shown}{more}): CRIU would save "
        "them and a later restore can fail on their addresses (a gateway in front holds requests during a "
        "capture; clients connecting straight to the server's port can keep it from being captured)"
    )
