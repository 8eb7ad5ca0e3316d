"""The daemon's /metrics as a service: one `MetricsSnapshot` built from the fleet's `DeploymentView`s, the
telemetry and the observatory's cached readings (what `dankserve status` reads too), served on
`metrics_listen` behind `metrics_api_key_file` when set."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import structlog
from aiohttp import web

from dankserve.errors import EnvironmentUnusable
from dankserve.gateway.access import Access
from dankserve.gateway.console.routes import Console, Control, LogSource
from dankserve.gateway.usage import Counts, hide_key_names
from dankserve.logsources import LogFeed
from dankserve.secret_files import read_secret_file
from dankserve.settings import GatewaySettings, Settings, is_loopback, parse_listen
from dankserve.supervisor.observe.metrics import DeploymentFacts, MetricsServer, MetricsSnapshot
from dankserve.supervisor.observe.status import DeploymentView
from dankserve.supervisor.observe.telemetry import Telemetry
from dankserve.supervisor.probes.observatory import Observatory
from dankserve.supervisor.worker.fleet import Fleet
from dankserve.supervisor.world import World

log = structlog.get_logger("dankserve")


def deployment_facts(view: DeploymentView) -> DeploymentFacts:
    """The fields of a deployment's view that /metrics exports."""
    return DeploymentFacts(
        name=view.name,
        state=view.state,
        phase=view.phase,
        model=view.model,
        image=view.image or "",
        vllm_version=view.vllm_version,
        kv_cache_memory_bytes=view.kv_cache_memory_bytes,
        kv_cache_learned_used=view.kv_cache_learned_used,
        ready_seconds=view.uptime_seconds,
        swap_group=view.swap_group,
        sleep_level=view.sleep_level,
    )


def metrics_snapshot(
    fleet: Fleet,
    telemetry: Telemetry,
    observatory: Observatory,
    gateway: Callable[[], Mapping[tuple[str, str], Counts]] = dict,
) -> MetricsSnapshot:
    """What /metrics shows now: the same views, telemetry and readings status reads; the gateway's counters."""
    return MetricsSnapshot(
        deployments=tuple(deployment_facts(view) for view in fleet.views(with_hosts=False)),
        telemetry=telemetry.snapshot(),
        serving=observatory.samples(),
        scrape_ok=observatory.scrape_ok(),
        gpus=observatory.gpus(),
        gateway=gateway(),
    )


def _without_key_names(snapshot: Callable[[], MetricsSnapshot]) -> Callable[[], MetricsSnapshot]:
    """A /metrics without its key answers anyone who reaches it (every local user on loopback): the gateway's
    counters go out with all keys as one (`key="*"`); metrics_api_key_file shows them per key name."""

    def shown() -> MetricsSnapshot:
        taken = snapshot()
        return replace(taken, gateway=hide_key_names(taken.gateway))

    return shown


def log_feed(world: World) -> LogFeed:
    """The lines `dankserve logs` reads, for the console: each configured deployment's runtime now."""
    return LogFeed(
        world.settings.state_dir,
        lambda: {name: world.runtime_for(dep) for name, dep in world.settings.deployments.items()},
    )


def console_mount(control: Control, logs: LogSource) -> Callable[[web.Application], None]:
    """The web console for `metrics_listen` when no gateway runs: no gateway keys exist, so its rules are the
    keyless ones (pages and data for loopback peers only, no actions: those need a `console:admin` key)."""
    defaults = GatewaySettings()  # no keys_dir, no key file: keyless (its listen is not used: nothing listens)
    access = Access(defaults, None)
    return Console(access, control, logs=logs).mount


def start_metrics(
    settings: Settings,
    snapshot: Callable[[], MetricsSnapshot],
    console: Callable[[web.Application], None] | None = None,
) -> Callable[[], None]:
    """Serve /metrics on `metrics_listen` (nothing when unset), and `console` beside it; the function that
    stops it."""
    if settings.metrics_listen is None:
        return lambda: None
    address, port = parse_listen(settings.metrics_listen)
    key_file = settings.metrics_api_key_file
    key = None
    if key_file is not None:
        key = read_secret_file(
            key_file,
            "metrics_api_key_file",
            fix="write a long random key into it (e.g. `openssl rand -hex 32`), mode 0600, "
            "or leave metrics_api_key_file unset",
        )
    served = snapshot if key is not None else _without_key_names(snapshot)
    server = MetricsServer(address, port, served, key, mounts=[console] if console is not None else [])
    try:
        server.start()
    except OSError as exc:
        raise EnvironmentUnusable(
            f"cannot serve metrics on {settings.metrics_listen}: {exc.strerror or exc}",
            fix="choose a free address and port in metrics_listen, or leave it unset for no metrics endpoint",
        ) from None
    if not is_loopback(address) and key is None:
        log.warning("metrics_exposed", listen=settings.metrics_listen, hint="anyone reaching it reads the metrics")
    log.info("metrics_listening", listen=settings.metrics_listen)
    return server.close
