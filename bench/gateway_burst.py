"""A burst of keyed streams from one address (issue 39 item 1): 250 concurrent streams through the
real `openai` SDK (AsyncOpenAI, max_retries=0, one client: every connection from 127.0.0.1, all
with one valid key) into the gateway with its default connection limits. Target: every stream gets
200 or the documented 503 with Retry-After; none dropped (an `APIConnectionError`).

Two gateways over one stand-in vLLM server (a process, FAKE_VLLM_TOKEN_SECONDS between tokens):
`open`, the defaults (no in-flight cap: every stream is passed on), and `capped`, max_in_flight 32
and queue_size 64, where the rest of the burst must get 503 with Retry-After. Each gateway is its
own process with a static supervisor saying the deployment is ready. Per round: each outcome's
count and the seconds until the last stream ended; figures: the median over rounds.

    .venv/bin/python bench/gateway_burst.py [--streams 250] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import report
from bench.gateway_stream import MODEL, free_port, serve_ready, start_stand_in, wait_healthy

SECRET = "sk-bench-burst-0123456789abcdef"
SETUPS: dict[str, dict[str, int]] = {"open": {}, "capped": {"max_in_flight": 32, "queue_size": 64}}


def serve_gateway(port: int, upstream: int, setup: str) -> None:
    """The gateway process: one ready deployment on `upstream`, one key, the default limits (but SETUPS')."""
    from dankserve.settings import GatewaySettings

    keys = Path(tempfile.mkdtemp(prefix="dankserve-bench-burst-")) / "keys"
    keys.mkdir(mode=0o700)
    (keys / "burst.toml").write_text(f'key = "{SECRET}"\n')
    (keys / "burst.toml").chmod(0o600)
    serve_ready(GatewaySettings(listen=f"127.0.0.1:{port}", keys_dir=keys, **SETUPS[setup]), upstream)


async def burst(port: int, streams: int, max_tokens: int) -> dict[str, Any]:
    """`streams` streams at once through one AsyncOpenAI client: each one's outcome counted."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=SECRET, max_retries=0, timeout=120)

    async def one() -> str:
        try:
            chunks = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens, stream=True
            )
            async for _ in chunks:
                pass
        except openai.APIStatusError as exc:
            has_retry = exc.status_code == 503 and exc.response.headers.get("retry-after", "").isdigit()
            return "503_retry_after" if has_retry else f"status_{exc.status_code}"
        except openai.APIConnectionError:
            return "dropped"
        except openai.APIError as exc:
            return type(exc).__name__
        return "ok"

    started = time.perf_counter()
    try:
        outcomes = await asyncio.gather(*(one() for _ in range(streams)))
    finally:
        await client.close()
    counts: dict[str, Any] = {o: outcomes.count(o) for o in set(outcomes)}
    counts["seconds"] = time.perf_counter() - started
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument("--token-seconds", type=float, default=0.02, help="the server's spacing of tokens")
    parser.add_argument("--serve-gateway", nargs=3, metavar=("PORT", "UPSTREAM", "SETUP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(int(args.serve_gateway[0]), int(args.serve_gateway[1]), args.serve_gateway[2])
        return 0
    if not 1 <= args.streams <= 1000 or not 1 <= args.rounds <= 20:
        raise SystemExit("bounded: streams 1-1000, rounds 1-20")
    server_port = free_port()
    server = start_stand_in(server_port, args.token_seconds)
    ports = {setup: free_port() for setup in SETUPS}
    gateways = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve-gateway", str(port), str(server_port), setup],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for setup, port in ports.items()
    ]
    rounds: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
    try:
        wait_healthy(server_port)
        for port in ports.values():
            wait_healthy(port)
        for index in range(args.rounds):
            for setup, port in ports.items():
                result = asyncio.run(burst(port, args.streams, args.tokens))
                rounds[setup].append(result)
                shown = json.dumps({k: round(v, 2) for k, v in sorted(result.items())})
                print(f"round {index + 1} {setup}: {shown}", flush=True)
    finally:
        for proc in (*gateways, server):
            proc.terminate()
            proc.wait(10)

    rows = []
    for setup, results in rounds.items():
        every = {k for r in results for k in r if k != "seconds"}
        unexpected = sorted(every - {"ok", "503_retry_after"})
        rows.append(
            {
                "setup": setup,
                "streams": args.streams,
                "ok_200": statistics.median(r.get("ok", 0) for r in results),
                "503_retry_after": statistics.median(r.get("503_retry_after", 0) for r in results),
                "dropped": sum(r.get("dropped", 0) for r in results),
                "other": sum(r.get(k, 0) for r in results for k in unexpected if k != "dropped"),
                "seconds": round(statistics.median(r["seconds"] for r in results), 2),
            }
        )
    report(
        "gateway_burst", rows, {"settings": vars(args) | {"serve_gateway": None}, "setups": SETUPS, "rounds": rounds}
    )
    failed = [row["setup"] for row in rows if row["dropped"] or row["other"]]
    print("every stream got 200 or 503 with Retry-After" if not failed else f"FAILED: {failed} dropped streams")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
