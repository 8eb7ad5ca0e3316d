"""Groups from fit (issue 29 item 3) through a real daemon (subprocess) on the process runtime: members
with swap_group = "auto" plan just the bytes they need, two small ones are awake together, a large one
alone, and a request for a sleeping small one wakes it beside the other."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.harness.daemon import MODEL_FACTS, free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow

AUTO = {"gpus": [0], "swap_group": "auto"}
BIG = {**MODEL_FACTS, "parameter_bytes": 120_000_000_000}  # about 0.82 of the H200: alone
SMALL = {**MODEL_FACTS, "parameter_bytes": 20_000_000_000}  # about 0.15: two fit together, not beside big


def test_small_auto_members_are_awake_together_and_a_large_one_alone(tmp_path: Path) -> None:
    """big (first in the config) boots last and puts the small ones to sleep; a request for s1 puts big to
    sleep; one for s2 then wakes it beside s1, which stays ready."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    deployments = {
        "big": process_deployment(free_port(), served_model_name="big", model_facts=BIG, **AUTO),
        "s1": process_deployment(free_port(), served_model_name="s1", model_facts=SMALL, **AUTO),
        "s2": process_deployment(free_port(), served_model_name="s2", model_facts=SMALL, **AUTO),
    }
    with running_daemon(tmp_path, deployments, extra_globals={"gateway": {"listen": f"127.0.0.1:{gateway}"}}) as d:
        d.wait_for("big", lambda s: s["state"] == "ready", timeout=90)
        for small in ("s1", "s2"):
            d.wait_for(small, lambda s: s["state"] == "asleep", timeout=30)
        plans = {e["deployment"]: e for e in d.events_named("swap_sleep")}
        assert set(plans) == {"s1", "s2"}, "made room for big's boot, not slept after their own first boots"

        body = {"prompt": "hi", "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json={**body, "model": "s1"}, timeout=60).status_code == 200
        d.wait_for("big", lambda s: s["state"] == "asleep", timeout=30)
        assert httpx.post(f"{url}/v1/completions", json={**body, "model": "s2"}, timeout=60).status_code == 200
        both = [d.wait_for(n, lambda s: s["state"] == "ready", timeout=30) for n in ("s1", "s2")]
        assert all(s["state"] == "ready" for s in both), "the two small ones fit together"
        sleeps = [e["deployment"] for e in d.events_named("swap_sleep")]
        assert sleeps.count("s1") == 1, "s2's wake put nobody to sleep"
