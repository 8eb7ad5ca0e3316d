"""Tests for dankserve.supervisor.probes.warm_up: the warm-up requests against real loopback HTTP servers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.supervisor.probes.health import MAX_ANSWER_BYTES
from dankserve.supervisor.probes.warm_up import WarmUpOutcome, warm_up_server
from tests.harness.wait import hold_for

Answer = Callable[[BaseHTTPRequestHandler, dict[str, object]], None]


def serve(answer: Answer) -> Iterator[tuple[int, list[dict[str, object]]]]:
    seen: list[dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            body["_auth"] = self.headers.get("authorization")
            seen.append(body)
            answer(self, body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def reply(handler: BaseHTTPRequestHandler, status: int, data: bytes, content_type: str = "application/json") -> None:
    handler.send_response(status)
    handler.send_header("content-type", content_type)
    handler.send_header("content-length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def like_vllm(handler: BaseHTTPRequestHandler, body: dict[str, object]) -> None:
    if body.get("stream"):
        reply(handler, 200, b'data: {"choices": [{"text": "x"}]}\n\ndata: [DONE]\n\n', "text/event-stream")
    else:
        reply(handler, 200, json.dumps({"choices": [{"text": "x"}]}).encode())


def stream_cut(handler: BaseHTTPRequestHandler, body: dict[str, object]) -> None:
    if body.get("stream"):
        reply(handler, 200, b"data: {}\n\n", "text/event-stream")
    else:
        like_vllm(handler, body)


@pytest.fixture
def vllm_like() -> Iterator[tuple[int, list[dict[str, object]]]]:
    yield from serve(like_vllm)


def test_a_short_completion_then_the_same_streamed_with_the_key(vllm_like: tuple[int, list[dict[str, object]]]) -> None:
    """Both shapes are sent, greedy and short, to the served name with the API key; both answered is success."""
    port, seen = vllm_like
    assert warm_up_server(TcpAddress("0.0.0.0", port), "served", "k3y", 5.0) == WarmUpOutcome()
    assert [b.get("stream") for b in seen] == [None, True]
    assert all(b["model"] == "served" and b["temperature"] == 0 and b["_auth"] == "Bearer k3y" for b in seen)


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (lambda h, b: reply(h, 500, b"engine dead"), "completion: HTTP 500: engine dead"),
        (lambda h, b: reply(h, 200, b"[1, 2]"), "completion: not a completion"),
        (lambda h, b: reply(h, 200, b'{"choices": []}'), "completion: the completion has no choices"),
        (stream_cut, "streamed completion: the stream did not end in [DONE]"),
    ],
    ids=["5xx", "not-json-object", "no-choices", "stream-cut"],
)
def test_a_broken_answer_is_said(answer: Answer, said: str) -> None:
    """A 5xx, an answer that is not a completion, or a stream without [DONE] is a failed warm-up, named."""
    for port, _ in serve(answer):
        error = warm_up_server(TcpAddress("127.0.0.1", port), "m", None, 5.0).error
        assert error is not None and error.startswith(said)


def test_a_4xx_is_no_failure_but_is_said_as_unwarmed() -> None:
    """A 4xx (a pooling model, a refused key, a name the server does not serve) proves nothing wrong, so the
    boot goes on, but it warmed nothing: said with the status, the model asked for and the answer."""
    for port, seen in serve(lambda h, b: reply(h, 404, b'{"error": "The model `m` does not exist."}')):
        outcome = warm_up_server(TcpAddress("127.0.0.1", port), "m", None, 5.0)
        assert outcome.error is None and len(seen) == 1
        assert outcome.unwarmed is not None and outcome.unwarmed.startswith("completion: HTTP 404 for model 'm'")
        assert "does not exist" in outcome.unwarmed


def test_no_answer_within_the_timeout_is_a_failure_and_bounded() -> None:
    """A server that never answers fails the warm-up after the timeout, not later."""
    for port, _ in serve(lambda h, b: hold_for(3, "a server that never answers within the warm-up's 0.5 s")):
        began = time.monotonic()
        error = warm_up_server(TcpAddress("127.0.0.1", port), "m", None, 0.5).error
        assert error is not None and "no answer within" in error
        assert time.monotonic() - began < 2.5


def test_nothing_listening_is_a_failure() -> None:
    """A closed port is named as the connection's error."""
    error = warm_up_server(TcpAddress("127.0.0.1", closed_port()), "m", None, 1.0).error
    assert error is not None and "ConnectionRefusedError" in error


def test_an_endless_answer_is_read_only_up_to_the_bound() -> None:
    """A hostile server streaming more than MAX_ANSWER_BYTES is cut at the bound (and fails: no [DONE] in it)."""
    huge = b"data: {}\n\n" * (MAX_ANSWER_BYTES // 10 + 10) + b"data: [DONE]\n\n"
    for port, _ in serve(lambda h, b: reply(h, 200, huge, "text/event-stream")):
        error = warm_up_server(TcpAddress("127.0.0.1", port), "m", None, 5.0).error
    assert error is not None and "not a completion" in error


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
