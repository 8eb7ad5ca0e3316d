"""In-process tests of the deployment worker (the machine's interpreter) over a fake runtime and a fake clock.

Nothing here sleeps on wall time: boot timeouts and backoffs pass on the fake clock. The real
runtimes are tested end to end in test_daemon.py (process) and test_daemon_podman.py (Podman).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dankserve.bootlog.facts import FailureClass
from dankserve.bootlog.patterns import ALL_PATTERNS
from dankserve.errors import GroupNotFormed, MemberUnreachable
from dankserve.host.gpu_reader import RecordedGpus
from dankserve.settings import SettingsSource, load_settings
from dankserve.supervisor import machine as m
from dankserve.supervisor.assembly import make_planner
from dankserve.supervisor.daemon import BootOverrides, Daemon
from dankserve.supervisor.probes.warm_up import WarmUpOutcome
from dankserve.supervisor.records import StateBook
from dankserve.supervisor.worker import DeploymentWorker
from dankserve.supervisor.world import ServerEdges
from dankserve.supervisor.world import World as DaemonWorld
from dankserve.testing import write_recorded_host
from dankserve.testing.config_file import write_config
from dankserve.testing.lifecycle import (
    OOM_LINE,
    READY_LINE,
    VERSION_LINE,
    FakeBoot,
    FakeClock,
    FakeRuntime,
    Handler,
    serving_lines,
)
from tests.harness.daemon import MODEL_FACTS
from tests.harness.wait import wait_until


@dataclass
class World:
    """A daemon (not running its main loop) with one deployment, a fake runtime and a fake clock."""

    daemon: Daemon
    runtime: FakeRuntime
    clock: FakeClock
    port_holders: list[str | None]

    def worker(self, name: str = "chat") -> DeploymentWorker:
        worker = DeploymentWorker(name, self.daemon.settings.deployments[name], self.daemon.worker_services())
        self.daemon.fleet.add(worker)
        return worker


def world_globals(tmp_path: Path) -> dict[str, Any]:
    """The global settings of a world's config (and of a reload that keeps its directories)."""
    return {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache"),
        "hf_cache_dir": str(tmp_path / "hf"),
        "vllm_version": "0.33.0",
    }


def world_deployment(port: int, **extra: Any) -> dict[str, Any]:
    """A world's deployment: the tiny test model in the stand-in's image."""
    return {
        "model": "test/tiny",
        "image": "vllm/vllm-openai:v0.33.0",
        "port": port,
        "model_facts": MODEL_FACTS,
        **extra,
    }


def make_world(
    tmp_path: Path,
    handler: Handler | None = None,
    *,
    dep: dict[str, Any] | None = None,
    runtime: FakeRuntime | None = None,
    **globals_: Any,
) -> World:
    config = write_config(
        tmp_path / "dankserve.toml",
        {**world_globals(tmp_path), "health_interval_seconds": 1.0, "gpu_memory_settle_seconds": 2.0, **globals_},
        {"chat": world_deployment(18000, **(dep or {}))},
    )
    settings = load_settings(config)
    host_file = write_recorded_host(tmp_path / "host.json")
    from dankserve.host.recorded import read_host

    runtime = runtime or FakeRuntime(handler)
    clock = FakeClock()
    holders: list[str | None] = []
    host = read_host(host_file)
    daemon_world = DaemonWorld(
        source=SettingsSource(settings),
        state=StateBook(settings.state_dir),
        host=host,
        gpus=RecordedGpus(host_file, host),
        planner=make_planner(settings),
        runtime_for=lambda dep: runtime,
        clock=clock,
        servers=ServerEdges(
            check_port=lambda address: holders.pop(0) if holders else None,
            health=lambda address, timeout: runtime.health("chat"),
            warm_up=lambda address, model, key, timeout: WarmUpOutcome(),
        ),
        draw=lambda: 0.0,
        config_path=config,
    )
    return World(Daemon(daemon_world), runtime, clock, holders)


def wait_for(worker: DeploymentWorker, done: Callable[[m.MachineState], bool], timeout: float = 20.0) -> m.MachineState:
    """The worker's machine once `done` holds (the test's own bounded poll of another thread)."""
    return wait_until(
        lambda: worker.machine if done(worker.machine) else None,
        timeout,
        0.005,
        what=lambda: f"the stage; at {worker.machine.stage} {worker.machine.message}",
    )


def ready(state: m.MachineState) -> bool:
    return state.stage is m.Stage.READY


@pytest.fixture
def stopping() -> Iterator[list[DeploymentWorker]]:
    workers: list[DeploymentWorker] = []
    yield workers
    for worker in workers:
        worker.request_stop()
        worker.join(10)


def test_a_first_boot_learns_and_a_crash_restarts_with_the_learned_bytes(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """A profiled first boot stores its KV bytes; after the server dies the next boot passes them."""
    world = make_world(tmp_path)
    worker = world.worker()
    stopping.append(worker)
    first = wait_for(worker, lambda s: ready(s) and bool(world.daemon.state.deployment("chat").learned_kv))
    assert first.boots == 1 and not first.kv_cache_learned_used
    record = world.daemon.state.deployment("chat")
    assert [e.kv_cache_memory_bytes for e in record.learned_kv.values()] == [132530194268]
    assert first.workload_id is not None
    world.runtime.crash(first.workload_id)
    second = wait_for(worker, lambda s: ready(s) and s.boots == 2)
    assert second.kv_cache_learned_used and second.restarts == 1
    assert "--kv-cache-memory-bytes" in world.runtime.specs[-1].argv
    assert world.daemon.state.deployment("chat").last_failure.cause == "engine_dead"  # type: ignore[union-attr]
    assert world.runtime.called("remove")[0] == first.workload_id


def failure_line(failure: FailureClass) -> str:
    return next(p.sample for p in ALL_PATTERNS if p.failure is failure)


CLASSES = [
    # (failure class, what every boot prints and does, boots until `failed` with max_failures_in_window = 2)
    ("bad_argument", FakeBoot((failure_line(FailureClass.BAD_ARGUMENT),), exit_code=2), 1),
    ("model_not_found", FakeBoot((failure_line(FailureClass.MODEL_NOT_FOUND),), exit_code=1), 1),
    ("no_kv_memory", FakeBoot((failure_line(FailureClass.NO_KV_MEMORY),), exit_code=1), 2),
    ("oom_load", FakeBoot((VERSION_LINE, OOM_LINE), exit_code=1), 3),
    ("engine_dead", FakeBoot((failure_line(FailureClass.ENGINE_DEAD),), exit_code=1), 3),
    ("other", FakeBoot(("Traceback (most recent call last):", "KeyError: 'x'"), exit_code=1), 3),
    ("crash", FakeBoot((VERSION_LINE,), exit_code=139), 3),
    ("boot_timeout", FakeBoot((VERSION_LINE,)), 3),
]


@pytest.mark.parametrize(("cause", "boot", "boots"), CLASSES, ids=[c[0] for c in CLASSES])
def test_each_failure_class_is_handled_as_the_policy_says(
    tmp_path: Path, stopping: list[DeploymentWorker], cause: str, boot: FakeBoot, boots: int
) -> None:
    """Configuration errors fail at once (or after one remediation); the rest restart until the window's limit."""
    world = make_world(tmp_path, lambda spec, n: boot, max_failures_in_window=2, boot_timeout_seconds=30)
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, lambda s: s.stage is m.Stage.FAILED)
    record = world.daemon.state.deployment("chat")
    assert record.last_failure is not None and record.last_failure.cause == cause
    assert state.boots == boots == len(world.runtime.called("start"))
    assert world.runtime.running("chat") is None, "nothing left running"


def test_a_too_long_context_is_remediated_once_and_serves(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """max_len_too_large: the second boot gets vLLM's estimate as --max-model-len and serves."""
    boots = [FakeBoot((failure_line(FailureClass.MAX_LEN_TOO_LARGE),), exit_code=1), FakeBoot()]
    world = make_world(tmp_path, lambda spec, n: boots[min(n, 2) - 1])
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, lambda s: ready(s) and s.boots == 2)
    argv = world.runtime.specs[-1].argv
    assert argv[argv.index("--max-model-len") + 1] == "34480"
    assert state.restarts == 1 and world.daemon.state.deployment("chat").remediated == ("max_len_too_large",)


def test_engine_death_while_serving_restarts(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """/health 503 while ready is a dead engine: the workload is replaced and serves again."""
    world = make_world(tmp_path, lambda spec, n: FakeBoot(healthy=n > 1) if n > 1 else FakeBoot())
    worker = world.worker()
    stopping.append(worker)
    first = wait_for(worker, ready)
    assert first.workload_id is not None
    world.runtime.sicken(first.workload_id)
    wait_for(worker, lambda s: ready(s) and s.boots == 2)
    assert world.daemon.state.deployment("chat").last_failure.cause == "engine_dead"  # type: ignore[union-attr]


def test_a_server_already_on_the_port_is_not_taken_for_this_boot(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """/health answering before this boot's log said anything is not ready: the boot times out instead."""
    world = make_world(tmp_path, lambda spec, n: FakeBoot((VERSION_LINE,)), boot_timeout_seconds=5)
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, lambda s: s.restarts >= 1)
    assert world.daemon.state.deployment("chat").last_failure.cause == "boot_timeout"  # type: ignore[union-attr]
    assert state.stage is not m.Stage.READY


def test_a_port_held_by_another_process_is_named_and_waited_for(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """The holder of the port is named in the message; the boot starts once the port is free, no failure counted."""
    world = make_world(tmp_path)
    world.port_holders.extend(["pid 4242 (python3: vllm serve)", "pid 4242 (python3: vllm serve)"])
    worker = world.worker()
    stopping.append(worker)
    waiting = wait_for(worker, lambda s: s.stage is m.Stage.RETRY_WAIT)
    assert waiting.message is not None and "port 18000 is in use by pid 4242" in waiting.message
    state = wait_for(worker, ready)
    assert state.restarts == 0 and world.daemon.state.deployment("chat").last_failure is None


def test_a_running_server_of_the_same_plan_is_adopted(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """A workload an earlier daemon left running with this plan is followed, not restarted."""
    world = make_world(tmp_path)
    dep = world.daemon.settings.deployments["chat"]
    plan = world.daemon.world.planner("chat", dep, world.daemon.host, BootOverrides(), "0.8.5")
    left = world.runtime.run_existing("chat", plan.fingerprint)
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, ready)
    assert state.workload_id == left and world.runtime.called("start") == []


def test_a_running_server_of_another_plan_is_replaced(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """A workload with another plan's fingerprint is stopped and removed before the new boot starts."""
    world = make_world(tmp_path)
    left = world.runtime.run_existing("chat", "an-older-plan")
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, ready)
    assert state.workload_id != left and world.runtime.called("stop")[0] == left
    assert world.runtime.called("start") == ["chat"]


def test_a_reload_boots_the_new_configuration(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """A changed deployment stops the old workload and boots with the new settings, forgetting remediations."""
    world = make_world(tmp_path)
    worker = world.worker()
    stopping.append(worker)
    first = wait_for(worker, ready)
    dep = world.daemon.settings.deployments["chat"].model_copy(update={"max_num_seqs": 7})
    worker.request_replan(dep)
    wait_for(worker, lambda s: ready(s) and s.boots == 2)
    assert world.runtime.called("stop") == [first.workload_id]
    argv = world.runtime.specs[-1].argv
    assert argv[argv.index("--max-num-seqs") + 1] == "7"


def test_stop_removes_the_workload_and_ends_the_worker(tmp_path: Path) -> None:
    """A stop request stops and removes the running workload; the worker thread ends in `stopped`."""
    world = make_world(tmp_path)
    worker = world.worker()
    state = wait_for(worker, ready)
    worker.request_stop()
    assert worker.join(10)
    assert worker.machine.stage is m.Stage.STOPPED and worker.machine.status == "stopped"
    assert world.runtime.called("remove") == [state.workload_id]
    assert world.runtime.running("chat") is None


def test_a_runtime_outage_before_the_boot_is_retried_without_a_failure(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """Podman unreachable while preparing a boot: retried with backoff, never counted, never `failed`."""
    world = make_world(tmp_path)
    world.runtime.unreachable = True
    worker = world.worker()
    stopping.append(worker)
    waiting = wait_for(worker, lambda s: s.stage is m.Stage.RETRY_WAIT and s.retry_attempts >= 3)
    assert waiting.status == "restarting" and "unreachable" in (waiting.message or "")
    world.runtime.unreachable = False
    state = wait_for(worker, ready)
    assert state.restarts == 0 and world.daemon.state.deployment("chat").last_failure is None


def test_a_group_member_lost_while_serving_reaches_last_failure(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """A MemberLost event fed from outside restarts the deployment with the member's reason as the failure."""
    world = make_world(tmp_path)
    worker = world.worker()
    stopping.append(worker)
    wait_for(worker, ready)
    worker.feed(m.MemberLost("10.0.0.2:7070 did not answer 2 times"))
    wait_for(worker, lambda s: ready(s) and s.boots == 2)
    failure = world.daemon.state.deployment("chat").last_failure
    assert failure is not None and "10.0.0.2:7070 did not answer" in (failure.message or "")


def test_status_online_and_offline_show_the_same_fields(tmp_path: Path, stopping: list[DeploymentWorker]) -> None:
    """The daemon's status and the offline one (from state.json) have the same keys; a stopped one the same values."""
    from dankserve.cli.status import offline_status

    world = make_world(tmp_path, dep={"enabled": False})
    online = world.daemon.status()["deployments"][0]
    offline = offline_status(world.daemon.settings)["deployments"][0]
    assert online == offline
    assert online["state"] == "disabled"
    (tmp_path / "b").mkdir()
    world2 = make_world(tmp_path / "b")
    worker = world2.worker()
    stopping.append(worker)
    wait_for(worker, ready)
    running = world2.daemon.status()["deployments"][0]
    world2.daemon.state.flush()
    after = offline_status(world2.daemon.settings)["deployments"][0]
    assert list(running) == list(after)
    assert running["state"] == "ready" and after["state"] == "stopped"
    for key in ("boots", "restarts", "kv_cache_memory_bytes", "compile_cache_hit", "vllm_version", "hosts"):
        assert running[key] == after[key], key


def test_ready_line_is_what_makes_the_boot_ready() -> None:
    """The scripted serving boot ends with vLLM's startup line (what readiness needs besides /health)."""
    assert serving_lines()[-1] == READY_LINE


@pytest.mark.parametrize("error", [MemberUnreachable("10.0.0.2:7070: refused"), GroupNotFormed("Ray saw 1 of 2")])
def test_cluster_errors_are_retried_like_a_podman_outage(
    tmp_path: Path, stopping: list[DeploymentWorker], error: Exception
) -> None:
    """A group member not answering (or Ray not forming) is retried with backoff, never counted as a failure."""
    world = make_world(tmp_path)
    planner = world.daemon.world.planner
    raised: list[bool] = []

    def flaky(*args: Any) -> Any:
        if len(raised) < 2:
            raised.append(True)
            raise error
        return planner(*args)

    world.daemon.world = dataclasses.replace(world.daemon.world, planner=flaky)
    worker = world.worker()
    stopping.append(worker)
    state = wait_for(worker, ready)
    assert raised == [True, True] and state.restarts == 0
    assert world.daemon.state.deployment("chat").last_failure is None


def test_a_weights_download_shows_its_percentage_before_the_boot(
    tmp_path: Path, stopping: list[DeploymentWorker]
) -> None:
    """With a weights fetcher (issue 14's), the boot starts `downloading` with its percentage, then boots."""
    world = make_world(tmp_path)
    seen: list[tuple[str, int | None]] = []

    def fetch(name: str, dep: Any, progress: Callable[[int], None]) -> m.WeightsFailed | None:
        if not seen:  # the first try fails for a while (the Hub unreachable): retried, not counted
            seen.append(("failed once", None))
            return m.WeightsFailed("the Hub did not answer", permanent=False)
        for percent in (10, 60, 100):
            progress(percent)
            state = world.daemon.fleet.snapshot()[name].machine
            seen.append((state.phase.value, state.weights_percent))
        return None

    world.daemon.world = dataclasses.replace(world.daemon.world, fetch_weights=fetch)
    worker = world.worker()
    stopping.append(worker)
    wait_for(worker, ready)
    assert seen == [("failed once", None), ("downloading", 10), ("downloading", 60), ("downloading", 100)]
    assert world.daemon.state.deployment("chat").last_failure is None
