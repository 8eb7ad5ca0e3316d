"""`dankserve status [NAME] [--json]`: the daemon and each deployment, whether or not the daemon runs.

Without NAME one row per deployment (state, model, port, uptime, boots, the last boot's seconds,
where its KV-cache size came from, and why it is where it is); `status NAME` the details of one.
Without a daemon the runtime is asked what still runs (and /health whether it answers), so a
daemon killed with -9 reads "daemon not running; N servers still serving", not "stopped".
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.cli.reload import restart_line
from dankserve.cli.render import (
    colour_enabled,
    format_bytes,
    format_duration,
    paint,
    print_json,
    table,
    terminal_width,
)
from dankserve.errors import ConfigError, DankserveError, InvalidInput
from dankserve.exitcodes import ExitCode
from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor.observe.status import Unsupervised


def offline_status(settings: Settings) -> dict[str, Any]:
    """What status can say from the config, the state store and the runtime while no daemon runs."""
    from dankserve.planning import backend_address, client_endpoint
    from dankserve.supervisor.observe.status import deployment_view
    from dankserve.supervisor.records import StateBook

    store = StateBook(settings.state_dir, persist=False)
    deployments = []
    for name, configured in sorted(settings.deployments.items()):
        dep = store.as_run(name, configured)  # the image an upgrade switched it to (state.json keeps it)
        down = store.is_down(name)
        running = _still_running(settings, name, dep) if dep.enabled and not down else None
        deployments.append(
            deployment_view(
                name,
                dep,
                store.deployment(name),
                None,
                down=down,
                unsupervised=running,
                wall_now=time.time(),
                address=backend_address(settings, name, dep),
                endpoint=client_endpoint(settings, name, dep),
            ).to_json()
        )
    serving = sum(1 for d in deployments if d["state"] == "serving")
    asleep = sum(1 for d in deployments if d["state"] == "asleep")
    return {
        "daemon": {"running": False, "pid": None, "servers_still_serving": serving, "servers_still_asleep": asleep},
        "deployments": deployments,
        "warnings": list(store.load_warnings),
    }


def _still_running(settings: Settings, name: str, dep: DeploymentSettings) -> Unsupervised | None:
    """The deployment's server as it runs without a daemon: answering /health, running, or None (not found)."""
    from dankserve.planning import backend_address
    from dankserve.supervisor.assembly import runtime_factory
    from dankserve.supervisor.probes.health import check_health

    try:
        workload = runtime_factory(settings)(dep).find(name)
    except DankserveError:  # the runtime cannot be asked (Podman down): nothing is known to run
        return None
    if workload is None or not workload.running:
        return None
    address = backend_address(settings, name, dep)
    if not check_health(address, timeout=1.0).healthy:
        return "running"
    if dep.swap_group is not None:  # a member left asleep answers /health too: ask it
        from dankserve.secret_files import read_key_now
        from dankserve.supervisor.probes.sleep_mode import is_sleeping

        if is_sleeping(address, read_key_now(dep.api_key_file), timeout=1.0):
            return "asleep"
    return "serving"


def current_status(settings: Settings) -> dict[str, Any]:
    """The daemon's own answer when it runs, else the offline view."""
    from dankserve import servicectl

    reply = servicectl.daemon_request(settings.state_dir, {"command": "status"}, timeout=5)
    if reply and reply.get("ok"):
        status: dict[str, Any] = reply["status"]
        return status
    return offline_status(settings)


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def note_disk_config(
    doc: dict[str, Any], refusal: ConfigError | None, now: float, pending: tuple[str, ...] = ()
) -> None:
    """Record in the daemon's `config` entry what this command found in the file on disk (`on_disk`): valid or
    why not, and (`pending`) what a valid file changed that `dankserve reload` would apply."""
    config = doc["daemon"].get("config")
    if config is None:  # no daemon answered: nothing runs a config
        return
    config["on_disk"] = (
        {"valid": True, "pending": list(pending)}
        if refusal is None
        else {"valid": False, "checked_at": now, "error": refusal.message, "fix": refusal.fix}
    )


def pending_line(pending: list[str]) -> str:
    """The line saying the file on disk differs from the running config (`status`, `plan`)."""
    shown = ", ".join(pending[:6]) + (f" and {len(pending) - 6} more" if len(pending) > 6 else "")
    return f"the config on disk differs from the running one ({shown}): `dankserve reload` applies it"


def disk_changes(settings: Settings) -> tuple[str, ...]:
    """What the file's settings change against those of the daemon running at their state dir (none without
    one): a reload's pending changes."""
    from dankserve import servicectl
    from dankserve.settings import pending_changes

    running = servicectl.running_settings(settings.state_dir)
    return () if running is None else pending_changes(running, settings)


def config_lines(daemon: dict[str, Any]) -> list[str]:
    """The lines saying that the config on disk was refused while the daemon runs the one it loaded before."""
    config = daemon.get("config") or {}
    disk = config.get("on_disk") or {}
    refused = config.get("refused") or (None if disk.get("valid", True) else {**disk, "at": disk["checked_at"]})
    waiting = [restart_line(config["needs_restart"])] if config.get("needs_restart") else []
    if refused is None:
        return ([pending_line(disk["pending"])] if disk.get("pending") else []) + waiting
    error = " ".join(part.strip() for part in str(refused["error"]).splitlines())
    lines = [
        f"the config on disk was refused at {_clock(refused['at'])}: {error}; "
        f"running the config loaded at {_clock(config['loaded_at'])}"
    ]
    if disk.get("valid"):  # its keys only: the daemon's refusal may be its plan's (an adapter, the fit)
        line = "  the file's keys are valid now: `dankserve reload` applies it, unless what it plans is refused again"
        lines.append(line + (f" (fix: {refused['fix']})" if refused.get("fix") else ""))
    elif refused.get("fix"):
        lines.append(f"  fix: {refused['fix']}, then `dankserve reload`")
    return [*lines, *waiting]


def swap_line(swap: dict[str, Any]) -> str:
    """A swap group member's line: its group, how it sleeps, the last swap's timings."""
    parts = [f"swap group {swap['group']}" + (" (pinned)" if swap.get("pinned") else "")]
    if swap.get("level"):
        words = {"stop": "asleep (stopped)", "suspend": "asleep, suspended (0 bytes on the GPU)"}
        parts.append(words.get(swap["level"], f"asleep at level {swap['level']}"))
    if swap.get("suspend_failure"):
        parts.append(f"last suspend failed (slept at level 1): {swap['suspend_failure']}")
    if swap.get("idle_sleep_seconds"):
        countdown = swap.get("idle_sleep_in_seconds")
        left = f": sleeps in {format_duration(countdown)} without a request" if countdown is not None else ""
        parts.append(f"sleeps after {swap['idle_sleep_seconds']:g} s idle{left}")
    timings = []
    if swap.get("last_sleep_seconds") is not None:
        timings.append(f"sleep {swap['last_sleep_seconds']:.2f} s")
    if swap.get("last_wake_seconds") is not None:
        timings.append(f"wake {swap['last_wake_seconds']:.2f} s")
    if timings:
        parts.append(f"last swap (level {swap.get('last_level') or '?'}): " + ", ".join(timings))
    unsafe = sorted({str(u.get("level")) for u in swap.get("unsafe_levels") or () if isinstance(u, dict)})
    if unsafe:
        parts.append(f"level {', '.join(unsafe)} unsafe here (failed its check): sleeps the next safe way")
    return "; ".join(parts)


def predicted_line(predicted: Mapping[str, Any]) -> str | None:
    """The predicted cold boot, warm boot and wake seconds (from its history), or None without any."""
    parts = [
        f"{kind} {predicted[f'{kind}_seconds']:.2f} s"
        for kind in ("cold", "warm", "wake", "restore")
        if predicted.get(f"{kind}_seconds") is not None
    ]
    return "predicted: " + ", ".join(parts) if parts else None


def _warnings(doc: dict[str, Any], now: float, recent_seconds: float) -> list[str]:
    out = []
    for dep in doc["deployments"]:
        warning = dep.get("preemption_warning")
        if warning and now - float(warning["at"]) <= recent_seconds:
            at = time.strftime("%H:%M:%S", time.localtime(float(warning["at"])))
            out.append(f"{dep['name']}: {warning['message']} (at {at})")
        if dep["state"] == "failed" and dep.get("message"):
            out.append(f"{dep['name']}: failed: {dep['message']}")
    return out


def shown_state(dep: Mapping[str, Any]) -> str:
    """The state in one word or two: a boot's phase (and weights percent) while starting, else the state."""
    state, phase = str(dep["state"]), str(dep["phase"])
    if state in ("starting", "waking") and phase not in (state, "ready", "stopped"):
        percent = dep.get("weights_percent")
        return f"{phase} {percent}%" if percent is not None and phase in ("downloading", "loading") else phase
    return state


def daemon_line(doc: dict[str, Any]) -> str:
    """The first line: whether the daemon runs, and what still serves when it does not."""
    daemon = doc["daemon"]
    if daemon["running"]:
        return f"daemon: running (pid {daemon['pid']})"
    serving = daemon.get("servers_still_serving") or 0
    asleep = daemon.get("servers_still_asleep") or 0
    if serving or asleep:
        servers = "1 server" if serving == 1 else f"{serving} servers"
        sleeping = f", {asleep} asleep" if asleep else ""
        return f"daemon not running; {servers} still serving{sleeping} (unsupervised: `dankserve up` adopts them)"
    return "daemon not running"


def _kv(dep: dict[str, Any]) -> str:
    value = dep.get("kv_cache_memory_bytes")
    if value is None:
        return "-"
    return f"{value / 2**30:.1f}G {dep.get('kv_cache_source') or ''}".rstrip()


def _port(dep: dict[str, Any]) -> str:
    if str(dep.get("listens", "")).startswith("unix:"):
        return "socket"  # only dankserve reaches it: clients come through the gateway
    return str(urlsplit(dep["endpoint"]).port or "-")


def _last_boot_seconds(dep: dict[str, Any]) -> str:
    last = dep.get("last_boot") or {}
    return f"{last['seconds']:.1f}" if last.get("seconds") is not None else "-"


def _held(dep: dict[str, Any]) -> str:
    held = dep.get("gpu_memory_held_bytes")
    return "-" if held is None else f"{held / 2**30:.1f}G"


def _sleeps_in(dep: dict[str, Any]) -> str:
    countdown = (dep.get("swap") or {}).get("idle_sleep_in_seconds")
    return "-" if countdown is None else format_duration(countdown)


HEADER = ("NAME", "STATE", "MODEL", "PORT", "GPU MEM", "UPTIME", "BOOTS", "BOOT s", "KV", "SLEEPS IN", "WHY")
NARROW_DROPS = ("BOOTS", "BOOT s", "PORT", "KV", "UPTIME")
"""The columns a narrow terminal goes without, first to last, once WHY went under each row (`status NAME`
shows them all)."""


def table_lines(doc: dict[str, Any], *, colour: bool, width: int | None) -> list[str]:
    """One row per deployment under HEADER (SLEEPS IN only where a deployment sleeps when idle); where WHY
    does not fit beside the rows it goes under each."""
    idle = any((dep.get("swap") or {}).get("idle_sleep_seconds") for dep in doc["deployments"])
    columns = [i for i, name in enumerate(HEADER) if idle or name != "SLEEPS IN"]
    rows = []
    for dep in doc["deployments"]:
        cells = (
            dep["name"],
            shown_state(dep),
            dep["model"],
            _port(dep),
            _held(dep),
            format_duration(dep.get("uptime_seconds")),
            str(dep["boots"]),
            _last_boot_seconds(dep),
            _kv(dep),
            _sleeps_in(dep),
            dep.get("why") or "",
        )
        rows.append(([cells[i] for i in columns], str(dep["state"])))
    header = [HEADER[i] for i in columns]
    return table(header, rows, colour=colour, width=width, drop_order=NARROW_DROPS, last_label="why: ", shrink="MODEL")


def gateway_status(settings: Settings) -> dict[str, Any] | None:
    """The gateway's address and whether it accepts connections now (None: no [gateway] configured)."""
    import socket

    from dankserve.settings import split_listen

    if settings.gateway is None:
        return None
    host, port = split_listen(settings.gateway.listen)
    reach = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # a wildcard: ask loopback
    try:
        with socket.create_connection((reach, port), timeout=1.0):
            up = True
    except OSError:
        up = False
    shown = f"[{host}]" if ":" in host else host
    return {"listen": settings.gateway.listen, "url": f"http://{shown}:{port}/v1", "up": up}


def gateway_line(gateway: dict[str, Any], daemon_running: bool) -> str:
    """The gateway's line: its address, up or down (or held by another program while no daemon runs)."""
    if gateway["up"] and not daemon_running:
        return (
            f"gateway: {gateway['listen']} accepts connections but no dankserve daemon runs: another program holds "
            "the address (`dankserve up` could not listen there)"
        )
    if gateway["up"]:
        return f"gateway: up at {gateway['url']}"
    return f"gateway: down: nothing accepts connections on {gateway['listen']} (`dankserve up` starts it)"


def _observed(dep: dict[str, Any]) -> list[str]:
    """The lines of what the daemon counted and read (the numbers /metrics shows)."""
    lines = []
    last = dep.get("last_boot")
    if last:
        took = f" in {last['seconds']:.1f}s" if last.get("seconds") is not None else ""
        kinds = ", ".join(f"{k} {v}" for k, v in (dep.get("boots_by_kind") or {}).items())
        lines.append(f"last boot {last['kind']}{took}  (since the daemon started: {kinds})")
    causes = dep.get("restarts_by_cause") or {}
    if causes:
        lines.append("restarts by cause: " + ", ".join(f"{k} {v}" for k, v in causes.items()))
    serving = dep.get("serving")
    if serving:
        usage = serving.get("kv_cache_usage_perc")
        shown = "?" if usage is None else f"{usage * 100:.0f}%"
        lines.append(
            f"serving: {serving.get('requests_running')} running, {serving.get('requests_waiting')} waiting, "
            f"KV cache {shown} used, {serving.get('preemptions')} preemptions, "
            f"{serving.get('generation_tokens')} tokens generated"
        )
    liveness = dep.get("liveness")
    if liveness and not liveness.get("last_probe_ok"):
        lines.append(f"token probe failed ({liveness.get('last_probe_error')})")
    return lines


def snapshot_line(snapshot: dict[str, Any]) -> str:
    """The snapshot's state and why (issue 41), with the last capture's outage and restore's seconds."""
    parts = [f"snapshot {snapshot.get('state')}: {snapshot.get('reason')}"]
    if snapshot.get("last_capture_outage_seconds") is not None:
        parts.append(f"capture outage {snapshot['last_capture_outage_seconds']:.2f} s")
    if snapshot.get("last_restore_seconds") is not None:
        parts.append(f"last restore {snapshot['last_restore_seconds']:.2f} s")
    if snapshot.get("last_failure"):
        parts.append(f"last failure: {snapshot['last_failure']}")
    return "; ".join(parts)


def detail_lines(dep: dict[str, Any], *, colour: bool) -> list[str]:
    """Everything status knows of one deployment (`status NAME`); unknown values are left out."""
    uptime = f", up {format_duration(dep['uptime_seconds'])}" if dep.get("uptime_seconds") is not None else ""
    state = paint(shown_state(dep), str(dep["state"]), colour)
    lines = [f"{dep['name']}: {state}{uptime}  {dep['endpoint']}"]
    if dep.get("why"):
        lines.append(f"  why: {dep['why']}")
    model = [f"model {dep['model']}"]
    if dep.get("runtime") == "process":
        model.append("a process (runtime = process)")
    elif dep.get("image"):
        model.append(f"image {dep['image']}")
    if dep.get("vllm_version"):
        model.append(f"vLLM {dep['vllm_version']}")
    lines.append("  " + "  ".join(model))
    counts = [f"boots {dep['boots']}", f"restarts {dep['restarts']}"]
    if dep.get("kv_cache_memory_bytes") is not None:
        counts.append(f"KV cache {format_bytes(dep['kv_cache_memory_bytes'])} ({dep.get('kv_cache_source')})")
    hit = dep.get("compile_cache_hit")
    if hit is not None:
        counts.append("compile cache hit" if hit else "compile cache miss")
    lines.append("  " + "  ".join(counts))
    lines += [f"  {line}" for line in _observed(dep)]
    if dep.get("context_tokens"):
        holds = ""
        if dep.get("kv_cache_tokens") and dep.get("concurrency"):
            holds = (
                f"; the KV cache holds {dep['kv_cache_tokens']:,} tokens: {dep['concurrency']:.1f} "
                "requests of full length at once"
            )
        lines.append(f"  context {dep['context_tokens']:,} tokens{holds}")
    for member in dep.get("hosts") or []:  # a multi-host group: every host, the leader first
        note = f"  {member['message']}" if member.get("message") else ""
        lines.append(f"  host {member['address']} ({member['role']}): {member['state']}{note}")
    if dep.get("swap"):
        lines.append(f"  {swap_line(dep['swap'])}")
    if dep.get("snapshot"):
        lines.append(f"  {snapshot_line(dep['snapshot'])}")
    if dep.get("launcher"):
        lines.append(f"  launcher {'used' if dep['launcher']['used'] else 'not used'}: {dep['launcher']['why']}")
    predicted = predicted_line(dep.get("predicted") or {})
    if predicted:
        lines.append(f"  {predicted}")
    if dep.get("gpu_memory_held_bytes") is not None:
        lines.append(f"  GPU memory held by its server: {format_bytes(dep['gpu_memory_held_bytes'])}")
    for gpu in dep.get("gpus") or []:
        lines.append(
            f"  GPU {gpu['index']}: {format_bytes(gpu['memory_used_bytes'])} used of "
            f"{format_bytes(gpu['memory_total_bytes'])}"
        )
    if dep.get("last_failure"):
        lines.append(f"  last failure: {dep['last_failure'].get('class')}: {dep['last_failure'].get('message')}")
    return lines


def status_document(name: str | None) -> dict[str, Any]:
    """The `status [NAME] --json` document: the daemon, the gateway, the deployments (only NAME's with a NAME)
    and the warnings; `sleep`/`wake --json` print the same one for their deployment."""
    reached = cli_context().daemon_settings()
    settings = reached.settings
    if name is not None and name not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {name!r}", fix=f"configured deployments: {known}")
    doc = current_status(settings)
    doc["gateway"] = gateway_status(settings)
    pending = disk_changes(settings) if reached.refusal is None and doc["daemon"].get("config") else ()
    note_disk_config(doc, reached.refusal, time.time(), pending)
    doc["warnings"] = [
        *doc.get("warnings", []),
        *_warnings(doc, time.time(), settings.preemption_warning_interval_seconds),
    ]
    if name is not None:
        doc["deployments"] = [d for d in doc["deployments"] if d["name"] == name]
        if "swaps" in doc:  # a running daemon's recent swaps: NAME's only
            doc["swaps"] = [s for s in doc["swaps"] if s.get("deployment") == name]
        others = set(settings.deployments) - {name}
        doc["warnings"] = [w for w in doc["warnings"] if w.split(":", 1)[0] not in others]
    return doc


@click.command("status")
@click.argument("name", required=False, shell_complete=complete_deployment)
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
def command(name: str | None, as_json: bool) -> ExitCode:
    """Show the daemon and one row per deployment; with NAME, everything about that deployment."""
    doc = status_document(name)
    if as_json:
        print_json(doc)
        return ExitCode.OK
    shown = {f"{d['name']}: failed: {d['why']}" for d in doc["deployments"] if d["state"] == "failed"}
    colour = colour_enabled()
    click.echo(daemon_line(doc))
    if doc["gateway"] is not None:
        click.echo(gateway_line(doc["gateway"], bool(doc["daemon"]["running"])))
    for line in config_lines(doc["daemon"]):
        click.echo(line)
    if name is not None:
        for line in detail_lines(doc["deployments"][0], colour=colour):
            click.echo(line)
    elif doc["deployments"]:
        for line in table_lines(doc, colour=colour, width=terminal_width()):
            click.echo(line)
    for warning in doc["warnings"]:
        if warning not in shown:  # a failure's message is the row's WHY already
            click.echo(f"warning: {warning}", err=True)
    return ExitCode.OK
