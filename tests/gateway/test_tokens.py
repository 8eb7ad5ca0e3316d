"""Tests for dankserve.gateway.tokens: tokens read from JSON answers and streams, split anyhow."""

from __future__ import annotations

import json

from dankserve.gateway.tokens import MAX_JSON_ANSWER, AnswerTally, TokenCount


def events(*documents: object) -> bytes:
    return b"".join(b"data: " + json.dumps(d).encode() + b"\n\n" for d in documents) + b"data: [DONE]\n\n"


def tally_of(data: bytes, streamed: bool, piece: int) -> TokenCount:
    tally = AnswerTally(streamed)
    for start in range(0, len(data), piece):
        tally.feed(data[start : start + piece])
    return tally.count()


def test_a_json_answer_is_read_for_its_usage() -> None:
    """The usage of a JSON answer, whatever its chunks."""
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}).encode()
    for piece in (1, 5, len(body)):
        assert tally_of(body, False, piece) == TokenCount(7, 3)
    assert tally_of(b"not json", False, 3) == TokenCount()
    assert tally_of(b'{"usage": {"prompt_tokens": -1}}', False, 100) == TokenCount()


def test_a_stream_with_usage_counts_its_last_usage() -> None:
    """include_usage's last event (no choices) gives the counts, split at any byte."""
    data = events(
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [{"delta": {"content": "b"}}]},
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
    )
    for piece in (1, 7, len(data)):
        assert tally_of(data, True, piece) == TokenCount(9, 2)


def test_a_stream_without_usage_is_estimated_from_its_events() -> None:
    """No usage: one completion token per event with a choice, no prompt tokens, marked estimated."""
    data = events(*({"choices": [{"delta": {"content": "x"}}]} for _ in range(5)))
    assert tally_of(data, True, 3) == TokenCount(0, 5, estimated=True)


def test_huge_answers_are_bounded() -> None:
    """A JSON answer beyond MAX_JSON_ANSWER is not kept; an endless event without a break is dropped."""
    tally = AnswerTally(False)
    for _ in range(MAX_JSON_ANSWER // 65536 + 2):
        tally.feed(b"x" * 65536)
    assert tally.count() == TokenCount(estimated=True)
    stream = AnswerTally(True)
    for _ in range(40):
        stream.feed(b"data: " + b"y" * 65536)
    assert stream.count().total <= 1
