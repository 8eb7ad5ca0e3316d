"""One deployment's `dankserve status` document, built from its records. Pure.

The daemon builds it from the machine's state and the state file's record; `dankserve status`
without a daemon builds it from the record alone (`machine=None`) and what it finds running.
Both print the same fields with the same meanings: `state` is the machine's (`starting`,
`ready`, `restarting`, `failed`, `stopped`, `falling_asleep`, `asleep`, `waking`) while it
runs, else `down` (taken down with `dankserve down`), `disabled` (not enabled in the config),
`serving` or `running` (no daemon, but its server still runs: healthy, or not answering
/health) or `stopped`; values of the last boot come from this daemon's machine once it knows
them, else from the state file's last boot. `rests` says whether the deployment rests where it
is (`RESTING_STATES`): nothing moves until a request, a command or a config change; `why` says
in one line why it is where it is, or what it waits for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from dankserve.backend_address import BackendAddress, TcpAddress
from dankserve.backend_address import endpoint as server_endpoint
from dankserve.state import DeploymentState, FailureRecord, UnsafeSleep
from dankserve.supervisor.machine import MachineState, Stage
from dankserve.supervisor.observe.prediction import predict
from dankserve.supervisor.observe.telemetry import DeploymentTelemetry
from dankserve.supervisor.reloading import ConfigRefusal

if TYPE_CHECKING:  # the settings type only: importing pydantic-settings here would slow the CLI
    from dankserve.settings import DeploymentSettings

RESTING_STAGES = frozenset({Stage.READY, Stage.ASLEEP, Stage.FAILED})
"""The machine's stages a deployment rests in (IDLE and STOPPED are passing: a worker about to begin, or a
daemon stopping)."""
RESTING_STATES = frozenset({"ready", "asleep", "failed", "down", "disabled"})
"""The `state`s a deployment rests in: those of RESTING_STAGES, and, without a machine, down and disabled.
`dankserve up` waits until every deployment it follows rests."""

Unsupervised = Literal["serving", "asleep", "running"]
"""No daemon, but the deployment's server still runs: it answers /health (serving; asleep when a swap
group member's server says it sleeps) or not (running)."""


@dataclass(frozen=True)
class Metrics:
    """What the server's /metrics said (None: not asked or not answered)."""

    preemptions: int | None = None
    kv_cache_usage_perc: float | None = None


def failure_json(record: FailureRecord | None) -> dict[str, Any] | None:
    """A last-failure record as status shows it."""
    if record is None:
        return None
    return {"class": record.cause, "message": record.message, "at": record.at}


def configured_hosts(dep: DeploymentSettings) -> list[dict[str, Any]]:
    """A group's hosts as the config names them, before the daemon has looked at them (none: one host)."""
    if not dep.hosts:
        return []
    return [{"address": "this host", "role": "leader", "state": "unknown", "message": None}] + [
        {"address": address, "role": "follower", "state": "unknown", "message": None} for address in dep.hosts
    ]


@dataclass(frozen=True)
class DeploymentView:
    """One deployment as the daemon shows it, built once (`deployment_view`): `dankserve status` renders it
    (`to_json`, the document's keys in order) and /metrics reads its fields."""

    name: str
    state: str
    phase: str
    endpoint: str
    """Where clients send its requests: the gateway's URL for a server on its private socket."""
    listens: str
    """Where its server listens: `HOST:PORT`, or `unix:PATH` (only dankserve connects)."""
    model: str
    image: str | None
    """The container image; None for a process deployment (runtime = "process": no image runs)."""
    runtime: str
    vllm_version: str | None
    uptime_seconds: float | None
    boots: int
    restarts: int
    last_failure: dict[str, Any] | None
    kv_cache_memory_bytes: int | None
    kv_cache_learned_used: bool
    compile_cache_hit: bool | None
    weights_percent: int | None
    context_tokens: int | None
    kv_cache_tokens: int | None
    concurrency: float | None
    gpus: tuple[dict[str, Any], ...]
    gpu_memory_held_bytes: int | None
    """GPU memory its server's processes hold, on all its GPUs (NVML's process list; `ollama ps`' SIZE); None:
    not read (no server, no daemon, or no per-process reading here)."""
    kv_cache_usage_perc: float | None
    preemptions: int | None
    message: str | None
    hosts: tuple[dict[str, Any], ...]
    serving: dict[str, Any] | None
    observed: DeploymentTelemetry
    """This daemon's counts since it started (the numbers /metrics exports)."""
    swap: SwapView | None
    predicted: dict[str, Any]
    """Cold, warm and wake seconds predicted from the deployment's history (supervisor/observe/prediction.py)."""
    rests: bool
    why: str | None
    waiting_for: str | None
    phase_seconds: float | None
    kv_cache_source: str | None
    upgrade: dict[str, Any] | None = None
    """The last `dankserve upgrade` or `rollback` as state.json records it (supervisor/upgrade/)."""
    launcher: dict[str, Any] | None = None
    """Whether its boots go through the launcher, and why (`launcher = "auto"`: dankserve/launcher_choice.py)."""
    snapshot: dict[str, Any] | None = None
    """Its snapshot (issue 41): ready, absent, off or capturing, why, the last capture's outage and
    restore's seconds, the last failure."""

    @property
    def swap_group(self) -> str | None:
        return self.swap.group if self.swap else None

    @property
    def sleep_level(self) -> str | None:
        return self.swap.level if self.swap else None

    def to_json(self) -> dict[str, Any]:
        """The `status --json` document of the deployment."""
        doc: dict[str, Any] = {}
        for name in _DOCUMENT_FIELDS:
            if name == "observed":
                doc.update(self.observed.status_json())
            elif name == "swap":
                doc[name] = self.swap.to_json() if self.swap is not None else None
            else:
                value = getattr(self, name)
                doc[name] = list(value) if isinstance(value, tuple) else value
        return doc


_DOCUMENT_FIELDS = tuple(f.name for f in fields(DeploymentView))


def deployment_view(
    name: str,
    dep: DeploymentSettings,
    record: DeploymentState,
    machine: MachineState | None,
    *,
    down: bool,
    now: float = 0.0,
    gpus: Sequence[Mapping[str, Any]] = (),
    metrics: Metrics | None = None,
    hosts: Sequence[Mapping[str, Any]] | None = None,
    serving: Mapping[str, Any] | None = None,
    observed: DeploymentTelemetry | None = None,
    waiting_for: str | None = None,
    phase_since: float | None = None,
    wall_now: float | None = None,
    unsupervised: Unsupervised | None = None,
    address: BackendAddress | None = None,
    endpoint: str | None = None,
    held_bytes: int | None = None,
    idle_sleep_in: float | None = None,
) -> DeploymentView:
    """One deployment as status shows it (`to_json`: its document) and /metrics reads it; `now` is the
    machine's clock (for the uptime).

    `serving` is vLLM's load as last read from its /metrics, `observed` this daemon's counts since
    it started (the numbers /metrics exports; none without a daemon). `waiting_for` is what the
    boot waits for (the worker's words), `phase_since` when (machine clock) the phase began,
    `wall_now` the Unix time (an adopted server's uptime counts from when it first turned ready),
    `unsupervised` what runs of it while no daemon does, `held_bytes` the GPU memory its server's processes
    hold, `idle_sleep_in` the seconds until a swap group member sleeps for want of requests, `address` where its
    server listens (None: the deployment's host and port), `endpoint` where clients reach it (None: that
    address)."""
    listens = address if address is not None else TcpAddress(dep.host, dep.port)
    last = record.last_boot
    learned = sorted(record.learned_kv.values(), key=lambda e: e.learned_at)
    state: str
    if machine is None:
        state = "down" if down else ("disabled" if not dep.enabled else (unsupervised or "stopped"))
        phase = "stopped"
    else:
        state, phase = machine.status, machine.phase.value
    booted = machine is not None and machine.kv_cache_memory_bytes is not None
    facts = machine.facts if machine is not None else None
    boot = machine.boot if machine is not None else None
    uptime = None
    # An adopted server (or one no daemon supervises) has served since its boot first turned ready.
    served_since = last.at if last is not None and last.ready and wall_now else None
    if machine is not None and machine.stage is Stage.READY and boot is not None and boot.ready_at:
        adopted = boot.adopted and wall_now and served_since
        uptime = (
            round(wall_now - served_since, 1)
            if adopted and wall_now and served_since
            else round(now - boot.ready_at, 1)
        )
    elif state == "serving" and wall_now and served_since:
        uptime = round(wall_now - served_since, 1)
    kv_bytes = (
        machine.kv_cache_memory_bytes
        if booted and machine is not None
        else (last.kv_cache_memory_bytes if last and last.kv_cache_memory_bytes else None)
        or (learned[-1].kv_cache_memory_bytes if learned else None)
    )
    metrics = metrics or Metrics()
    # An adopted server's boot was seen by the daemon before: where its KV size came from and how long it
    # took are that daemon's record (this one saw no boot).
    seen_before = machine is None or (boot is not None and boot.adopted)
    learned_used = (
        bool(last and last.kv_cache_learned_used)
        if seen_before and last is not None
        else bool(machine is not None and machine.kv_cache_learned_used)
    )
    observed = observed or DeploymentTelemetry()
    if observed.last_boot is None and last is not None and last.seconds is not None:
        observed = replace(observed, last_boot={"kind": last.kind, "seconds": last.seconds})
    rests = machine.stage in RESTING_STAGES if machine is not None else state in RESTING_STATES
    return DeploymentView(
        name=name,
        state=state,
        phase=phase,
        endpoint=endpoint if endpoint is not None else server_endpoint(listens),
        listens=str(listens),
        model=dep.model,
        image=None if dep.runtime == "process" else dep.image,
        upgrade=None if record.upgrade is None else record.upgrade.to_json(),
        runtime=dep.runtime,
        vllm_version=(machine.vllm_version if machine is not None else None) or (last.vllm_version if last else None),
        uptime_seconds=uptime,
        boots=max(machine.boots if machine else 0, record.boots),
        restarts=max(machine.restarts if machine else 0, record.restarts),
        last_failure=failure_json(record.last_failure),
        kv_cache_memory_bytes=kv_bytes,
        kv_cache_learned_used=learned_used,
        compile_cache_hit=machine.compile_cache_hit
        if machine is not None and machine.compile_cache_hit is not None
        else (last.compile_cache_hit if last else None),
        weights_percent=machine.weights_percent if machine is not None else None,
        # what this boot's KV cache holds, in vLLM's own words (its log): the context each request
        # may use, the tokens in all, and how many requests of full length fit at once
        context_tokens=facts.max_model_len if facts else None,
        kv_cache_tokens=facts.gpu_kv_cache_tokens if facts else None,
        concurrency=facts.max_concurrency if facts else None,
        gpus=tuple(dict(g) for g in gpus),
        gpu_memory_held_bytes=held_bytes,
        kv_cache_usage_perc=metrics.kv_cache_usage_perc
        if metrics.kv_cache_usage_perc is not None
        else (facts.kv_cache_usage_perc if facts else None),
        preemptions=metrics.preemptions if metrics.preemptions is not None else (facts.preemptions if facts else None),
        message=machine.message if machine is not None else None,
        hosts=tuple(dict(h) for h in hosts) if hosts is not None else tuple(configured_hosts(dep)),
        serving=dict(serving) if serving is not None else None,
        observed=observed,
        swap=swap_view(dep, machine, record.unsafe_sleep, idle_sleep_in),
        predicted=predict(record.timings).to_json(),
        rests=rests,
        why=why(name, dep=dep, state=state, machine=machine, waiting_for=waiting_for, last_failure=record.last_failure),
        waiting_for=waiting_for,
        phase_seconds=round(now - phase_since, 1) if phase_since is not None else None,
        kv_cache_source=("learned" if learned_used else "profiled") if kv_bytes is not None else None,
        launcher=dict(zip(("used", "why"), launcher_view(dep, machine), strict=True)),
        snapshot=snapshot_view(dep, machine),
    )


def launcher_view(dep: DeploymentSettings, machine: MachineState | None) -> tuple[bool, str]:
    """Whether its boots go through the launcher, and why: by the image's entrypoint the daemon read (Podman)."""
    return dep.with_image_entrypoint(machine.image_entrypoint if machine is not None else None).launcher_choice()


def snapshot_view(dep: DeploymentSettings, machine: MachineState | None) -> dict[str, Any]:
    """The `snapshot` entry of status: what planning last found, or `capturing` while it captures."""
    times = machine.snapshot if machine is not None else None
    plan = times.plan if times is not None else None
    if dep.snapshot == "off":
        state, reason = "off", 'snapshot = "off"'
    elif machine is not None and machine.stage is Stage.SNAPSHOTTING:
        state, reason = "capturing", "the ready server is captured: its requests wait"
    elif plan is not None:
        state, reason = plan.state, plan.reason
    else:
        state, reason = "unknown", "not planned yet (no daemon, or before its first boot)"
    return {
        "state": state,
        "reason": reason,
        "last_capture_outage_seconds": times.last_capture_outage_seconds if times is not None else None,
        "last_restore_seconds": times.last_restore_seconds if times is not None else None,
        "last_failure": times.last_failure if times is not None else None,
    }


def why(
    name: str,
    *,
    dep: DeploymentSettings,
    state: str,
    machine: MachineState | None,
    waiting_for: str | None,
    last_failure: FailureRecord | None,
) -> str | None:
    """One line: why the deployment is where it is, or what it waits for (None: nothing to say)."""
    message = machine.message if machine is not None else None
    if waiting_for:
        return f"waits: {waiting_for}"
    if state == "down":
        return f"taken down with `dankserve down`; `dankserve up {name}` starts it"
    if state == "disabled":
        return "enabled = false in the config"
    if machine is None and state in ("serving", "asleep", "running"):
        answers = {"serving": "", "asleep": " (its server sleeps)", "running": " (/health does not answer)"}[state]
        return f"unsupervised: no daemon runs{answers}; `dankserve up` adopts it"
    if state == "asleep" and dep.swap_group is not None:
        level = machine.swap.level if machine is not None else None
        how = {"stop": "stopped", "suspend": "suspended: level 1 and a GPU checkpoint, 0 bytes on the GPU"}.get(
            level or "", f"level {level}"
        )
        failed = machine.swap.suspend_failure if machine is not None else None
        if failed is not None:
            how += f"; its suspend failed: {failed}"
        return f"swap group {dep.swap_group}, asleep ({how}): its next request wakes it"
    if state == "restarting" and not message and last_failure is not None:
        return f"after {last_failure.cause}: {last_failure.message or 'see `dankserve logs`'}"
    return message


@dataclass(frozen=True)
class SwapView:
    """A swap group member's group, sleep level and last swap's timings (the `swap` entry of status)."""

    group: str
    pinned: bool
    idle_sleep_seconds: float | None
    level: str | None
    """Asleep at "1", "2", "stop" or "suspend"; None when not asleep."""
    last_level: str | None
    last_sleep_seconds: float | None
    last_wake_seconds: float | None
    unsafe_levels: tuple[dict[str, Any], ...] = ()
    """Levels marked unsafe for this vLLM version and model (state.json's unsafe_sleep; swap_checks)."""
    suspend_failure: str | None = None
    """Why its last suspend slept at plain level 1 instead (issue 41 item 7), None when it did not fail."""
    idle_sleep_in_seconds: float | None = None
    """Seconds until it sleeps for want of requests (idle_sleep_seconds counting down; `ollama ps`' UNTIL);
    None while it does not count down (asleep, pinned, serving, no idle_sleep_seconds, no daemon)."""

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: list(value) if isinstance(value := getattr(self, f.name), tuple) else value for f in fields(self)
        }


def swap_view(
    dep: DeploymentSettings,
    machine: MachineState | None,
    unsafe: Sequence[UnsafeSleep] = (),
    idle_sleep_in: float | None = None,
) -> SwapView | None:
    """The member's `SwapView` (None outside a group), with the levels marked unsafe and its idle countdown."""
    if dep.swap_group is None:
        return None
    times = machine.swap if machine is not None else None
    return SwapView(
        group=dep.swap_group,
        pinned=dep.pinned,
        idle_sleep_seconds=dep.idle_sleep_seconds,
        level=times.level if times is not None and machine is not None and machine.stage is Stage.ASLEEP else None,
        last_level=times.last_level if times is not None else None,
        last_sleep_seconds=times.last_sleep_seconds if times is not None else None,
        last_wake_seconds=times.last_wake_seconds if times is not None else None,
        unsafe_levels=tuple(
            {"level": u.level, "vllm_version": u.vllm_version, "model": u.model, "reason": u.reason, "at": u.at}
            for u in unsafe
        ),
        suspend_failure=times.suspend_failure if times is not None else None,
        idle_sleep_in_seconds=None if idle_sleep_in is None else round(idle_sleep_in, 1),
    )


def config_status(
    path: str | None, loaded_at: float, refusal: ConfigRefusal | None, needs_restart: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The daemon's `config` entry: its file, when the running config was loaded (start or the last accepted
    reload), the last reload's refusal (None once a reload is accepted), and the global keys the file changed
    that keep their running values until the daemon restarts."""
    return {
        "path": path,
        "loaded_at": loaded_at,
        "refused": refusal.to_json() if refusal is not None else None,
        "needs_restart": list(needs_restart),
    }
