"""`dankserve upgrade NAME [--image REF]`: try a new vLLM image beside the old server, then switch to
it or roll back (docs/OPERATIONS.md, Upgrades); prints each step as the daemon takes it."""

from __future__ import annotations

import time
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import DeploymentFailed, EnvironmentUnusable, InvalidInput, TimedOut
from dankserve.exitcodes import ExitCode

POLL_SECONDS = 0.5


def daemon_request(request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Send `request` to the running daemon; its answer and the settings it runs with."""
    from dankserve import servicectl

    settings = cli_context().daemon_settings().settings
    name = request["deployment"]
    if name not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(f"unknown deployment {name!r}", fix=f"configured deployments: {known}")
    reply = servicectl.daemon_request(settings.state_dir, request)
    if reply is None:
        raise EnvironmentUnusable(
            f"the dankserve daemon is not running: `{request['command']}` goes through it",
            fix=f"start it with `dankserve up {name}`",
        )
    if not reply.get("ok"):
        raise InvalidInput(str(reply.get("error")), fix=f"see `dankserve status {name}`")
    return reply, settings


def deployment_status(state_dir: Any, name: str) -> dict[str, Any] | None:
    """The deployment as the daemon's status shows it (None: not there, or no answer)."""
    from dankserve import servicectl

    reply = servicectl.daemon_request(state_dir, {"command": "status"})
    if reply is None or not reply.get("ok"):
        return None
    for dep in reply.get("status", {}).get("deployments", []):
        if isinstance(dep, dict) and dep.get("name") == name:
            return dep
    return None


def upgrade_record(state_dir: Any, name: str) -> dict[str, Any] | None:
    """The deployment's upgrade record as the daemon's status shows it (None: none, or no answer)."""
    dep = deployment_status(state_dir, name)
    record = dep.get("upgrade") if dep is not None else None
    return record if isinstance(record, dict) else None


def serving(state_dir: Any, name: str, image: str, boots: int | None, deadline: float | None) -> None:
    """Wait until the deployment serves on `image` after a switch, and say so: whether the trial server was
    handed over (its boots unchanged: no second boot) or the new image booted."""
    while deadline is None or time.monotonic() < deadline:
        dep = deployment_status(state_dir, name)
        if dep is not None and dep.get("state") == "ready" and dep.get("image") == image:
            how = "the trial server handed over: no second boot"
            if boots is None or dep.get("boots") != boots:
                how = "booted on the new image"
            click.echo(f"{name}: ready, serving {image} at {dep.get('endpoint')} ({how})")
            return
        if dep is not None and dep.get("state") == "failed":
            raise DeploymentFailed(
                f"{name!r} switched to {image} but failed to serve: {dep.get('message') or 'see the log'}",
                fix=f"`dankserve logs {name}`; `dankserve rollback {name}` goes back",
            )
        time.sleep(POLL_SECONDS)
    raise TimedOut(
        f"{name!r} switched to {image} but did not serve in time",
        fix=f"the daemon carries on: follow it with `dankserve status {name}`",
    )


def step_line(record: dict[str, Any]) -> str:
    words = str(record.get("step", "?")).replace("_", " ")
    if record.get("step") == "booting" and record.get("room"):
        room = "asleep at level 1" if record["room"] == "1" else "stopped"
        return f"{words} {record.get('new_image')} (the old server is {room})"
    if record.get("step") == "replanning" and record.get("new_version"):
        return f"{words} for vLLM {record['new_version']}"
    return words


def follow(state_dir: Any, name: str, sent: float, deadline: float | None) -> dict[str, Any]:
    """Print the upgrade's steps as the daemon takes them; its record once over (TimedOut past `deadline`)."""
    shown = None
    while deadline is None or time.monotonic() < deadline:
        record = upgrade_record(state_dir, name)
        if record is not None and float(record.get("started_at") or 0) >= sent - 5:
            line = step_line(record)
            if line != shown:
                click.echo(f"{name}: {line}")
                shown = line
            if record.get("step") in ("switched", "rolled_back", "refused"):
                return record
        time.sleep(POLL_SECONDS)
    raise TimedOut(
        f"the upgrade of {name!r} was not over in time",
        fix=f"the daemon carries on: follow it with `dankserve status {name}`",
    )


def outcome(name: str, record: dict[str, Any]) -> None:
    """Say how it ended; a rollback or refusal is an error (exit 5 or 2)."""
    step = record.get("step")
    if step == "switched":
        click.echo(f"{name}: now runs {record.get('new_image')}; checks: {_figures(record.get('report') or {})}")
        click.echo(f"  `dankserve rollback {name}` goes back to {record.get('old_image')}")
        changes = (record.get("report") or {}).get("plan_changes") or []
        if changes:
            click.echo("  the plan for the new release changed:")
            for change in changes:
                click.echo(f"    {change}")
        return
    if step == "rolled_back":
        raise DeploymentFailed(
            f"upgrade of {name!r} rolled back: {record.get('reason')}",
            fix=f"the old image {record.get('old_image')} serves again; `dankserve status {name}`",
        )
    raise InvalidInput(
        f"upgrade of {name!r} refused: {record.get('reason')}",
        fix="the old server kept serving; pin another image with --image",
    )


@click.command("upgrade")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
@click.option("--image", "image", default=None, help="The new image (default: the configured one, pulled again).")
@click.option(
    "--auto",
    "auto",
    is_flag=True,
    help="Every Podman deployment whose image has a newer digest, as [upgrade] auto_update says (the daily timer).",
)
@click.option("--timeout", type=float, default=None, help="Give up following after this many seconds.")
def command(deployment: str | None, image: str | None, auto: bool, timeout: float | None) -> ExitCode:
    """Try a new vLLM image for DEPLOYMENT beside the old server; switch when it is no worse, else roll back."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if auto:
        return _auto(deployment, deadline)
    if deployment is None:
        raise InvalidInput("name the deployment to upgrade", fix="dankserve upgrade NAME [--image REF], or --auto")
    if image is not None:
        from dankserve.settings import IMAGE_FIX, image_reference_problem

        problem = image_reference_problem(image)
        if problem is not None:
            raise InvalidInput(f"--image {image!r} {problem}", fix=IMAGE_FIX)
    before = deployment_status(cli_context().daemon_settings().settings.state_dir, deployment)
    boots = before.get("boots") if before is not None else None  # a handover leaves them as they are
    sent = time.time()
    _, settings = daemon_request({"command": "upgrade", "deployment": deployment, "image": image})
    record = follow(settings.state_dir, deployment, sent, deadline)
    outcome(deployment, record)
    serving(
        settings.state_dir,
        deployment,
        str(record.get("new_image")),
        boots if isinstance(boots, int) else None,
        deadline,
    )
    return ExitCode.OK


def _auto(only: str | None, deadline: float | None) -> ExitCode:
    """The timer's run: each deployment upgraded when its image's digest changed (registry: pulled again;
    local: the local image under its reference)."""
    settings = cli_context().daemon_settings().settings
    mode = settings.upgrade.auto_update
    if mode == "off":
        click.echo('auto_update = "off" in [upgrade]: nothing to do')
        return ExitCode.OK
    names = [n for n, d in settings.deployments.items() if d.enabled and d.runtime == "podman" and only in (None, n)]
    rolled_back = []
    for name in names:
        sent = time.time()
        request = {"command": "upgrade", "deployment": name, "pull": "always" if mode == "registry" else "never"}
        try:
            daemon_request({**request, "image": None, "if_newer": True})
        except InvalidInput as exc:  # not serving now: the next run tries again
            click.echo(f"{name}: skipped: {exc.message}")
            continue
        record = follow(settings.state_dir, name, sent, deadline)
        if record.get("step") == "refused" and str(record.get("reason", "")).startswith("up to date"):
            click.echo(f"{name}: up to date")
            continue
        try:
            outcome(name, record)
            serving(settings.state_dir, name, str(record.get("new_image")), None, deadline)
        except (DeploymentFailed, InvalidInput) as exc:
            click.echo(f"{name}: {exc.message}", err=True)
            rolled_back.append(name)
    if rolled_back:
        raise DeploymentFailed(
            f"not upgraded: {', '.join(rolled_back)}", fix="their old images serve; see `dankserve status`"
        )
    return ExitCode.OK


def _figures(report: dict[str, Any]) -> str:
    parts = []
    if "kv_change_percent" in report:
        parts.append(f"KV cache {report['kv_change_percent']:+.1f} %")
    if "decode_change_percent" in report:
        parts.append(f"decode {report['decode_change_percent']:+.1f} %")
    if "greedy_ids_equal" in report:
        parts.append("greedy ids equal" if report["greedy_ids_equal"] else "greedy ids differ")
    return ", ".join(parts) or "it answers (no figures of the old server to compare)"
