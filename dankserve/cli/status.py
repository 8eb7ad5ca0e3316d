"""`dankserve status [--json]`: the daemon and each deployment, whether or not the daemon runs."""

from __future__ import annotations

import time
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.render import format_bytes, print_json
from dankserve.errors import ConfigError
from dankserve.exitcodes import ExitCode
from dankserve.settings import Settings


def offline_status(settings: Settings) -> dict[str, Any]:
    """What status can say from the config and the state store while no daemon runs."""
    from dankserve.supervisor.records import StateBook
    from dankserve.supervisor.status import deployment_status

    store = StateBook(settings.state_dir, persist=False)
    deployments = [
        deployment_status(name, dep, store.deployment(name), None, down=store.is_down(name))
        for name, dep in sorted(settings.deployments.items())
    ]
    return {
        "daemon": {"running": False, "pid": None},
        "deployments": deployments,
        "warnings": list(store.load_warnings),
    }


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


def note_disk_config(doc: dict[str, Any], refusal: ConfigError | None, now: float) -> None:
    """Record in the daemon's `config` entry what this command found in the file on disk (`on_disk`)."""
    config = doc["daemon"].get("config")
    if config is None:  # no daemon answered: nothing runs a config
        return
    config["on_disk"] = (
        {"valid": True}
        if refusal is None
        else {"valid": False, "checked_at": now, "error": refusal.message, "fix": refusal.fix}
    )


def config_lines(daemon: dict[str, Any]) -> list[str]:
    """The lines saying that the config on disk was refused while the daemon runs the one it loaded before."""
    config = daemon.get("config") or {}
    disk = config.get("on_disk") or {}
    refused = config.get("refused") or (None if disk.get("valid", True) else {**disk, "at": disk["checked_at"]})
    if refused is None:
        return []
    error = " ".join(part.strip() for part in str(refused["error"]).splitlines())
    lines = [
        f"the config on disk was refused at {_clock(refused['at'])}: {error}; "
        f"running the config loaded at {_clock(config['loaded_at'])}"
    ]
    if disk.get("valid"):
        lines.append("  the file validates now: `dankserve reload` applies it")
    elif refused.get("fix"):
        lines.append(f"  fix: {refused['fix']}, then `dankserve reload`")
    return lines


def swap_line(swap: dict[str, Any]) -> str:
    """A swap group member's line: its group, how it sleeps, the last swap's timings."""
    parts = [f"swap group {swap['group']}" + (" (pinned)" if swap.get("pinned") else "")]
    if swap.get("level"):
        parts.append(f"asleep at level {swap['level']}" if swap["level"] != "stop" else "asleep (stopped)")
    if swap.get("idle_sleep_seconds"):
        parts.append(f"sleeps after {swap['idle_sleep_seconds']:g} s idle")
    timings = []
    if swap.get("last_sleep_seconds") is not None:
        timings.append(f"sleep {swap['last_sleep_seconds']:.2f} s")
    if swap.get("last_wake_seconds") is not None:
        timings.append(f"wake {swap['last_wake_seconds']:.2f} s")
    if timings:
        parts.append(f"last swap (level {swap.get('last_level') or '?'}): " + ", ".join(timings))
    return "; ".join(parts)


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


@click.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status document as JSON.")
def command(as_json: bool) -> ExitCode:
    """Show the daemon and each deployment's state, boots, learned KV cache and GPU memory."""
    reached = cli_context().daemon_settings()
    settings = reached.settings
    doc = current_status(settings)
    note_disk_config(doc, reached.refusal, time.time())
    doc["warnings"] = [
        *doc.get("warnings", []),
        *_warnings(doc, time.time(), settings.preemption_warning_interval_seconds),
    ]
    if as_json:
        print_json(doc)
        return ExitCode.OK
    daemon = doc["daemon"]
    click.echo(f"daemon: {'running (pid ' + str(daemon['pid']) + ')' if daemon['running'] else 'not running'}")
    for line in config_lines(daemon):
        click.echo(line)
    for dep in doc["deployments"]:
        uptime = f", up {dep['uptime_seconds']:.0f}s" if dep.get("uptime_seconds") is not None else ""
        percent = dep.get("weights_percent")
        phase = (
            f"{dep['phase']} {percent}%"
            if percent is not None and dep["phase"] in ("downloading", "loading")
            else dep["phase"]
        )
        click.echo(f"{dep['name']}: {dep['state']} ({phase}){uptime}  {dep['endpoint']}")
        click.echo(f"  model {dep['model']}  image {dep['image']}  vLLM {dep.get('vllm_version') or '?'}")
        learned = " (learned)" if dep.get("kv_cache_learned_used") else ""
        click.echo(
            f"  boots {dep['boots']}  restarts {dep['restarts']}  KV cache "
            f"{format_bytes(dep.get('kv_cache_memory_bytes'))}{learned}  "
            f"compile cache hit {dep.get('compile_cache_hit')}"
        )
        for line in _observed(dep):
            click.echo(f"  {line}")
        if dep.get("context_tokens"):
            holds = ""
            if dep.get("kv_cache_tokens") and dep.get("concurrency"):
                holds = (
                    f"; the KV cache holds {dep['kv_cache_tokens']:,} tokens: {dep['concurrency']:.1f} "
                    "requests of full length at once"
                )
            click.echo(f"  context {dep['context_tokens']:,} tokens{holds}")
        for member in dep.get("hosts") or []:  # a multi-host group: every host, the leader first
            note = f"  {member['message']}" if member.get("message") else ""
            click.echo(f"  host {member['address']} ({member['role']}): {member['state']}{note}")
        if dep.get("swap"):
            click.echo(f"  {swap_line(dep['swap'])}")
        for gpu in dep.get("gpus") or []:
            click.echo(
                f"  GPU {gpu['index']}: {format_bytes(gpu['memory_used_bytes'])} used of "
                f"{format_bytes(gpu['memory_total_bytes'])}"
            )
        if dep.get("last_failure"):
            click.echo(f"  last failure: {dep['last_failure'].get('class')}: {dep['last_failure'].get('message')}")
    for warning in doc["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    return ExitCode.OK
