"""Each failure class of the policy table, injected through the stand-in on real Podman, repeated: handled as
docs/failure-policy.md says (tests/supervisor/test_daemon.py covers the same on the process runtime, once)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from tests.harness.daemon import RunningDaemon, container_deployment, free_port, running_daemon
from tests.harness.faults import FaultTally, containers_of, cycles, is_ready, reproduce, tally
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import first_problem

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]

Status = dict[str, Any]
GIB = 2**30


def failed(status: Status) -> bool:
    return bool(status["state"] == "failed")


def failure_class(status: Status) -> str | None:
    last = status.get("last_failure") or {}
    return last.get("class")


@dataclass(frozen=True)
class Case:
    """One failure class: how to cause it, what the policy says happens, how to see that it did."""

    cause: str
    policy: str
    deployment: dict[str, Any]
    done: Callable[[Status], bool]
    """The deployment's status once the policy has played out."""
    check: Callable[[Status, RunningDaemon, PodmanEnv, str], str | None]
    """None when the outcome is the policy's, else what is wrong."""
    globals_: dict[str, Any] = field(default_factory=dict)


def config_error(cause: str, boots: int) -> Callable[[Status, RunningDaemon, PodmanEnv, str], str | None]:
    """Failed with this cause after `boots` boots, never restarted beyond them, no container left."""

    def check(status: Status, daemon: RunningDaemon, env: PodmanEnv, name: str) -> str | None:
        # a wrongful restart would show within a second: watched for the whole of it
        again = first_problem(
            lambda: None if (daemon.deployment(name) or status)["boots"] <= boots else f"booted again after {boots}",
            1.0,
        )
        if again is not None:
            return again
        status = daemon.deployment(name) or status
        if failure_class(status) != cause:
            return f"last failure {failure_class(status)}, not {cause}"
        if status["boots"] != boots or status["state"] != "failed":
            return f"state {status['state']} after {status['boots']} boots (want failed after {boots})"
        if containers_of(env, name):
            return "a container was left behind"
        return None

    return check


def restarted(cause: str, min_boots: int) -> Callable[[Status, RunningDaemon, PodmanEnv, str], str | None]:
    """Restarted (not failed) after this cause, at least `min_boots` boots, one container."""

    def check(status: Status, daemon: RunningDaemon, env: PodmanEnv, name: str) -> str | None:
        if failure_class(status) != cause:
            return f"last failure {failure_class(status)}, not {cause}"
        if status["state"] == "failed" or status["boots"] < min_boots:
            return f"state {status['state']} after {status['boots']} boots"
        if len(containers_of(env, name)) > 1:
            return "two containers"
        return None

    return check


def remediated(status: Status, daemon: RunningDaemon, env: PodmanEnv, name: str) -> str | None:
    """max_len_too_large: the second boot runs with vLLM's estimate and serves."""
    if failure_class(status) != "max_len_too_large" or status["boots"] != 2 or not is_ready(status):
        return f"{failure_class(status)}, {status['state']} after {status['boots']} boots"
    args = json.loads(env.podman("inspect", workload_name(name)).stdout)[0]["Args"]
    if "--max-model-len" not in args:
        return "the remediated boot has no --max-model-len"
    return None


def engine_death_seen_in_time(status: Status, daemon: RunningDaemon, env: PodmanEnv, name: str) -> str | None:
    """engine_dead: detected within 10 s of ready, restarted, ready again."""
    problem = restarted("engine_dead", 2)(status, daemon, env, name)
    if problem:
        return problem
    events = [e for e in daemon.events() if e.get("deployment") == name]
    ready_at = [e["timestamp"] for e in events if e.get("event") == "ready"]
    failed_at = [e["timestamp"] for e in events if e.get("event") == "boot_failed"]
    if not ready_at or not failed_at:
        return "no ready or no failure event"
    gap = _seconds(failed_at[0]) - _seconds(ready_at[0])
    return None if 0 <= gap <= 10 else f"engine death seen {gap:.1f} s after ready"


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


SMALL_GPU = {"FAKE_VLLM_GPU_MEMORY_BYTES": str(8 * GIB), "FAKE_VLLM_KV_BYTES_PER_TOKEN": str(131072)}
CASES = [
    Case(
        "bad_argument",
        "config_error: failed at once with vLLM's message, not restarted",
        {"extra_args": ["--max-num-seqz", "16"]},
        failed,
        config_error("bad_argument", 1),
    ),
    Case(
        "model_not_found",
        "config_error: failed at once, not restarted",
        {"env": {"FAKE_VLLM_FAIL": "model_not_found"}},
        failed,
        config_error("model_not_found", 1),
    ),
    Case(
        "max_len_too_large",
        "remediate_once: boots again with vLLM's estimated maximum length, which serves",
        {"env": SMALL_GPU},
        lambda s: is_ready(s) or failed(s),
        remediated,
    ),
    Case(
        "no_kv_memory",
        "remediate_once: one boot at the top of the utilisation band, then config_error",
        {"env": {"FAKE_VLLM_FAIL": "no_kv_memory"}},
        failed,
        config_error("no_kv_memory", 2),
    ),
    Case(
        "oom_load",
        "relearn / restart with backoff until more than max_failures_in_window (2 here), then failed",
        {"env": {"FAKE_VLLM_FAIL": "oom_load"}},
        failed,
        config_error("oom_load", 3),
        {"max_failures_in_window": 2},
    ),
    Case(
        "boot_timeout",
        "hung boot (FAKE_VLLM_FAIL=hang): stopped at boot_timeout_seconds (3 here) and restarted",
        {"env": {"FAKE_VLLM_FAIL": "hang"}},
        lambda s: s["boots"] >= 3,
        restarted("boot_timeout", 3),
        {"boot_timeout_seconds": 3},
    ),
    Case(
        "engine_dead",
        "engine death while serving: detected within 10 s (/health 503), restarted",
        {"env": {"FAKE_VLLM_FAIL": "engine_dead"}},
        lambda s: (s["boots"] >= 2 and is_ready(s)) or failed(s),
        engine_death_seen_in_time,
    ),
    Case(
        "crash",
        "exit without a known cause (FAKE_VLLM_CRASH_AFTER_SECONDS): restarted with backoff",
        {"env": {"FAKE_VLLM_CRASH_AFTER_SECONDS": "1"}},
        lambda s: s["boots"] >= 3 or failed(s),
        restarted("crash", 3),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.cause for c in CASES])
def test_failure_classes_are_handled_as_the_policy_says(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
    case: Case,
) -> None:
    """Two deployments at a time (one per GPU) hit the failure class; each ends as the policy table says."""
    base = deployments[0]
    record = FaultTally(
        f"08-policy-{CASES.index(case)}-{case.cause}",
        f"failure class `{case.cause}`, caused through the stand-in",
        case.policy,
        reproduce(
            f"'tests/reliability/test_policy_faults.py::test_failure_classes_are_handled_as_the_policy_says"
            f"[{case.cause}]'"
        ),
    )
    with tally(record):
        for run in range(cycles("policy_faults")):
            run_dir = tmp_path / f"run{run}"
            (run_dir / "hf").mkdir(parents=True)
            names = [f"{base}-{run}{gpu}" for gpu in (0, 1)]
            deployments.extend(names)
            specs = {}
            for gpu, name in enumerate(names):
                extra = {**case.deployment, "env": {"FAKE_VLLM_TIME_SCALE": "0.02", **case.deployment.get("env", {})}}
                specs[name] = container_deployment(vllm_image, free_port(), gpus=[gpu], **extra)
            globals_ = {**podman_globals, **case.globals_}
            with running_daemon(run_dir, specs, hardware=stand_in_host, extra_globals=globals_) as daemon:
                for name in names:
                    record.inject()
                    try:
                        status = daemon.wait_for(name, case.done, timeout=120)
                    except AssertionError as exc:
                        record.lose(f"{name}: never settled: {str(exc)[:300]}")
                        continue
                    problem = case.check(status, daemon, podman_env, name)
                    if problem:
                        record.lose(f"{name}: {problem}")
                    else:
                        record.recover()
                assert daemon.stop() == 0
            for name in names:
                assert containers_of(podman_env, name) == []
    record.check()
