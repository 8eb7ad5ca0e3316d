"""What importing real vLLM costs, imitated: `FAKE_VLLM_IMPORT_SECONDS` (default 0).

Real `vllm serve` imports torch and vLLM before its first log line (17.4 s on the H200,
FACTS.md "Start-up time, measured"), and its engine core, a `spawn`ed process unless
`VLLM_WORKER_MULTIPROC_METHOD=fork`, imports them again (17-19 s). The stand-in sleeps the same
way: once when `fake_vllm.cli` is imported (the launcher's pre-import pays it ahead of time), and
once more at the engine core's start unless the method is `fork` (the `vllm` CLI sets `spawn`
when the variable is unset, `cli_env_setup`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping


def import_seconds(env: Mapping[str, str]) -> float:
    try:
        return max(0.0, float(env.get("FAKE_VLLM_IMPORT_SECONDS") or 0.0))
    except ValueError:
        return 0.0


def pay_import(env: Mapping[str, str] = os.environ) -> None:
    """The interpreter imports vLLM."""
    time.sleep(import_seconds(env))


def start_engine_core(env: Mapping[str, str]) -> None:
    """The engine core starts: a spawned one imports vLLM again, a forked one does not."""
    if env.get("VLLM_WORKER_MULTIPROC_METHOD", "spawn") != "fork":
        time.sleep(import_seconds(env))
