"""Tests for dankserve.gateway.tokens: tokens read from JSON answers and streams, split anyhow."""

from __future__ import annotations

import json

from dankserve.gateway.tokens import COMPLETION_GUESS, MAX_JSON_ANSWER, AnswerTally, TokenCount, estimate


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


def test_a_json_answer_over_the_kept_size_is_still_counted() -> None:
    """An answer of several MiB (a big embedding batch) is counted from its `usage`, wherever it lies, in any
    chunking (issue 38 item 2: it counted 0)."""
    row = {"object": "embedding", "embedding": [0.125] * 1000}
    answer = json.dumps(
        {"data": [row] * 800, "usage": {"prompt_tokens": 4321, "completion_tokens": 0}, "tail": "x" * 10_000}
    ).encode()
    assert len(answer) > MAX_JSON_ANSWER
    for piece in (65536, 7, 4099):
        assert tally_of(answer, False, piece) == TokenCount(4321, 0)


def test_the_usage_event_the_gateway_asked_for_is_taken_out_and_still_counted() -> None:
    """drop_usage: the usage-only event is not passed on; every other event and [DONE] are, byte for byte."""
    content = [{"choices": [{"delta": {"content": c}}]} for c in "ab"]
    data = events(*content, {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
    for piece in (1, 7, len(data)):
        tally = AnswerTally(True, drop_usage=True)
        passed = b"".join(tally.feed(data[start : start + piece]) for start in range(0, len(data), piece))
        passed += tally.finish()
        assert passed == events(*content)
        assert tally.count() == TokenCount(9, 2)


def test_estimate_charges_the_body_and_the_completion_limit() -> None:
    """Body bytes at 4 a token plus max_tokens; a generating request without a limit is charged the guess."""
    assert estimate(400, 50, True) == 150
    assert estimate(400, None, True) == 100 + COMPLETION_GUESS
    assert estimate(400, None, False) == 100


def test_responses_and_messages_answers_are_counted_by_their_own_names() -> None:
    """/v1/responses and /v1/messages name them input/output tokens, and their streams' events begin with
    `event:` lines (counted 0 before)."""
    usage = {"input_tokens": 12, "output_tokens": 30}
    answer = json.dumps({"object": "response", "output": [], "usage": usage}).encode()
    assert tally_of(answer, False, 5) == TokenCount(12, 30)
    responses = (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
        b"event: response.completed\ndata: "
        + json.dumps({"type": "response.completed", "response": {"usage": usage}}).encode()
        + b"\n\n"
    )
    assert tally_of(responses, True, 9) == TokenCount(12, 30)
    messages = (
        b"event: message_start\ndata: "
        + json.dumps({"type": "message_start", "message": {"usage": {"input_tokens": 12, "output_tokens": 1}}}).encode()
        + b'\n\nevent: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"hi"}}\n\n'
        + b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":30}}\n\n'
    )
    assert tally_of(messages, True, 11) == TokenCount(12, 30)
