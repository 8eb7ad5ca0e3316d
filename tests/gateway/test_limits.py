"""Tests for dankserve.gateway.limits: token buckets and requests in flight over a given clock."""

from __future__ import annotations

from dankserve.gateway.keys import Key
from dankserve.gateway.limits import KeyLimits

SECRET = "sk-0123456789abcdef"


def test_requests_per_minute_lets_a_burst_in_then_refills_evenly() -> None:
    """60 rpm: 60 at once, the 61st waits a second (Retry-After 1), one more each second."""
    key = Key("a", SECRET, requests_per_minute=60)
    limits = KeyLimits()
    for _ in range(60):
        assert limits.admit(key, 100.0) is None
        limits.release(key, 0, 100.0)
    refused = limits.admit(key, 100.0)
    assert refused is not None and refused.limit == "requests_per_minute" and refused.retry_after == 1
    assert limits.admit(key, 101.0) is None
    assert limits.admit(key, 101.0) is not None


def test_a_slow_limit_says_how_long_to_wait() -> None:
    """2 rpm: the third request is told 30 s."""
    key = Key("a", SECRET, requests_per_minute=2)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None and limits.admit(key, 0.0) is None
    refused = limits.admit(key, 0.0)
    assert refused is not None and refused.retry_after == 30


def test_tokens_per_minute_is_charged_after_the_answer() -> None:
    """A request is let in while the token bucket is not empty; its tokens are charged when it ends."""
    key = Key("a", SECRET, tokens_per_minute=600)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None
    limits.release(key, 1200, 0.0)  # went 600 over
    refused = limits.admit(key, 0.0)
    assert refused is not None and refused.limit == "tokens_per_minute" and refused.retry_after == 61
    assert limits.admit(key, 30.0) is not None
    assert limits.admit(key, 61.0) is None


def test_max_concurrent_counts_requests_in_flight() -> None:
    """With max_concurrent 2, a third request in flight is refused until one ends."""
    key = Key("a", SECRET, max_concurrent=2)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None and limits.admit(key, 0.0) is None
    refused = limits.admit(key, 0.0)
    assert refused is not None and refused.limit == "max_concurrent"
    limits.release(key, 0, 1.0)
    assert limits.admit(key, 1.0) is None and limits.in_flight("a") == 2


def test_a_refused_request_takes_nothing() -> None:
    """A request refused by one limit uses up none of the others."""
    key = Key("a", SECRET, requests_per_minute=1, max_concurrent=1)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None
    assert limits.admit(key, 0.0) is not None  # max_concurrent
    limits.release(key, 0, 0.0)
    assert limits.in_flight("a") == 0


def test_keys_without_limits_are_only_counted() -> None:
    """No limit set: every request is let in."""
    key = Key("a", SECRET)
    limits = KeyLimits()
    assert all(limits.admit(key, 0.0) is None for _ in range(1000))


def test_removed_keys_are_forgotten_once_idle() -> None:
    """A reload that removes a key drops its state, but not while it has requests in flight."""
    key = Key("a", SECRET, requests_per_minute=1)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None
    limits.forget_others(set())
    assert limits.in_flight("a") == 1
    limits.release(key, 0, 0.0)
    limits.forget_others(set())
    assert limits.admit(key, 0.0) is None  # a fresh bucket


def test_an_estimate_is_charged_when_let_in_and_settled_at_the_end() -> None:
    """1,000 tokens a minute: two estimates of 400 are let in, a third is refused (the bucket holds 200); the
    first used 100, so 300 come back; an estimate over the allowance asks for a full bucket only."""
    key = Key("a", SECRET, tokens_per_minute=1000)
    limits = KeyLimits()
    for _ in range(2):
        assert limits.admit(key, 0.0) is None and limits.reserve(key, 400, 0.0) is None
    assert limits.admit(key, 0.0) is None
    refused = limits.reserve(key, 400, 0.0)
    assert refused is not None and refused.limit == "tokens_per_minute" and refused.retry_after == 12
    limits.release(key, 0, 0.0, passed_on=False)
    limits.release(key, 100, 0.0, reserved=400)
    assert limits.admit(key, 0.0) is None and limits.reserve(key, 400, 0.0) is None
    assert KeyLimits.reserved(key, 10**9) == 1000 and KeyLimits.reserved(Key("b", SECRET), 500) == 0


def test_a_request_refused_after_admission_gives_its_request_back() -> None:
    """1 rpm: a request refused for its body or model (never passed on) leaves the minute's request unused."""
    key = Key("a", SECRET, requests_per_minute=1)
    limits = KeyLimits()
    assert limits.admit(key, 0.0) is None
    limits.release(key, 0, 0.0, passed_on=False)
    assert limits.admit(key, 0.0) is None
    limits.release(key, 0, 0.0)
    assert limits.admit(key, 0.0) is not None
