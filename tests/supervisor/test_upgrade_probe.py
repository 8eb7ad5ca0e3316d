"""The upgrade's fixed request against the real stand-in vLLM (a process): greedy ids, decode rate,
and what a server that does not answer, or answers nonsense, gives."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.supervisor.upgrade.probe import DECODE_RUNS, DECODE_TOKENS, WARM_RUNS, ProbeFailed, measure
from tests.gateway.conftest import StandIn, stand_ins, start_stand_in
from tests.harness.daemon import free_port
from tests.harness.wait import hold_for

__all__ = ["stand_ins"]


def test_the_stand_in_gives_greedy_ids_and_a_decode_rate(stand_ins: Callable[..., StandIn]) -> None:
    """return_token_ids gives the completion's ids; streamed tokens 10 ms apart time as a positive rate."""
    server = stand_ins("tiny", token_seconds=0.01)
    figures = measure(TcpAddress("127.0.0.1", server.port), "tiny", None, kv_cache_tokens=1000)
    assert len(figures.greedy_ids) == DECODE_TOKENS and figures.kv_cache_tokens == 1000
    assert figures.decode_tokens_per_second is not None and figures.decode_tokens_per_second > 0


def test_the_same_release_gives_the_same_ids() -> None:
    """Two servers of one release answer the fixed greedy request with equal ids."""
    first, second = start_stand_in("tiny"), start_stand_in("tiny")
    try:
        a = measure(TcpAddress("127.0.0.1", first.port), "tiny", None, kv_cache_tokens=None)
        b = measure(TcpAddress("127.0.0.1", second.port), "tiny", None, kv_cache_tokens=None)
    finally:
        for server in (first, second):
            server.proc.kill()
            server.proc.wait(10)
    assert a.greedy_ids == b.greedy_ids
    assert a.decode_tokens_per_second is None, "the whole text in one event cannot be timed"


def test_nothing_listening_is_a_probe_failure() -> None:
    """A closed port: ProbeFailed naming the connection error."""
    with pytest.raises(ProbeFailed, match="Error"):
        measure(TcpAddress("127.0.0.1", free_port()), "tiny", None, kv_cache_tokens=None, timeout=2)


@pytest.fixture
def hostile() -> Iterator[Callable[[int, bytes], int]]:
    """A server answering every POST with one status and body; its port."""
    servers: list[http.server.HTTPServer] = []

    def serve(status: int, body: bytes) -> int:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield serve
    for server in servers:
        server.shutdown()


@pytest.mark.parametrize(
    ("status", "body", "words"),
    [
        (500, b"boom", "HTTP 500"),
        (200, b"not json", "unreadable"),
        (200, b'{"choices": []}', "no choices"),
        (200, b"[1, 2]", "no choices"),
    ],
)
def test_a_bad_answer_is_a_probe_failure(
    hostile: Callable[[int, bytes], int], status: int, body: bytes, words: str
) -> None:
    """An error status, a body that is no JSON or has no choices: ProbeFailed saying so."""
    with pytest.raises(ProbeFailed, match=words):
        measure(TcpAddress("127.0.0.1", hostile(status, body)), "tiny", None, kv_cache_tokens=None)


def test_ids_that_are_no_integers_are_dropped(hostile: Callable[[int, bytes], int]) -> None:
    """token_ids holding strings or booleans keep only the integers; the stream of a JSON body has no rate."""
    port = hostile(200, b'{"choices": [{"token_ids": [1, "2", true, 3]}]}')
    assert measure(TcpAddress("127.0.0.1", port), "tiny", None, kv_cache_tokens=None).greedy_ids == (1, 3)


def test_a_cold_first_stream_does_not_count() -> None:
    """A server whose first streamed completion is slow (just booted) is timed by its later, warm ones."""
    streams: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            self.send_response(200)
            self.end_headers()
            if b'"stream": true' not in body:
                self.wfile.write(b'{"choices": [{"token_ids": [1, 2, 3]}]}')
                return
            streams.append(1)
            gap = 0.05 if len(streams) == 1 else 0.002
            for _ in range(8):
                self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
                self.wfile.flush()
                hold_for(gap, "the stream's pace: the first stream is slow, the others fast")
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        figures = measure(TcpAddress("127.0.0.1", server.server_address[1]), "tiny", None, kv_cache_tokens=None)
    finally:
        server.shutdown()
    assert len(streams) == WARM_RUNS + DECODE_RUNS
    assert figures.decode_tokens_per_second is not None and figures.decode_tokens_per_second > 100
