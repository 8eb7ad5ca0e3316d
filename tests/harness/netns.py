"""Hosts made as network namespaces on this machine: a bridge, one veth pair per host, private
addresses the lab chose itself (a free /24 of 10.231.0.0/16). Everything is removed on close.

Needs root and `ip netns`; `available()` says why not where they are missing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.harness.wait import holds_within


def available() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` is unavailable: {probe.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _free_subnet() -> str:
    used = _ip("-4", "addr", "show").stdout
    for _ in range(50):
        third = secrets.randbelow(250) + 2
        prefix = f"10.231.{third}."
        if prefix not in used:
            return prefix
    raise RuntimeError("no free 10.231.X.0/24 subnet")


@dataclass
class NsHost:
    """One namespace: its name, its address, and the root-side end of its link."""

    name: str
    address: str
    veth: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """argv run inside this namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def link(self, up: bool) -> None:
        """Cut (False) or restore (True) this host's link to the others."""
        _ip("link", "set", self.veth, "up" if up else "down")


@dataclass
class Lab:
    """A bridge and the namespaces attached to it."""

    tag: str
    bridge: str
    prefix: str
    hosts: list[NsHost] = field(default_factory=list)

    @classmethod
    def create(cls, count: int) -> Lab:
        tag = secrets.token_hex(2)
        lab = cls(tag=tag, bridge=f"dsbr{tag}", prefix=_free_subnet())
        try:
            _ip("link", "add", lab.bridge, "type", "bridge")
            _ip("addr", "add", f"{lab.prefix}1/24", "dev", lab.bridge)
            _ip("link", "set", lab.bridge, "up")
            for i in range(count):
                name, veth, peer = f"ds-{tag}-{i}", f"dsv{tag}{i}", f"dsp{tag}{i}"
                address = f"{lab.prefix}{i + 2}"
                _ip("netns", "add", name)
                lab.hosts.append(NsHost(name, address, veth))
                _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
                _ip("link", "set", peer, "netns", name)
                _ip("link", "set", veth, "master", lab.bridge)
                _ip("link", "set", veth, "up")
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", peer)
                _ip("-n", name, "link", "set", peer, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            lab.close()
            raise
        return lab

    def close(self) -> None:
        """Kill what still runs in the namespaces, then remove them, the links and the bridge."""
        for host in self.hosts:
            pids = _ip("netns", "pids", host.name, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        if self.hosts:  # a namespace is deleted only once nothing runs in it
            holds_within(
                lambda: not any(_ip("netns", "pids", h.name, check=False).stdout.split() for h in self.hosts), 5
            )
        for host in self.hosts:
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.name, check=False)
        _ip("link", "del", self.bridge, check=False)
