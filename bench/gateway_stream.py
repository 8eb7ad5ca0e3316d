"""The gateway's cost on streaming: 200 concurrent SSE streams through it against the same
straight to the server. Targets: added latency to the first byte <= 1 ms (p50), throughput
>= 0.95x. With `--keys N` (default 20; issue 31) a third path, a second gateway with N client keys
in a keys_dir, each with requests_per_minute, tokens_per_minute and max_concurrent set (high enough
never to refuse, so each is checked and charged on every request), usage counted and saved: the
clients send the N keys in turn; the same targets hold for it.

One stand-in vLLM server (a process, streaming one token per event, FAKE_VLLM_TOKEN_SECONDS
apart) and one gateway (its own process, as in the daemon: its own event loop, a static
supervisor saying the deployment is ready). The client (this process, aiohttp) keeps
`--concurrency` streams open for `--seconds`, each client starting its next request when one
ends; rounds alternate direct and through the gateway so both see the same machine noise.
Per request: time to the first byte of the body (the first SSE event) from sending; per round:
completed streams per second. Figures: the median over rounds of each round's p50 and
throughput.

    .venv/bin/python bench/gateway_stream.py [--concurrency 200] [--rounds 5] [--seconds 8] [--keys 20]
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


def key_secret(index: int) -> str:
    return f"sk-bench-{index:04d}-0123456789abcdef"


def write_keys(directory: Path, count: int) -> None:
    """`count` key files with every limit on (never reached at the bench's rate)."""
    directory.mkdir(mode=0o700)
    for index in range(count):
        path = directory / f"client-{index:02d}.toml"
        path.write_text(
            f'key = "{key_secret(index)}"\nmodels = ["bench-*", "other"]\nrequests_per_minute = 1000000\n'
            f"tokens_per_minute = 100000000\nmax_concurrent = 10000\npriority = {index % 3}\n"
        )
        path.chmod(0o600)


def access_cost(keys: int, repeats: int = 7, requests: int = 2000) -> dict[str, float]:
    """The CPU cost of the keys on one request, in this process (no sockets): find the key among `keys`,
    check its scope and limits, count a 32-event stream's tokens and record it. Median of `repeats`."""
    import tempfile

    from dankserve.gateway.access import Access, Denied
    from dankserve.gateway.tokens import AnswerTally
    from dankserve.settings import GatewaySettings

    place = Path(tempfile.mkdtemp(prefix="dankserve-bench-keys-"))
    write_keys(place / "keys", keys)
    settings = GatewaySettings(keys_dir=place / "keys")
    access = Access(lambda: settings, place / "usage.json")
    event = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" w"}}]}\n\n'
    headers = [[f"Bearer {key_secret(i % keys)}"] for i in range(requests)]
    per_request = []
    for _ in range(repeats):
        started = time.perf_counter()
        for offered in headers:
            key = access.identify(offered)
            assert not isinstance(key, Denied) and key.allows([MODEL]) and access.admit(key) is None
            tally = AnswerTally(True)
            for _ in range(32):
                tally.feed(event)
            tokens = tally.count()
            access.release(key, tokens.total)
            access.record(key.name, MODEL, 200, tokens)
        per_request.append((time.perf_counter() - started) / requests * 1e6)
    access.save()
    return {"keys": keys, "us_per_request": round(statistics.median(per_request), 1)}


def start_stand_in(port: int, token_seconds: float) -> subprocess.Popen[bytes]:
    """The stand-in vLLM serving MODEL on `port`, a token every `token_seconds`, quiet."""
    env = {**os.environ, "FAKE_VLLM_TIME_SCALE": "0.01", "FAKE_VLLM_TOKEN_SECONDS": str(token_seconds)}
    flags = ["--served-model-name", MODEL, "--disable-log-requests", "--disable-uvicorn-access-log"]
    return subprocess.Popen(
        [sys.executable, str(STAND_IN), "serve", "org/bench", "--port", str(port), *flags],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def serve_ready(settings: Any, upstream: int, usage_file: Path | None = None) -> None:
    """Serve a gateway with `settings` (GatewaySettings) over one deployment, MODEL, that a static supervisor
    says is ready on `upstream`, until killed."""
    from dankserve.gateway.backends import Availability, Backend
    from dankserve.gateway.service import start_gateway
    from dankserve.settings import DeploymentSettings

    deployments = {"bench": DeploymentSettings(model="org/bench", served_model_name=MODEL)}
    ready = Backend(Availability.READY, "127.0.0.1", upstream)

    class Ready:
        def backend(self, deployment: str) -> Backend:
            return ready

        def wake(self, deployment: str) -> None:
            return

        def touched(self, deployment: str) -> None:
            return

        def released(self, deployment: str) -> None:
            return

    start_gateway(settings, lambda: deployments, Ready(), usage_file=usage_file)
    while True:
        time.sleep(3600)


def serve_gateway(port: int, upstream: int, keys: int = 0) -> None:
    """The gateway process: one ready deployment on `upstream`, until killed; with `keys`, that many client
    keys in a fresh keys_dir and the usage counters saved to a file beside it."""
    import tempfile

    from dankserve.settings import GatewaySettings

    settings = GatewaySettings(listen=f"127.0.0.1:{port}", max_connections=4096)
    usage_file = None
    if keys:
        place = Path(tempfile.mkdtemp(prefix="dankserve-bench-keys-"))
        write_keys(place / "keys", keys)
        settings = GatewaySettings(listen=f"127.0.0.1:{port}", max_connections=4096, keys_dir=place / "keys")
        usage_file = place / "usage.json"
    serve_ready(settings, upstream, usage_file)


async def one_round(
    port: int, concurrency: int, seconds: float, max_tokens: int, *, stagger: float = 0.0, keys: int = 0
) -> dict[str, Any]:
    """`concurrency` clients for `seconds`, each starting its next stream when one ends. With `stagger`,
    client i starts i/concurrency of `stagger` seconds late (streams then begin evenly spread, as
    independent clients' do) and only requests sent after the last client started are counted; without
    it every client starts at once and, streams being the same length, they stay in lockstep: bursts of
    `concurrency` requests at the same instant."""
    import aiohttp

    body = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": True}
    ).encode()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    first_bytes: list[float] = []
    completed = 0
    errors = 0
    begun = time.perf_counter()
    counted_from = begun + stagger
    stop_at = counted_from + seconds

    async def client(session: aiohttp.ClientSession, index: int) -> None:
        nonlocal completed, errors
        await asyncio.sleep(stagger * index / concurrency)
        headers = {"Content-Type": "application/json"}
        if keys:
            headers["Authorization"] = f"Bearer {key_secret(index % keys)}"
        while time.perf_counter() < stop_at:
            sent = time.perf_counter()
            counted = sent >= counted_from
            try:
                async with session.post(url, data=body, headers=headers) as reply:
                    first = True
                    async for _ in reply.content.iter_any():
                        if first and counted:
                            first_bytes.append(time.perf_counter() - sent)
                        first = False
                    if reply.status != 200:
                        errors += 1
                    elif counted:
                        completed += 1
            except aiohttp.ClientError:
                errors += 1

    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session, i) for i in range(concurrency)))
    elapsed = time.perf_counter() - counted_from
    return {
        "ttfb_p50_ms": statistics.median(first_bytes) * 1000,
        "ttfb_p90_ms": statistics.quantiles(first_bytes, n=10)[-1] * 1000,
        "streams_per_s": completed / elapsed,
        "completed": completed,
        "errors": errors,
    }


def summarise(
    args: argparse.Namespace,
    paths: list[tuple[str, int, int]],
    patterns: dict[str, float],
    rounds: dict[str, list[dict[str, Any]]],
    alone: dict[str, dict[str, Any]],
    *,
    cost: dict[str, float] | None,
) -> None:
    """The table, the JSON record and the verdict lines: each path's medians against direct."""

    def med(key: str, field: str) -> float:
        return float(statistics.median(r[field] for r in rounds[key]))

    rows: list[dict[str, Any]] = []
    summary: dict[str, dict[str, float]] = {}
    through_paths = [mode for mode, _, _ in paths if mode != "direct"]
    for pattern in patterns:
        for mode, _, _ in paths:
            key = f"{pattern}/{mode}"
            rows.append(
                {
                    "path": key,
                    "ttfb_p50_ms": round(med(key, "ttfb_p50_ms"), 2),
                    "ttfb_p90_ms": round(med(key, "ttfb_p90_ms"), 2),
                    "streams_per_s": round(med(key, "streams_per_s"), 1),
                    "errors": sum(r["errors"] for r in rounds[key]),
                }
            )
        direct = rows[-len(paths)]
        for offset, mode in enumerate(through_paths, start=1):
            through = rows[-len(paths) + offset]
            paired = statistics.median(
                g["ttfb_p50_ms"] - d["ttfb_p50_ms"]
                for d, g in zip(rounds[f"{pattern}/direct"], rounds[f"{pattern}/{mode}"], strict=True)
            )
            name = pattern if mode == "gateway" else f"{pattern}/{mode}"
            cpu = [r[f"{mode}_cpu_s"] / max(1, r["completed"]) * 1000 for r in rounds[f"{pattern}/{mode}"]]
            summary[name] = {
                "cpu_ms_per_stream": round(statistics.median(cpu), 2),
                "added_ttfb_p50_ms": round(through["ttfb_p50_ms"] - direct["ttfb_p50_ms"], 2),
                "added_ttfb_p50_ms_paired": round(paired, 2),
                "throughput_ratio": round(through["streams_per_s"] / direct["streams_per_s"], 3),
            }
        for mode in through_paths:
            name = pattern if mode == "gateway" else f"{pattern}/{mode}"
            rows.append(
                {
                    "path": f"{pattern}: {mode} - direct",
                    "ttfb_p50_ms": summary[name]["added_ttfb_p50_ms"],
                    "streams_per_s": summary[name]["throughput_ratio"],
                }
            )
    alone_added = {mode: alone[mode]["ttfb_p50_ms"] - alone["direct"]["ttfb_p50_ms"] for mode in through_paths}
    for mode, added in alone_added.items():
        rows.append({"path": f"one client: {mode} - direct", "ttfb_p50_ms": round(added, 2)})
    report(
        "gateway_stream",
        rows,
        {
            "settings": vars(args) | {"serve_gateway": None},
            "patterns": patterns,
            "rounds": rounds,
            "one_client": alone,
            "one_client_added_ttfb_p50_ms": round(alone_added["gateway"], 2),
            "one_client_added_ttfb_p50_ms_keyed": round(alone_added["keyed"], 2) if args.keys else None,
            "summary": summary,
            "added_ttfb_p50_ms": summary["spread"]["added_ttfb_p50_ms"],
            "throughput_ratio": summary["spread"]["throughput_ratio"],
            "keyed": summary.get("spread/keyed"),
            "keys_cpu_us_per_request": cost,
            "targets": {"added_ttfb_p50_ms": 1.0, "throughput_ratio": 0.95},
        },
    )
    for name, figures in summary.items():
        print(
            f"{name}: added latency to first byte (p50) {figures['added_ttfb_p50_ms']:.2f} ms "
            f"(paired by round {figures['added_ttfb_p50_ms_paired']:.2f} ms; target <= 1 ms); "
            f"throughput {figures['throughput_ratio']:.3f}x (>= 0.95x); "
            f"{figures['cpu_ms_per_stream']:.2f} ms of the gateway's CPU per stream"
        )
    for mode, added in alone_added.items():
        print(f"one client at a time, {mode}: {added:.2f} ms added to the first byte (p50)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each round")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per stream")
    parser.add_argument("--alone-seconds", type=float, default=5.0, help="length of the one-client run")
    parser.add_argument("--token-seconds", type=float, default=0.05, help="the server's spacing of tokens")
    parser.add_argument("--keys", type=int, default=20, help="client keys of the keyed gateway (0: no keyed path)")
    parser.add_argument(
        "--serve-gateway", nargs=3, type=int, metavar=("PORT", "UPSTREAM", "KEYS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(*args.serve_gateway)
        return 0
    if not 1 <= args.concurrency <= 1000 or not 1 <= args.rounds <= 20 or not 0 < args.seconds <= 60:
        raise SystemExit("bounded: concurrency 1-1000, rounds 1-20, seconds per round up to 60")
    if not 0 <= args.keys <= 1000:
        raise SystemExit("bounded: keys 0-1000")

    cost = access_cost(args.keys) if args.keys else None
    if cost is not None:
        print(f"keys' CPU cost per request ({args.keys} keys, 32-event stream): {cost['us_per_request']} us")
    server_port, gateway_port, keyed_port = free_port(), free_port(), free_port()
    server = start_stand_in(server_port, args.token_seconds)
    gateways = {
        mode: subprocess.Popen(
            [sys.executable, __file__, "--serve-gateway", str(port), str(server_port), str(keys)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for mode, port, keys in (("gateway", gateway_port, 0), ("keyed", keyed_port, args.keys))
        if mode == "gateway" or args.keys
    }
    paths = [("direct", server_port, 0), ("gateway", gateway_port, 0)]
    if args.keys:
        paths.append(("keyed", keyed_port, args.keys))
    try:
        wait_healthy(server_port)
        wait_healthy(gateway_port)
        if args.keys:
            wait_healthy(keyed_port)
        # One client at a time first: the gateway's own cost, without the machine's contention.
        alone = {mode: asyncio.run(one_round(port, 1, args.alone_seconds, 1, keys=keys)) for mode, port, keys in paths}
        for mode, result in alone.items():
            print(f"one client, {mode}: {json.dumps({k: round(v, 3) for k, v in result.items()})}")
        # Spread: the clients' streams begin evenly over one stream's length (the figure the target
        # is for: 200 streams open at any time). Burst: every client at once, in lockstep.
        patterns = {"spread": args.tokens * args.token_seconds, "burst": 0.0}
        rounds: dict[str, list[dict[str, Any]]] = {f"{p}/{m}": [] for p in patterns for m, _, _ in paths}
        processes = {
            "server": psutil.Process(server.pid),
            **{mode: psutil.Process(proc.pid) for mode, proc in gateways.items()},
            "client": psutil.Process(),
        }
        for index in range(args.rounds):
            for pattern, stagger in patterns.items():
                for mode, port, keys in paths:
                    before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
                    result = asyncio.run(
                        one_round(port, args.concurrency, args.seconds, args.tokens, stagger=stagger, keys=keys)
                    )
                    for name, watched in processes.items():
                        result[f"{name}_cpu_s"] = sum(watched.cpu_times()[:2]) - before[name]
                    rounds[f"{pattern}/{mode}"].append(result)
                    shown = json.dumps({k: round(v, 3) for k, v in result.items()})
                    print(f"round {index + 1} {pattern} {mode}: {shown}", flush=True)
    finally:
        for proc in (*gateways.values(), server):
            proc.terminate()
            proc.wait(10)

    summarise(args, paths, patterns, rounds, alone, cost=cost)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
