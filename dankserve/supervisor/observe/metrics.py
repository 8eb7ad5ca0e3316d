"""The daemon's /metrics: the supervisor's numbers in the Prometheus text format (prometheus-client).

`families(snapshot)` turns one `MetricsSnapshot` (what the daemon knows at that moment, read
from the same Telemetry and Observatory caches `dankserve status` reads) into metric families;
it does no I/O, so a scrape costs only the formatting. `MetricsServer` serves them on
`metrics_listen` (off when unset), behind `metrics_api_key_file` when set.

Exported (every deployment-level series carries `deployment`):

- `dankserve_deployment_state{state}`, `dankserve_deployment_phase{phase}`: 1 for the current one,
  0 for the others; `dankserve_deployment_info{model,image,vllm_version}` 1;
  `dankserve_deployment_ready_seconds` (time since ready, absent when not ready)
- `dankserve_boots_total{kind}`, `dankserve_boot_duration_seconds{kind}` (histogram), kinds
  cold / warm / learned_bytes / launcher / wake / restore
- `dankserve_restarts_total{cause}`, `dankserve_failures_total{cause}` (the failure policy's causes)
- `dankserve_kv_cache_memory_bytes`, `dankserve_kv_cache_learned_used` (0/1)
- `dankserve_compile_cache_hits_total`, `dankserve_compile_cache_misses_total`
- `dankserve_liveness_probes_total{result}`, `dankserve_preemption_warnings_total`
- `dankserve_slower_than_predicted_total{kind}`: boots (cold, warm) and wakes over twice their prediction
- `dankserve_swap_check_failures_total{check}`: sleeps NVML showed still holding memory (`sleep`),
  wakes whose canary answered other tokens (`wake`); each marks its level unsafe (issue 29)
- snapshots (issue 41): `dankserve_snapshot_captures_total{result}` (ok, failed),
  `dankserve_snapshot_restores_total{result}` (restored, fallback), `dankserve_snapshot_seconds_total{kind}`
  (capture_outage, restore)
- `dankserve_serving_scrape_ok` (0/1: the server's /metrics was read in the last round)
- gateway: `dankserve_gateway_requests_total{key,model,code}` and
  `dankserve_gateway_tokens_total{key,model,kind}` (prompt, completion): the key's name, never its
  value; `-` for no key (a 401, or a gateway without keys) and for no routed model
- `dankserve_gpu_memory_used_bytes{gpu,uuid}`, `dankserve_gpu_memory_total_bytes{gpu,uuid}`
- vLLM's own families (`serving.RELAYED`, e.g. `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc`, `vllm:num_preemptions_total`, `vllm:time_to_first_token_seconds`)
  relayed under their own names with a `deployment` label added.
- swap groups: `dankserve_sleep_state{swap_group}` (0 not asleep, 1 or 2 the level, 3 stopped to
  sleep, 4 suspended) and `dankserve_swap_seconds{direction}` (a histogram of sleep and wake times)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dankserve.aioserver import GuardedServer, Limits, bearer_matches, vouch
from dankserve.gateway.usage import Counts
from dankserve.host.gpu_memory import GpuMemory
from dankserve.supervisor.lifecycle import Phase
from dankserve.supervisor.observe.serving import RELAYED, ServingSample, with_deployment
from dankserve.supervisor.observe.telemetry import DeploymentTelemetry

STATES: tuple[str, ...] = (
    *("stopped", "starting", "ready", "restarting", "failed", "down", "disabled"),
    *("falling_asleep", "asleep", "waking", "snapshotting"),
)
PHASES: tuple[str, ...] = tuple(p.value for p in Phase)


@dataclass(frozen=True)
class DeploymentFacts:
    """A deployment's current state as the daemon holds it."""

    name: str
    state: str
    phase: str
    model: str
    image: str
    vllm_version: str | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_learned_used: bool = False
    ready_seconds: float | None = None
    swap_group: str | None = None
    sleep_level: str | None = None
    """Asleep at "1", "2" or "stop"; None when not asleep (swap groups)."""


@dataclass(frozen=True)
class MetricsSnapshot:
    deployments: tuple[DeploymentFacts, ...]
    telemetry: Mapping[str, DeploymentTelemetry] = field(default_factory=dict)
    serving: Mapping[str, ServingSample] = field(default_factory=dict)
    scrape_ok: Mapping[str, bool] = field(default_factory=dict)
    gpus: Mapping[str, GpuMemory] = field(default_factory=dict)
    gateway: Mapping[tuple[str, str], Counts] = field(default_factory=dict)
    """The gateway's counters per (key name, model name), all time (kept across restarts)."""


def families(snapshot: MetricsSnapshot) -> list[Metric]:
    """Every metric family of one snapshot."""
    out: list[Metric] = []
    out += _deployment_families(snapshot.deployments)
    out += _telemetry_families(snapshot.telemetry)
    out += _snapshot_families(snapshot.telemetry)
    out += _sleep_and_swap(snapshot.deployments, snapshot.telemetry)
    scrape = GaugeMetricFamily(
        "dankserve_serving_scrape_ok", "1 when the server's /metrics was read in the last round.", labels=["deployment"]
    )
    for name, ok in sorted(snapshot.scrape_ok.items()):
        scrape.add_metric([name], 1.0 if ok else 0.0)
    out.append(scrape)
    out += _gpu_families(snapshot.gpus)
    out += _gateway_families(snapshot.gateway)
    out += with_deployment((name, sample.families) for name, sample in sorted(snapshot.serving.items()))
    return out


def _deployment_families(deployments: Iterable[DeploymentFacts]) -> list[Metric]:
    labels = ["deployment"]
    state = GaugeMetricFamily(
        "dankserve_deployment_state", "1 for the deployment's current state.", labels=[*labels, "state"]
    )
    phase = GaugeMetricFamily(
        "dankserve_deployment_phase", "1 for the deployment's current phase.", labels=[*labels, "phase"]
    )
    info = GaugeMetricFamily(
        "dankserve_deployment_info",
        "The deployment's model, image and vLLM release.",
        labels=[*labels, "model", "image", "vllm_version"],
    )
    ready = GaugeMetricFamily(
        "dankserve_deployment_ready_seconds", "Seconds since the deployment became ready.", labels=labels
    )
    kv = GaugeMetricFamily(
        "dankserve_kv_cache_memory_bytes",
        "KV-cache bytes of the running boot (learned or as vLLM sized it).",
        labels=labels,
    )
    learned = GaugeMetricFamily(
        "dankserve_kv_cache_learned_used", "1 when the running boot reused the learned KV-cache size.", labels=labels
    )
    for dep in deployments:
        for value in STATES:
            state.add_metric([dep.name, value], 1.0 if dep.state == value else 0.0)
        for value in PHASES:
            phase.add_metric([dep.name, value], 1.0 if dep.phase == value else 0.0)
        info.add_metric([dep.name, dep.model, dep.image, dep.vllm_version or ""], 1.0)
        if dep.ready_seconds is not None:
            ready.add_metric([dep.name], dep.ready_seconds)
        if dep.kv_cache_memory_bytes is not None:
            kv.add_metric([dep.name], float(dep.kv_cache_memory_bytes))
        learned.add_metric([dep.name], 1.0 if dep.kv_cache_learned_used else 0.0)
    return [state, phase, info, ready, kv, learned]


def _telemetry_families(telemetry: Mapping[str, DeploymentTelemetry]) -> list[Metric]:
    boots = CounterMetricFamily(
        "dankserve_boots_total", "Boots that reached ready, by kind.", labels=["deployment", "kind"]
    )
    durations = HistogramMetricFamily(
        "dankserve_boot_duration_seconds",
        "Seconds from start to ready, by kind of boot.",
        labels=["deployment", "kind"],
    )
    restarts = CounterMetricFamily(
        "dankserve_restarts_total", "Restarts, by the failure that caused them.", labels=["deployment", "cause"]
    )
    failures = CounterMetricFamily(
        "dankserve_failures_total", "Failures (boot or serving), by cause.", labels=["deployment", "cause"]
    )
    hits = CounterMetricFamily(
        "dankserve_compile_cache_hits_total", "Boots with a torch.compile cache hit.", labels=["deployment"]
    )
    misses = CounterMetricFamily(
        "dankserve_compile_cache_misses_total", "Boots that compiled afresh.", labels=["deployment"]
    )
    probes = CounterMetricFamily(
        "dankserve_liveness_probes_total", "One-token liveness probes, by result.", labels=["deployment", "result"]
    )
    preemption_warnings = CounterMetricFamily(
        "dankserve_preemption_warnings_total", "Warnings about rising preemptions.", labels=["deployment"]
    )
    slower = CounterMetricFamily(
        "dankserve_slower_than_predicted_total",
        "Boots and wakes that took more than twice their predicted seconds, by kind (cold, warm, wake).",
        labels=["deployment", "kind"],
    )
    checks = CounterMetricFamily(
        "dankserve_swap_check_failures_total",
        "Sleeps still holding GPU memory (sleep) and wakes answering other tokens (wake); each marks its level unsafe.",
        labels=["deployment", "check"],
    )
    for name, t in sorted(telemetry.items()):
        for check, count in t.swap_checks_failed.items():
            checks.add_metric([name, check], float(count))
        for kind, count in t.boots.items():
            boots.add_metric([name, kind], float(count))
        for kind, count in t.slower_than_predicted.items():
            slower.add_metric([name, kind], float(count))
        for kind, histogram in t.boot_seconds.items():
            buckets = [
                (_le(bound), float(count)) for bound, count in zip(histogram.buckets, histogram.counts, strict=True)
            ]
            buckets.append(("+Inf", float(histogram.count)))
            durations.add_metric([name, kind], buckets, histogram.total)
        for cause, count in t.restarts.items():
            restarts.add_metric([name, cause], float(count))
        for cause, count in t.failures.items():
            failures.add_metric([name, cause], float(count))
        hits.add_metric([name], float(t.compile_cache_hits))
        misses.add_metric([name], float(t.compile_cache_misses))
        probes.add_metric([name, "ok"], float(t.probes_ok))
        probes.add_metric([name, "failed"], float(t.probes_failed))
        preemption_warnings.add_metric([name], float(t.preemption_warnings))
    return [boots, durations, restarts, failures, hits, misses, probes, preemption_warnings, slower, checks]


def _snapshot_families(telemetry: Mapping[str, DeploymentTelemetry]) -> list[Metric]:
    """Snapshots (issue 41): captures and restores by result, and their seconds."""
    captures = CounterMetricFamily(
        "dankserve_snapshot_captures_total",
        "Snapshot captures, by result (ok, failed).",
        labels=["deployment", "result"],
    )
    restores = CounterMetricFamily(
        "dankserve_snapshot_restores_total",
        "Snapshot restores, by result (restored; fallback: discarded, and the normal boot ran).",
        labels=["deployment", "result"],
    )
    seconds = CounterMetricFamily(
        "dankserve_snapshot_seconds_total",
        "Seconds of the captures' outages (capture_outage) and of the restores (restore).",
        labels=["deployment", "kind"],
    )
    for name, t in sorted(telemetry.items()):
        captures.add_metric([name, "ok"], float(t.snapshots.get("captured", 0)))
        captures.add_metric([name, "failed"], float(t.snapshots.get("capture_failed", 0)))
        restores.add_metric([name, "restored"], float(t.snapshots.get("restored", 0)))
        restores.add_metric([name, "fallback"], float(t.snapshots.get("restore_fallback", 0)))
        for kind, total in t.snapshot_seconds.items():
            seconds.add_metric([name, kind], total)
    return [captures, restores, seconds]


def _le(bound: float) -> str:
    return f"{float(bound)}"


SLEEP_STATES: Mapping[str, float] = {"1": 1.0, "2": 2.0, "stop": 3.0, "suspend": 4.0}
"""`dankserve_sleep_state`: 0 awake (or not asleep), 1 or 2 the sleep level, 3 stopped to sleep, 4 suspended
(level 1 and a GPU checkpoint: 0 bytes on the GPU)."""


def _sleep_and_swap(
    deployments: Iterable[DeploymentFacts], telemetry: Mapping[str, DeploymentTelemetry]
) -> list[Metric]:
    """Swap group members: the sleep state, and a histogram of sleep and wake times."""
    state = GaugeMetricFamily(
        "dankserve_sleep_state",
        "Swap group members: 0 not asleep, 1 or 2 asleep at that level, 3 stopped to sleep, 4 suspended.",
        labels=["deployment", "swap_group"],
    )
    seconds = HistogramMetricFamily(
        "dankserve_swap_seconds",
        "Swap group members: seconds a sleep or a wake took.",
        labels=["deployment", "direction"],
    )
    for dep in deployments:
        if dep.swap_group is None:
            continue
        state.add_metric([dep.name, dep.swap_group], SLEEP_STATES.get(dep.sleep_level or "", 0.0))
        observed = telemetry.get(dep.name)
        for direction, histogram in observed.swap_seconds.items() if observed is not None else ():
            buckets = [
                (_le(bound), float(count)) for bound, count in zip(histogram.buckets, histogram.counts, strict=True)
            ]
            buckets.append(("+Inf", float(histogram.count)))
            seconds.add_metric([dep.name, direction], buckets, histogram.total)
    return [state, seconds]


def _gpu_families(gpus: Mapping[str, GpuMemory]) -> list[Metric]:
    used = GaugeMetricFamily("dankserve_gpu_memory_used_bytes", "GPU memory in use (NVML).", labels=["gpu", "uuid"])
    total = GaugeMetricFamily("dankserve_gpu_memory_total_bytes", "GPU memory in all (NVML).", labels=["gpu", "uuid"])
    for reading in sorted(gpus.values(), key=lambda r: r.index):
        labels = [str(reading.index), reading.uuid]
        total.add_metric(labels, float(reading.total_bytes))
        if reading.used_bytes is not None:
            used.add_metric(labels, float(reading.used_bytes))
    return [used, total]


EXPORTED: frozenset[str] = frozenset(
    {
        "dankserve_deployment_state",
        "dankserve_deployment_phase",
        "dankserve_deployment_info",
        "dankserve_deployment_ready_seconds",
        "dankserve_kv_cache_memory_bytes",
        "dankserve_kv_cache_learned_used",
        "dankserve_boots_total",
        "dankserve_boot_duration_seconds_bucket",
        "dankserve_boot_duration_seconds_sum",
        "dankserve_boot_duration_seconds_count",
        "dankserve_restarts_total",
        "dankserve_failures_total",
        "dankserve_compile_cache_hits_total",
        "dankserve_compile_cache_misses_total",
        "dankserve_liveness_probes_total",
        "dankserve_preemption_warnings_total",
        "dankserve_slower_than_predicted_total",
        "dankserve_swap_check_failures_total",
        "dankserve_snapshot_captures_total",
        "dankserve_snapshot_restores_total",
        "dankserve_snapshot_seconds_total",
        "dankserve_serving_scrape_ok",
        "dankserve_gateway_requests_total",
        "dankserve_gateway_tokens_total",
        "dankserve_gpu_memory_used_bytes",
        "dankserve_gpu_memory_total_bytes",
        "dankserve_sleep_state",
        "dankserve_swap_seconds_bucket",
        "dankserve_swap_seconds_sum",
        "dankserve_swap_seconds_count",
    }
)
"""The sample names of dankserve's own series (the relayed vLLM ones are `serving.RELAYED`)."""


def _gateway_families(usage: Mapping[tuple[str, str], Counts]) -> list[Metric]:
    """Requests and tokens per key name (never the key) and model; `-`: no key, or no model routed."""
    requests = CounterMetricFamily(
        "dankserve_gateway_requests",
        "Requests the gateway answered, by key name, model and status code.",
        labels=["key", "model", "code"],
    )
    tokens = CounterMetricFamily(
        "dankserve_gateway_tokens",
        "Tokens of the gateway's answers, by key name, model and kind (prompt, completion).",
        labels=["key", "model", "kind"],
    )
    for (key, model), counts in sorted(usage.items()):
        for code, n in sorted(counts.requests.items()):
            requests.add_metric([key, model, str(code)], float(n))
        tokens.add_metric([key, model, "prompt"], float(counts.prompt_tokens))
        tokens.add_metric([key, model, "completion"], float(counts.completion_tokens))
    return [requests, tokens]


class SnapshotCollector(Collector):
    """A prometheus-client collector that asks for a fresh snapshot on every scrape."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from families(self._snapshot())


LIMITS = Limits(max_connections=64, header_timeout=10.0, body_timeout=10.0, max_body_bytes=64 * 1024)
"""A scraper needs one connection at a time; the header deadline is the gateway's (10 s). Beyond the
cap a connection is closed at once, so a flood of idle connections costs the daemon 64 descriptors."""


class MetricsServer:
    """/metrics over HTTP on `address`:`port`, on its own event loop (aioserver: a connection cap and
    a header deadline, so idle peers cannot take the daemon's descriptors).

    With `api_key`, a scrape must send `Authorization: Bearer KEY` (Prometheus' `authorization`
    or `bearer_token_file`); 401 otherwise.

    Always the classic text format (0.0.4): prometheus-client's OpenMetrics answer to a
    Prometheus that asks for it escapes the colons of vLLM's names (`vllm:num_requests_waiting`
    would arrive as `vllm_num_requests_waiting`), and vLLM's dashboards use the colon names.
    """

    def __init__(
        self,
        address: str,
        port: int,
        snapshot: Callable[[], MetricsSnapshot],
        api_key: str | None = None,
        mounts: Sequence[Callable[[web.Application], None]] = (),
    ) -> None:
        self._mounts = tuple(mounts)
        """Routes added ahead of /metrics' catch-all (the web console when no gateway runs)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(snapshot))
        self._server: GuardedServer | None = None
        self._address = address
        self._port = port
        self._api_key = api_key

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=LIMITS.max_body_bytes)
        for mount in self._mounts:
            mount(app)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.Response:
        if self._api_key is not None and not bearer_matches(request.headers.get("Authorization"), self._api_key):
            return web.Response(
                status=401,
                text="missing or wrong key: send Authorization: Bearer KEY (metrics_api_key_file)\n",
                headers={"WWW-Authenticate": "Bearer"},
            )
        vouch(request)
        if request.path not in ("/metrics", "/"):
            return web.Response(status=404, text="not found: dankserve serves /metrics\n")
        # The snapshot reads the daemon's state under its locks: off the event loop.
        body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    def start(self) -> None:
        """Listen; OSError when the address cannot be bound."""
        self._server = GuardedServer(
            self._app(), (self._address, self._port), LIMITS, name="metrics", handler_cancellation=bool(self._mounts)
        )
        self._server.start()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


__all__ = ["EXPORTED", "PHASES", "RELAYED", "STATES", "MetricsServer", "MetricsSnapshot", "families"]
