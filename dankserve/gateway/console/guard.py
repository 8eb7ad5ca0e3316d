"""Who may see the console and who may act through it (pure).

A request's key is read as the gateway reads one (`Access.identify`: one `Bearer KEY`, compared in
constant time) with the scope the route needs: `console` for the pages' data, `console:admin` for
actions. With no keys configured, the console answers loopback peers only, read-only: an action
needs a key that holds `console:admin`, so a page another site opens in a local browser cannot act.
Actions also need the `X-Dankserve-Console` header and a JSON body: a cross-site form or a simple
request cannot send either without a CORS preflight the gateway does not grant (no cookie is ever used).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

ACTION_HEADER = "X-Dankserve-Console"
"""Sent by the page with every action; a header a cross-site form cannot set."""


@dataclass(frozen=True)
class Verdict:
    """A console request refused: its status and message."""

    status: int
    message: str


def is_loopback(peer: str | None) -> bool:
    """Whether the peer's address is a loopback one (a unix socket peer, None, is local too)."""
    if peer is None:
        return True
    try:
        return ipaddress.ip_address(peer.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def keyless(peer: str | None, *, action: bool) -> Verdict | None:
    """A gateway without keys: loopback peers read, nobody acts."""
    if not is_loopback(peer):
        return Verdict(403, "the console answers only loopback peers while the gateway has no keys; add a key file")
    if action:
        return Verdict(
            403, 'actions need a key whose file says scopes = ["console:admin"]; the gateway has no keys configured'
        )
    return None


def action_request(content_type: str, header: str | None, origin: str | None, host: str | None) -> Verdict | None:
    """An action's request shape: JSON, the console's header, and no Origin but the gateway's own."""
    if header != "1":
        return Verdict(403, f"an action needs the {ACTION_HEADER}: 1 header (sent by the console's page)")
    if content_type != "application/json":
        return Verdict(415, "an action's body is JSON (Content-Type: application/json)")
    if origin is not None and host is not None and origin.split("://", 1)[-1] != host:
        return Verdict(403, f"an action from another origin ({origin[:100]!r}) is refused")
    return None
