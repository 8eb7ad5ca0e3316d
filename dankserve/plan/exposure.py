"""What a deployment's server exposes, and to whom (issue 38): pure over the planned address and environment.

vLLM's `--api-key` guards only paths under `/v1` (its AuthenticationMiddleware); everything else it serves
(`/health`, `/metrics`, `/tokenize` ...) and, with `VLLM_SERVER_DEV_MODE=1`, the dev routes (`/sleep`,
`/wake_up`, `/collective_rpc`: worker methods by name) answer whoever connects. A server on its private unix
socket answers dankserve alone; one on TCP answers every local user (and beyond loopback, the network).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
"""Turns on vLLM's dev routes (swap group members need /sleep and /wake_up)."""

UNGUARDED_ROUTES = "/health, /ping, /version, /metrics, /tokenize, /detokenize, /invocations (outside /v1)"
DEV_ROUTES = "/sleep, /wake_up, /is_sleeping, /collective_rpc, /reset_prefix_cache"
LORA_ROUTES = "/v1/load_lora_adapter, /v1/unload_lora_adapter"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Exposure:
    """Where the server listens, who can connect, and which routes answer them without a key."""

    listen: str
    """`unix:PATH` (the path vLLM binds) or `HOST:PORT`."""
    reachable_by: str
    unguarded: tuple[str, ...]
    """Routes anyone who can connect may call without the key (empty on the private socket)."""
    guarded: tuple[str, ...]
    """Routes the deployment's key guards."""
    dev_mode: bool

    @property
    def private(self) -> bool:
        return self.listen.startswith("unix:")

    def lines(self) -> list[str]:
        """The plan's text: one line each."""
        out = [f"listens on {self.listen}: reachable by {self.reachable_by}"]
        if self.unguarded:
            out.append("without a key: " + "; ".join(self.unguarded))
        if self.guarded:
            out.append("key required: " + "; ".join(self.guarded))
        out.append(f"dev mode ({DEV_MODE_ENV}): {'on' if self.dev_mode else 'off'}")
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "listen": self.listen,
            "reachable_by": self.reachable_by,
            "unguarded": list(self.unguarded),
            "guarded": list(self.guarded),
            "dev_mode": self.dev_mode,
        }


def env_flag(env: Mapping[str, str], name: str) -> bool:
    """A vLLM boolean environment variable as vLLM reads it (`1` or `true`)."""
    return env.get(name, "0").strip().lower() in ("1", "true")


def exposure(
    socket: str | None, host: str, port: int, *, dev_mode: bool, lora_updating: bool, keyed: bool, runtime: str
) -> Exposure:
    """The server's exposure: on `socket` (the path vLLM binds; None: TCP on `host:port`), in dev mode, with
    runtime LoRA loading, `keyed` when it has an api_key_file."""
    if socket is not None:
        where = "its 0700 directory under state_dir" if runtime == "process" else "its 0700 directory, mounted"
        return Exposure(f"unix:{socket}", f"dankserve alone (the daemon's user; {where})", (), (), dev_mode)
    reachable = "every user of this host" if host in LOOPBACK else f"anyone who can reach {host}:{port}"
    unguarded = [UNGUARDED_ROUTES]
    guarded: list[str] = []
    if dev_mode:
        unguarded.append(DEV_ROUTES + " (dev mode: sleep, wake, call worker methods by name)")
    api = "/v1/* (completions, chat, models ...)"
    (guarded if keyed else unguarded).append(api)
    if lora_updating:
        (guarded if keyed else unguarded).append(LORA_ROUTES + " (replace the served adapters' weights)")
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return Exposure(listen, reachable, tuple(unguarded), tuple(guarded), dev_mode)


def exposure_warning(found: Exposure) -> str | None:
    """A warning for a TCP server whose dev routes anyone who connects may call (None: nothing that bad)."""
    if found.private or not found.dev_mode:
        return None
    return (
        f"the server listens on {found.listen} with {DEV_MODE_ENV}=1: {found.reachable_by} can call {DEV_ROUTES} "
        'without a key (vLLM\'s key guards only /v1); set listen = "socket" and reach it through the [gateway]'
    )
