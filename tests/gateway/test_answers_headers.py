"""Tests for dankserve.gateway.answers' pure parts: which headers are hop-by-hop (issue 38 item 12)."""

from __future__ import annotations

from dankserve.gateway.answers import passed_headers


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    """RFC 9110 7.6.1: the fixed hop-by-hop set, and every header any `Connection` header names (any case,
    any spacing, over several Connection headers); the key and the request id are the gateway's to set."""
    headers = {
        "Content-Type": "application/json",
        "Connection": "keep-alive, X-Forwarded-For",
        "Keep-Alive": "timeout=5",
        "X-Forwarded-For": "10.0.0.1",
        "x-tenant": "admin",
        "Authorization": "Bearer client",
        "X-Request-Id": "client",
        "Proxy-Connection": "keep-alive",
        "X-Kept": "1",
    }
    assert passed_headers(headers, ["keep-alive, X-Forwarded-For", "  X-TENANT ,"]) == {
        "Content-Type": "application/json",
        "X-Kept": "1",
    }
