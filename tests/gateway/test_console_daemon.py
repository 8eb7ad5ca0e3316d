"""The web console in a real headless Chromium against a real daemon (subprocess) and its gateway, with
stand-in servers run by the process runtime: the page follows `dankserve sleep` typed on the host
without a reload, and a model named `<script>` shows as text (issue 43)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.harness.browser import CHROMIUM, Browser
from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make system-deps)"),
]

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.9, "swap_group": "g", "sleep_level": "1"}
HOSTILE = "<script>alert(1)</script>"
STATE = "document.querySelector('[data-deployment=\"a\"] .state')?.textContent"


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
