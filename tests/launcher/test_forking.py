"""Tests for dankserve.launcher.forking: when a server is forked from the pre-imported vLLM, and why not."""

from __future__ import annotations

import pytest

from dankserve.launcher.forking import METHOD_VAR, Zygote, decide, import_time_differences, server_env

READY = Zygote(imported=True, threads=("python3",), env={"NO_COLOR": "1"})


def test_a_clean_import_forks_and_the_engine_core_is_forked_too() -> None:
    """A single-threaded import without CUDA forks, and the server's env asks vLLM to fork its engine core."""
    decision = decide(["m"], {"NO_COLOR": "1"}, READY)
    assert decision.fork
    assert server_env({"NO_COLOR": "1"}, decision)[METHOD_VAR] == "fork"


@pytest.mark.parametrize(
    ("argv", "env", "zygote", "why"),
    [
        (["m"], {METHOD_VAR: "spawn", "NO_COLOR": "1"}, READY, "spawn is set"),
        (["m"], {"RAY_ADDRESS": "10.0.0.1:6379", "NO_COLOR": "1"}, READY, "Ray actor"),
        (["m", "--distributed-executor-backend", "ray"], {"NO_COLOR": "1"}, READY, "Ray workers"),
        (["m", "--numa-bind"], {"NO_COLOR": "1"}, READY, "--numa-bind"),
        (["m", "--device=cpu"], {"NO_COLOR": "1"}, READY, "cpu platform"),
        (["m"], {"NO_COLOR": "1"}, Zygote(imported=True, wsl=True, env={"NO_COLOR": "1"}), "WSL"),
        (["m"], {"NO_COLOR": "1"}, Zygote(imported=False, error="ImportError: no torch"), "no torch"),
        (["m"], {"NO_COLOR": "1"}, Zygote(imported=True, cuda_initialized=True, env={"NO_COLOR": "1"}), "CUDA"),
        (
            ["m"],
            {"NO_COLOR": "1"},
            Zygote(imported=True, threads=("py", "pool[9]"), python_threads=("pool[9]",), env={"NO_COLOR": "1"}),
            "Python threads (pool[9])",
        ),
        (["m"], {"NO_COLOR": "0"}, READY, "NO_COLOR"),
        (["m"], {"NO_COLOR": "1", "PYTHONPATH": "/x"}, READY, "PYTHONPATH"),
    ],
)
def test_each_reason_for_spawn_falls_back_to_a_plain_boot(
    argv: list[str], env: dict[str, str], zygote: Zygote, why: str
) -> None:
    """vLLM's own reasons for spawn, and ours, give a plain boot that says why."""
    decision = decide(argv, env, zygote)
    assert not decision.fork
    assert why in decision.reason
    assert METHOD_VAR not in server_env({}, decision)


def test_an_explicit_fork_or_other_method_is_kept() -> None:
    """A method the deployment sets itself is not overridden."""
    decision = decide(["m"], {"NO_COLOR": "1", METHOD_VAR: "forkserver"}, READY)
    assert server_env({METHOD_VAR: "forkserver"}, decision)[METHOD_VAR] == "forkserver"


def test_only_variables_read_at_import_count_as_differences() -> None:
    """Other variables (a changed CUDA_VISIBLE_DEVICES, the model's) reach the forked server as they are."""
    before = {"NO_COLOR": "1", "CUDA_VISIBLE_DEVICES": "0", "LD_PRELOAD": "a"}
    after = {"NO_COLOR": "1", "CUDA_VISIBLE_DEVICES": "1", "VLLM_LOGGING_LEVEL": "DEBUG"}
    assert import_time_differences(before, after) == ["LD_PRELOAD", "VLLM_LOGGING_LEVEL"]


def test_native_threads_alone_still_fork_and_are_counted() -> None:
    """Native threads (BLAS and OpenMP pools, the CUDA driver's helper) without a Python thread fork, counted."""
    zygote = Zygote(imported=True, threads=("python3", "python3[7]", "cuda00001800007[8]"), env={"NO_COLOR": "1"})
    decision = decide(["m"], {"NO_COLOR": "1"}, zygote)
    assert decision.fork
    assert "2 native threads" in decision.reason
