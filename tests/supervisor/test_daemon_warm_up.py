"""The warm-up before READY end to end: the stand-in as a process, whose first completion compiles a kernel."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.harness.daemon import free_port, process_deployment, running_daemon

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("served", [None, "chat-model"], ids=["model-name", "served_model_name"])
def test_the_first_requests_kernel_compile_is_paid_before_ready(tmp_path: Path, served: str | None) -> None:
    """With a 1 s first-request compile in the stand-in, the daemon's warm-up pays it between `warming_up` and
    `ready` (whose warm_up_seconds carries it), asking for the served name when one is set (the H200 showed a
    warm-up sent to the model path, a 404 that warmed nothing); the user's first completion then answers."""
    port = free_port()
    env = {"FAKE_VLLM_FIRST_REQUEST_SECONDS": "1.0"}
    extra = {"served_model_name": served} if served else {}
    with running_daemon(tmp_path, {"chat": process_deployment(port, env=env, **extra)}) as daemon:
        daemon.wait_for("chat", lambda d: d["state"] == "ready")
        names = [e.get("event") for e in daemon.events()]
        assert "warming_up" in names and names.index("warming_up") < names.index("ready")
        (ready,) = daemon.events_named("ready")
        assert ready["warm_up_seconds"] >= 1.0 and ready["boot_seconds"] >= ready["warm_up_seconds"]
        assert not daemon.events_named("warm_up_unwarmed")
        body = json.dumps({"model": served or "test/tiny", "prompt": "hi", "max_tokens": 2}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert json.loads(answer.read())["choices"]
