"""The web console in a real headless Chromium against a real daemon (subprocess) and its gateway, with
stand-in servers run by the process runtime: the page follows `dankserve sleep` typed on the host
without a reload, and a model named `<script>` shows as text (issue 43)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from tests.harness.browser import CHROMIUM, Browser
from tests.harness.daemon import free_port, process_deployment, running_daemon, write_host

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system-deps)"),
]

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
HOSTILE = "<script>alert(1)</script>"
STATE = "document.querySelector('[data-deployment=\"a\"] .state')?.textContent"
SHOTS = os.environ.get("DANKSERVE_CONSOLE_SCREENSHOTS")
"""A folder to write the pages' screenshots into (docs/console/ when refreshing the README's pictures)."""


def test_the_page_follows_a_sleep_from_the_cli(tmp_path: Path) -> None:
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    deployments = {
        "a": process_deployment(free_port(), served_model_name=HOSTILE, **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", **MEMBER),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}  # no keys: loopback reads
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)

        async def drive() -> None:
            async with Browser() as browser:
                await browser.goto(url + "/ui/")
                assert await browser.until(STATE, timeout=30) == "ready"
                assert await browser.evaluate("document.scripts.length") == 1
                reply = daemon.cli("sleep", "a")
                assert reply.returncode == 0, reply.stderr
                assert await browser.until(f"{STATE} === 'asleep' && {STATE}", timeout=30) == "asleep"
                assert browser.errors == []

        asyncio.run(drive())


CELLS = ".map((tr) => '|' + Array.from(tr.cells).map((td) => td.textContent).join('|') + '|')"
SWAPS = "Array.from(document.querySelectorAll('#swap-body table:last-of-type tr'))" + CELLS
REQUESTS = "Array.from(document.querySelectorAll('#requests-body tr'))" + CELLS
GPUS = (
    "Array.from(document.querySelectorAll('.gpu'))"
    ".map((g) => [g.dataset.gpu, g.innerText, g.querySelectorAll('.share').length])"
)


def test_swaps_requests_and_a_bar_per_gpu(tmp_path: Path) -> None:
    """On the recorded two-GPU host: one bar per GPU with each deployment's share of it; a request through the
    gateway shows on the Requests page with its times; a sleep and a wake show on the Swap page with their
    checks (NVML's reading through the stand-in's per-process records, the canary) — no reload."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    host = write_host(tmp_path / "host.json")
    nvml = {"FAKE_VLLM_NVML_DIR": str(host.with_name(host.name + ".processes"))}
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", env=nvml, **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", env=nvml, **MEMBER),
        "c": process_deployment(free_port(), served_model_name="mc", env=nvml, gpus=[1], gpu_memory_utilization=0.5),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}"}}
    with running_daemon(tmp_path, deployments, hardware=host, extra_globals=settings) as daemon:
        for name in ("a", "c"):
            daemon.wait_for(name, lambda d: d["state"] == "ready" and d["gpu_memory_held_bytes"], timeout=60)
        daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)

        async def drive() -> None:
            async with Browser() as browser:
                await browser.goto(url + "/ui/")
                gpus = await browser.until(f"{GPUS}.length === 2 && {GPUS}.every((g) => g[2] > 0) && {GPUS}", 30)
                (zero, text0, shares0), (one, text1, shares1) = gpus
                assert (zero, one, shares0, shares1) == ("0", "1", 2, 1)  # b asleep holds its context
                assert "a (ready): " in text0 and "b (asleep): " in text0 and "c (" not in text0, text0
                assert "c (ready): " in text1 and "a (" not in text1
                if SHOTS:
                    await browser.screenshot(Path(SHOTS) / "deployments.png")
                reply = daemon.cli("sleep", "a")
                assert reply.returncode == 0, reply.stderr
                answer = httpx.post(
                    f"{url}/v1/completions", json={"model": "mb", "prompt": "hi", "max_tokens": 3}, timeout=60
                )
                assert answer.status_code == 200, answer.text
                await browser.evaluate("location.hash = '#swap'; true")
                rows = await browser.until(f"{SWAPS}.some((r) => r.includes('woke')) && {SWAPS}", 30)
                woke = next((r for r in rows if "woke" in r), rows)
                slept = next((r for r in rows if "|slept|" in r and "|a|" in r), rows)
                assert "|b|" in woke and "passed: the same" in woke, woke  # the canary check
                assert "passed: " in slept and "held asleep" in slept, slept  # NVML's reading
                assert rows.index(woke) < rows.index(slept)  # newest first
                if SHOTS:
                    await browser.screenshot(Path(SHOTS) / "swap.png")
                await browser.evaluate("location.hash = '#usage'; true")
                (row,) = await browser.until(f"{REQUESTS}.length > 1 && {REQUESTS}.slice(1)", 30)
                assert "|mb|200|" in row and "ms" in row, row
                if SHOTS:
                    await browser.screenshot(Path(SHOTS) / "usage.png")
                assert await browser.evaluate("performance.getEntriesByType('navigation').length") == 1
                assert browser.errors == []

        asyncio.run(drive())
