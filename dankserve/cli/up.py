"""`dankserve up [DEPLOYMENT]`: start the service (or one deployment) and follow it until it rests.

With systemd and the unit installed it asks systemd; otherwise it starts the daemon in the
background (pid file in the state dir). It then prints each deployment's phase as it changes,
with what it waits for and for how long (on a terminal also a progress line of the boots), until
every deployment it follows rests (`supervisor.observe.status.RESTING_STATES`: ready, asleep, failed,
down, disabled), and ends with one line per deployment saying where it rests. Running it again
changes nothing. Exit codes: 5 when one failed, 6 when --timeout ran out; when the daemon stops
while starting, its own last error and exit code.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment, hardware_option, timeout_option
from dankserve.cli.render import colour_enabled, format_duration, is_terminal, paint, terminal_width
from dankserve.errors import DankserveError, DeploymentFailed, InvalidInput, TimedOut
from dankserve.exitcodes import ExitCode

POLL_SECONDS = 0.2
STILL_SECONDS = 15.0
"""Piped output repeats an unchanged wait's line this often, with its time so far."""


@click.command("up")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
@click.option("--foreground", is_flag=True, help="Run the daemon attached to this terminal.")
@timeout_option
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
    log_start = _log_size(state_dir)  # the daemon's own error is looked for in what follows
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
    return _follow(FollowedDaemon(state_dir, proc, via_systemd, log_start, deployment), wanted, timeout)


@dataclass(frozen=True)
class FollowedDaemon:
    """The daemon `up` follows: its state dir, the process `up` started (if it did), and where its log began."""

    state_dir: Path
    proc: subprocess.Popen[bytes] | None
    via_systemd: bool
    log_start: int
    deployment: str | None = None
    """The one deployment `up NAME` asked for (None: all)."""
    boots_before: Mapping[str, int] = field(default_factory=dict)
    """Boots each deployment had before the request followed (`rollback`): it rests only once a later boot
    began, never on the server the request replaces (still ready for a moment after the answer)."""


def rests_after(dep: Mapping[str, Any], boots_before: int | None) -> bool:
    """The deployment rests, and is not ready on the server a request replaces (no boot since `boots_before`)."""
    if not dep["rests"]:
        return False
    return boots_before is None or dep["state"] != "ready" or int(dep.get("boots") or 0) > boots_before


def boots_now(state_dir: Path, name: str) -> int:
    """The boots the running daemon counts for `name` now (0 when it does not say)."""
    from dankserve import servicectl

    reply = servicectl.daemon_request(state_dir, {"command": "status"}, timeout=5)
    if not reply or not reply.get("ok"):
        return 0
    found = [d for d in reply["status"]["deployments"] if d.get("name") == name]
    return int(found[0].get("boots") or 0) if found else 0


def _winner(daemon: FollowedDaemon) -> FollowedDaemon | None:
    """When the daemon this `up` started lost the race for the one-daemon lock to another `up`'s (both found no
    daemon and started one): the winner to follow instead, told of `up NAME`; else None."""
    from dankserve import servicectl
    from dankserve.supervisor.records import StateBook

    assert daemon.proc is not None
    pid = servicectl.daemon_pid(daemon.state_dir)
    if pid is None or pid == daemon.proc.pid:
        return None
    click.echo(f"another `dankserve up` started the daemon first (pid {pid if pid > 0 else 'unknown'}); following it")
    if daemon.deployment is not None:
        StateBook(daemon.state_dir).set_down(daemon.deployment, False)  # for a winner still starting
        servicectl.daemon_request(daemon.state_dir, {"command": "up", "deployment": daemon.deployment})
    return replace(daemon, proc=None)


def _follow(daemon: FollowedDaemon, wanted: list[str], timeout: float | None) -> ExitCode:
    """Print phase changes until every wanted deployment rests; the exit code that follows. Ctrl-C stops the
    following only: it says so, and how to follow or stop what goes on in the daemon (then exit 130)."""
    view = FollowView(live=is_terminal(), colour=colour_enabled())
    try:
        return _follow_until_rest(daemon, wanted, timeout, view)
    except KeyboardInterrupt:
        view.clear()
        click.echo("\n" + interrupted_note(wanted), err=True)
        raise


def interrupted_note(wanted: Sequence[str]) -> str:
    """What Ctrl-C in `up` leaves: the daemon goes on with the boots; how to follow them or stop them."""
    names = ", ".join(wanted)
    one = f" {wanted[0]}" if len(wanted) == 1 else ""
    return (
        f"stopped following; the daemon goes on with {names} in the background (a boot under way continues).\n"
        f"  follow it: `dankserve status{one}` or `dankserve logs -f{one}`; stop it: `dankserve down{one}`"
    )


def _follow_until_rest(daemon: FollowedDaemon, wanted: list[str], timeout: float | None, view: FollowView) -> ExitCode:
    from dankserve import servicectl

    deadline = None if timeout is None else time.monotonic() + timeout
    answered = False
    deployments: dict[str, dict[str, Any]] = {}
    while True:
        if daemon.proc is not None and daemon.proc.poll() is not None:
            view.clear()
            winner = _winner(daemon)
            if winner is None:
                raise daemon_stopped(daemon, daemon.proc.returncode)
            daemon = winner
        reply = servicectl.daemon_request(daemon.state_dir, {"command": "status"}, timeout=5)
        if reply and reply.get("ok"):
            answered = True
            deployments = {d["name"]: d for d in reply["status"]["deployments"] if d["name"] in wanted}
            view.show(deployments.values(), time.monotonic())
            before = daemon.boots_before
            if deployments and all(rests_after(d, before.get(name)) for name, d in deployments.items()):
                view.clear()
                for dep in deployments.values():
                    click.echo(resting_line(dep, colour=view.colour))
                failed = [name for name, d in deployments.items() if d["state"] == "failed"]
                if failed:
                    names = ", ".join(failed)
                    raise DeploymentFailed(
                        f"deployment(s) failed: {names}",
                        fix=f"`dankserve status {failed[0]}` and `dankserve logs {failed[0]}` show the cause; "
                        f"fix it, then `dankserve up {failed[0]}`",
                    )
                return ExitCode.OK
        elif answered and servicectl.daemon_pid(daemon.state_dir) is None:
            view.clear()
            code = daemon.proc.wait(10) if daemon.proc is not None else None
            raise daemon_stopped(daemon, code)
        elif daemon.via_systemd and not answered and servicectl.unit_failed():
            view.clear()
            raise daemon_stopped(daemon, None)
        if deadline is not None and time.monotonic() > deadline:
            view.clear()
            waiting = [d for d in deployments.values() if not d["rests"]]
            for dep in deployments.values():
                click.echo(resting_line(dep, colour=view.colour) if dep["rests"] else phase_line(dep))
            names = ", ".join(d["name"] for d in waiting) or "the daemon did not answer"
            raise TimedOut(
                f"not every deployment rests after --timeout {timeout:g}s ({names}); the daemon keeps trying",
                fix="follow it with `dankserve status`, or run `dankserve up` again to wait on",
            )
        time.sleep(POLL_SECONDS)


def shown_phase(dep: Mapping[str, Any]) -> str:
    """A deployment's phase as `up` names it: the state once it rests, else the phase (with weights percent)."""
    from dankserve.cli.status import shown_state

    state = shown_state(dep)
    if dep["rests"]:
        return state
    if state == "stopped":  # the worker has begun, its machine not yet: what `up` asked for is under way
        return "starting"
    if state == "pulling":  # the image step: a process has none, a present image is not pulled
        return "preparing" if dep.get("runtime") == "process" else "image (pulled if missing)"
    if state != dep["state"]:
        return state
    return f"{state} ({dep['phase']})" if dep["phase"] not in (state, "stopped", "pulling") else state


def phase_line(dep: Mapping[str, Any], elapsed: float | None = None) -> str:
    """One follow line: the phase, how long it has lasted (once a second or more: a line printed as the phase
    begins would say [0s]), the time since `up` began following (`+Ns`), and why it waits (if it does)."""
    seconds = dep.get("phase_seconds")
    took = f" [{format_duration(seconds)}]" if seconds is not None and seconds >= 1 else ""
    since = f" (+{format_duration(elapsed)})" if elapsed is not None and elapsed >= 1 else ""
    why = f": {dep['why']}" if dep.get("why") and not dep["rests"] else ""
    return f"{dep['name']}: {shown_phase(dep)}{took}{since}{why}"


BOOT_STEPS = {
    "downloading": "downloading weights",
    "loading": "loading weights",
    "compiling": "compiling (torch.compile)",
    "profiling": "profiling memory",
    "capturing": "capturing CUDA graphs",
    "warming": "warming up (the first request's kernels)",
}


def progress_line(deployments: Sequence[Mapping[str, Any]]) -> str:
    """The terminal's progress line: each deployment still under way, its boot step and time so far."""
    parts = []
    for dep in deployments:
        if dep["rests"]:
            continue
        phase = str(dep["phase"])
        step = BOOT_STEPS.get(phase, phase)
        percent = dep.get("weights_percent")
        if percent is not None and phase in ("downloading", "loading"):
            step += f" {percent}%"
        if dep.get("waiting_for"):
            step = "waiting"
        parts.append(f"{dep['name']}: {step} {format_duration(dep.get('phase_seconds'))}")
    return " | ".join(parts)


def resting_line(dep: Mapping[str, Any], *, colour: bool = False) -> str:
    """Where a deployment rests, in one line (the end of `up`)."""
    state = paint(str(dep["state"]), str(dep["state"]), colour)
    if dep["state"] == "ready":
        return f"{dep['name']}: {state}, serving at {dep['endpoint']}"
    return f"{dep['name']}: {state}" + (f": {dep['why']}" if dep.get("why") else "")


@dataclass
class FollowView:
    """What `up` prints while it follows: a line per change (repeated every STILL_SECONDS when piped), and on a
    terminal one progress line kept at the bottom, rewritten in place."""

    live: bool
    colour: bool
    _shown: dict[str, tuple[str, str]] = field(default_factory=dict)
    _printed_at: dict[str, float] = field(default_factory=dict)
    _drawn: bool = False
    _began: float | None = None
    """When the first status was shown (monotonic): a line says how long after that it came."""

    def show(self, deployments: Sequence[Mapping[str, Any]] | Any, now: float) -> None:
        deployments = list(deployments)
        began = self._began = now if self._began is None else self._began
        for dep in deployments:
            name = dep["name"]
            key = (shown_phase(dep), str(dep.get("why") or ""))
            repeat = not self.live and not dep["rests"] and now - self._printed_at.get(name, now) >= STILL_SECONDS
            if self._shown.get(name) != key or repeat:
                self.clear()
                click.echo(phase_line(dep, now - began))
                self._shown[name] = key
                self._printed_at[name] = now
        if self.live:
            line = progress_line(deployments)
            width = terminal_width() or 80
            if line:
                click.echo("\r\x1b[K" + line[: width - 1], nl=False)
                self._drawn = True
            else:
                self.clear()

    def clear(self) -> None:
        if self._drawn:
            click.echo("\r\x1b[K", nl=False)
            self._drawn = False


def _log_size(state_dir: Path) -> int:
    from dankserve import servicectl

    try:
        return (state_dir / servicectl.DAEMON_LOG).stat().st_size
    except OSError:
        return 0


def last_error(text: str) -> str | None:
    """The daemon's own last error in its output: the `error: ...` it printed on its way out (with its fix), else
    its last error-level log line (JSON or console); None when it said none."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("error: "):
            block = [lines[i].removeprefix("error: ")]
            block += [line for line in lines[i + 1 :] if line.startswith("  ")]
            return "\n".join(block)
    for line in reversed(lines):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("level") in ("error", "critical"):
                    rest = {k: v for k, v in entry.items() if k not in ("level", "timestamp", "logger")}
                    return " ".join(f"{k}={v}" for k, v in rest.items())
        elif "[error" in line or "[critical" in line:
            return line.strip()
    return None


def _journal_text() -> str:
    from dankserve import servicectl

    done = subprocess.run(
        ["journalctl", "--no-pager", "-o", "cat", "-n", "40", "-u", servicectl.UNIT_NAME],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout


def daemon_stopped(daemon: FollowedDaemon, code: int | None) -> DankserveError:
    """The error `up` ends with when the daemon stopped while it waited: the daemon's own last error and code."""
    from dankserve import servicectl

    log_path = daemon.state_dir / servicectl.DAEMON_LOG
    text = ""
    if daemon.via_systemd:
        with contextlib.suppress(OSError):
            text = _journal_text()
        where = f"`journalctl -u {servicectl.UNIT_NAME} -n 30`"
    else:
        with contextlib.suppress(OSError), log_path.open("rb") as log:
            log.seek(daemon.log_start)
            text = log.read().decode(errors="replace")
        where = f"{log_path} and `dankserve logs`"
    said = last_error(text)
    exited = f" with exit code {code}" if code is not None else ""
    if said:  # the daemon's own words, with its own fix
        error = DankserveError(f"the daemon stopped while starting{exited}: {said}\n  its whole output: {where}")
    else:
        error = DankserveError(f"the daemon stopped while starting{exited} and said no error", fix=f"read {where}")
    error.exit_code = ExitCode(code) if code in tuple(ExitCode) and code != 0 else ExitCode.ENVIRONMENT
    return error
