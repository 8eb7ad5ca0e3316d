"""The members of a one-GPU swap group take turns under a burst of requests for both (issue 40 item 2): the
fleet coordinator never has both awake or waking at once, through a real daemon (subprocess) and its gateway
in front of the stand-in run by the process runtime."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow

MEMBER = {"gpus": [0], "gpu_memory_utilization": 0.83, "swap_group": "pair", "sleep_level": "1"}


def test_concurrent_requests_for_both_members_of_a_pair_never_wake_both(tmp_path: Path) -> None:
    """a ready, b asleep; 10 streamed requests to each at once: every one answered, and in the swaps (oldest
    first) every wake of one member comes after the other member's sleep, never beside it awake."""
    gateway = free_port()
    url = f"http://127.0.0.1:{gateway}"
    env = {"FAKE_VLLM_TOKEN_SECONDS": "0.05"}
    deployments = {
        "a": process_deployment(free_port(), served_model_name="ma", env=env, **MEMBER),
        "b": process_deployment(free_port(), served_model_name="mb", env=env, **MEMBER),
    }
    settings = {"gateway": {"listen": f"127.0.0.1:{gateway}", "queue_timeout_seconds": 120}}
    with running_daemon(tmp_path, deployments, extra_globals=settings) as daemon:
        daemon.wait_for("a", lambda d: d["state"] == "ready", timeout=60)
        daemon.wait_for("b", lambda d: d["state"] == "asleep", timeout=60)
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(model: str) -> str:
            stream = client.completions.create(model=model, prompt="hi", max_tokens=4, stream=True)
            return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)

        models = [m for _ in range(10) for m in ("mb", "ma")]
        with ThreadPoolExecutor(len(models)) as pool:
            answers = list(pool.map(ask, models))
        assert all(answers), answers
        status = daemon.status()
        assert status is not None
    swaps = sorted((s for s in status["swaps"] if s["ok"]), key=lambda s: s["at"])
    assert [s for s in swaps if s["kind"] == "wake"], swaps
    awake = {"a"}
    for entry in swaps:
        name = entry["deployment"]
        if entry["kind"] == "wake":
            assert awake <= {name}, f"{name} woke while {sorted(awake)} was awake: {swaps}"
            awake.add(name)
        else:
            awake.discard(name)
