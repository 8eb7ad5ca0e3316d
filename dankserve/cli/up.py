"""`dankserve up [DEPLOYMENT]`: start the service (or one deployment) and follow it until ready.

With systemd and the unit installed it asks systemd; otherwise it starts the daemon in the
background (pid file in the state dir). It then shows live phases until every deployment it
started is ready or failed, and prints the endpoints. Running it again changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment, hardware_option
from dankserve.errors import EnvironmentUnusable, InfeasiblePlan, InvalidInput
from dankserve.exitcodes import ExitCode

SETTLED = ("ready", "failed", "down", "disabled")


@click.command("up")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
@click.option("--foreground", is_flag=True, help="Run the daemon attached to this terminal.")
@click.option("--timeout", type=float, default=None, help="Give up following after this many seconds.")
@hardware_option
def command(deployment: str | None, foreground: bool, timeout: float | None, hardware: Path | None) -> ExitCode:
    """Start every enabled deployment (or DEPLOYMENT) and wait until ready."""
    from dankserve import servicectl

    ctx = cli_context()
    settings = ctx.load_settings()
    if deployment is not None and deployment not in settings.deployments:
        known = ", ".join(sorted(settings.deployments)) or "none"
        raise InvalidInput(
            f"unknown deployment {deployment!r}", fix=f"configured deployments: {known} (edit the config file)"
        )
    if not settings.deployments:
        from dankserve.settings import resolve_config_path

        path, _ = resolve_config_path(ctx.config)
        raise InvalidInput(
            f"no deployments are configured in {path}{'' if path.exists() else ' (the file does not exist)'}",
            fix=f"run `dankserve install` (it writes a commented example to {path} and installs the systemd unit), "
            "then keep or edit its [deployments.NAME] tables",
        )
    state_dir = settings.state_dir
    if deployment is not None:
        from dankserve.supervisor.records import StateBook

        store = StateBook(state_dir)
        store.set_down(deployment, False)

    if foreground:
        from dankserve.logging_setup import configure_logging
        from dankserve.supervisor.assembly import build_daemon
        from dankserve.supervisor.instance import use_private_umask

        use_private_umask()
        configure_logging(settings.log_format, state_dir=settings.state_dir)
        return build_daemon(settings, hardware_file=hardware, config_path=ctx.config).run()

    proc: subprocess.Popen[bytes] | None = None
    via_systemd = False
    pid = servicectl.daemon_pid(state_dir)
    if pid is not None:
        if deployment is not None:
            reply = servicectl.daemon_request(state_dir, {"command": "up", "deployment": deployment})
            if reply is not None and not reply.get("ok"):
                raise InvalidInput(str(reply.get("error")))
    elif servicectl.systemd_manages(ctx.config):
        servicectl.systemctl("start", "--no-block", servicectl.UNIT_NAME)
        click.echo("started dankserve.service")
        via_systemd = True
    else:
        env = dict(os.environ)
        if hardware is not None:
            env["DANKSERVE_HARDWARE"] = str(hardware)
        if ctx.config is not None:
            env["DANKSERVE_CONFIG"] = str(ctx.config)
        argv = servicectl.run_argv(ctx.config)
        proc = servicectl.spawn_daemon(argv, state_dir, env)
        click.echo(f"started the dankserve daemon (pid {proc.pid}; log {state_dir / servicectl.DAEMON_LOG})")
    wanted = [deployment] if deployment else [n for n, d in settings.deployments.items() if d.enabled]
    return _follow(settings.state_dir, wanted, proc, timeout, via_systemd)


def _follow(
    state_dir: Path,
    wanted: list[str],
    proc: subprocess.Popen[bytes] | None,
    timeout: float | None,
    via_systemd: bool = False,
) -> ExitCode:
    """Print phase changes until every wanted deployment settles; the exit code that follows."""
    from dankserve import servicectl

    deadline = None if timeout is None else time.monotonic() + timeout
    shown: dict[str, str] = {}
    answered = False
    while True:
        if proc is not None and proc.poll() is not None:
            _explain_daemon_exit(state_dir, proc.returncode)
        reply = servicectl.daemon_request(state_dir, {"command": "status"}, timeout=5)
        if reply and reply.get("ok"):
            answered = True
            deployments = {d["name"]: d for d in reply["status"]["deployments"] if d["name"] in wanted}
            for name, dep in deployments.items():
                line = _progress(dep)
                if shown.get(name) != line:
                    click.echo(line)
                    shown[name] = line
            if deployments and all(d["state"] in SETTLED for d in deployments.values()):
                failed = [d for d in deployments.values() if d["state"] == "failed"]
                for dep in deployments.values():
                    if dep["state"] == "ready":
                        click.echo(f"{dep['name']}: serving at {dep['endpoint']}")
                if failed:
                    names = ", ".join(d["name"] for d in failed)
                    raise InfeasiblePlan(
                        f"deployment(s) failed: {names}",
                        fix="see `dankserve status` and `dankserve logs` for the cause and its fix",
                    )
                return ExitCode.OK
        elif answered and servicectl.daemon_pid(state_dir) is None:
            raise EnvironmentUnusable("the daemon stopped while starting", fix="see `dankserve logs`")
        elif via_systemd and not answered and servicectl.unit_failed():
            raise EnvironmentUnusable(
                f"{servicectl.UNIT_NAME} failed to start",
                fix=f"read why with `journalctl -u {servicectl.UNIT_NAME} -n 30`; `dankserve doctor` checks the host",
            )
        if deadline is not None and time.monotonic() > deadline:
            raise EnvironmentUnusable(
                "not ready before --timeout; the daemon keeps trying", fix="follow it with `dankserve status`"
            )
        time.sleep(0.2)


def _progress(dep: dict[str, Any]) -> str:
    phase = dep["phase"]
    extra = ""
    if dep.get("message") and dep["state"] == "failed":
        extra = f": {dep['message']}"
    return f"{dep['name']}: {phase}{extra}"


def _explain_daemon_exit(state_dir: Path, code: int) -> None:
    from dankserve import servicectl
    from dankserve.errors import DankserveError

    log_path = state_dir / servicectl.DAEMON_LOG
    tail = ""
    with contextlib.suppress(OSError):
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-5:])
    error = DankserveError(f"the daemon exited with code {code}:\n{tail}", fix=f"see {log_path}")
    error.exit_code = ExitCode(code) if code in tuple(ExitCode) else ExitCode.INTERNAL
    raise error
