"""The gateway's cost on streaming: 200 concurrent SSE streams through it against the same
straight to the server. Targets: added latency to the first byte <= 1 ms (p50), throughput
>= 0.95x.

One stand-in vLLM server (a process, streaming one token per event, FAKE_VLLM_TOKEN_SECONDS
apart) and one gateway (its own process, as in the daemon: its own event loop, a static
supervisor saying the deployment is ready). The client (this process, aiohttp) keeps
`--concurrency` streams open for `--seconds`, each client starting its next request when one
ends; rounds alternate direct and through the gateway so both see the same machine noise.
Per request: time to the first byte of the body (the first SSE event) from sending; per round:
completed streams per second. Figures: the median over rounds of each round's p50 and
throughput.

    .venv/bin/python bench/gateway_stream.py [--concurrency 200] [--rounds 5] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench.common import report

REPO = Path(__file__).resolve().parent.parent
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
MODEL = "bench-model"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing healthy on port {port}") from None
            time.sleep(0.1)


def serve_gateway(port: int, upstream: int) -> None:
    """The gateway process: one ready deployment on `upstream`, until killed."""
    from dankserve.gateway.backends import Availability, Backend
    from dankserve.gateway.service import start_gateway
    from dankserve.settings import DeploymentSettings, GatewaySettings

    deployments = {"bench": DeploymentSettings(model="org/bench", served_model_name=MODEL)}
    ready = Backend(Availability.READY, "127.0.0.1", upstream)

    class Ready:
        def backend(self, deployment: str) -> Backend:
            return ready

        def wake(self, deployment: str) -> None:
            return

        def touched(self, deployment: str) -> None:
            return

    start_gateway(GatewaySettings(listen=f"127.0.0.1:{port}", max_connections=4096), lambda: deployments, Ready())
    while True:
        time.sleep(3600)


async def one_round(port: int, concurrency: int, seconds: float, max_tokens: int) -> dict[str, Any]:
    import aiohttp

    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    ).encode()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    first_bytes: list[float] = []
    completed = 0
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal completed, errors
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            try:
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as reply:
                    first = True
                    async for _ in reply.content.iter_any():
                        if first:
                            first_bytes.append(time.perf_counter() - sent)
                            first = False
                    if reply.status == 200:
                        completed += 1
                    else:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "ttfb_p50_ms": statistics.median(first_bytes) * 1000,
        "ttfb_p90_ms": statistics.quantiles(first_bytes, n=10)[-1] * 1000,
        "streams_per_s": completed / elapsed,
        "completed": completed,
        "errors": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each round")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument("--alone-seconds", type=float, default=5.0, help="length of the one-client run")
    parser.add_argument("--token-seconds", type=float, default=0.05, help="the server's spacing of tokens")
    parser.add_argument("--serve-gateway", nargs=2, type=int, metavar=("PORT", "UPSTREAM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(*args.serve_gateway)
        return 0
    if not 1 <= args.concurrency <= 1000 or not 1 <= args.rounds <= 20 or not 0 < args.seconds <= 60:
        raise SystemExit("bounded: concurrency 1-1000, rounds 1-20, seconds per round up to 60")

    server_port, gateway_port = free_port(), free_port()
    env = {**os.environ, "FAKE_VLLM_TIME_SCALE": "0.01", "FAKE_VLLM_TOKEN_SECONDS": str(args.token_seconds)}
    flags = ["--served-model-name", MODEL, "--disable-log-requests", "--disable-uvicorn-access-log"]
    server = subprocess.Popen(
        [sys.executable, str(STAND_IN), "serve", "org/bench", "--port", str(server_port), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    gateway = subprocess.Popen(
        [sys.executable, __file__, "--serve-gateway", str(gateway_port), str(server_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_healthy(server_port)
        wait_healthy(gateway_port)
        # One client at a time first: the gateway's own cost, without the machine's contention.
        alone = {
            mode: asyncio.run(one_round(port, 1, args.alone_seconds, 1))
            for mode, port in (("direct", server_port), ("gateway", gateway_port))
        }
        for mode, result in alone.items():
            print(f"one client, {mode}: {json.dumps({k: round(v, 3) for k, v in result.items()})}")
        rounds: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
        processes = {
            "server": psutil.Process(server.pid),
            "gateway": psutil.Process(gateway.pid),
            "client": psutil.Process(),
        }
        for index in range(args.rounds):
            for mode, port in (("direct", server_port), ("gateway", gateway_port)):
                before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
                result = asyncio.run(one_round(port, args.concurrency, args.seconds, args.tokens))
                for name, watched in processes.items():
                    result[f"{name}_cpu_s"] = sum(watched.cpu_times()[:2]) - before[name]
                rounds[mode].append(result)
                print(f"round {index + 1} {mode}: {json.dumps({k: round(v, 3) for k, v in result.items()})}")
    finally:
        for proc in (gateway, server):
            proc.terminate()
            proc.wait(10)

    def med(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in rounds[mode]))

    rows = [
        {
            "path": mode,
            "ttfb_p50_ms": round(med(mode, "ttfb_p50_ms"), 2),
            "ttfb_p90_ms": round(med(mode, "ttfb_p90_ms"), 2),
            "streams_per_s": round(med(mode, "streams_per_s"), 1),
            "errors": sum(r["errors"] for r in rounds[mode]),
        }
        for mode in ("direct", "gateway")
    ]
    added = rows[1]["ttfb_p50_ms"] - rows[0]["ttfb_p50_ms"]
    ratio = rows[1]["streams_per_s"] / rows[0]["streams_per_s"]
    rows.append({"path": "gateway - direct", "ttfb_p50_ms": round(added, 2), "streams_per_s": round(ratio, 3)})
    alone_added = alone["gateway"]["ttfb_p50_ms"] - alone["direct"]["ttfb_p50_ms"]
    rows.append({"path": "one client: gateway - direct", "ttfb_p50_ms": round(alone_added, 2)})
    report(
        "gateway_stream",
        rows,
        {
            "settings": vars(args) | {"serve_gateway": None},
            "rounds": rounds,
            "one_client": alone,
            "one_client_added_ttfb_p50_ms": round(alone_added, 2),
            "added_ttfb_p50_ms": round(added, 2),
            "throughput_ratio": round(ratio, 3),
            "targets": {"added_ttfb_p50_ms": 1.0, "throughput_ratio": 0.95},
        },
    )
    print(f"added latency to first byte (p50): {added:.2f} ms (target <= 1 ms); throughput {ratio:.3f}x (>= 0.95x)")
    print(f"one client at a time: {alone_added:.2f} ms added to the first byte (p50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
