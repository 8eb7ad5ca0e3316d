"""How the CLI reaches the daemon: systemd when the unit is installed, else a background process.

`up`, `down`, `status` and `logs` use these; the daemon itself never imports this module.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dankserve import control
from dankserve.errors import EnvironmentUnusable, NotTheDaemonsUser
from dankserve.logsources import DAEMON_LOG as _DAEMON_LOG
from dankserve.processes import spawn_detached
from dankserve.supervisor import instance

DAEMON_LOG = _DAEMON_LOG
"""Where the background daemon writes (owned by logsources, which reads it; named here for its starters)."""

if TYPE_CHECKING:
    from dankserve.settings import Settings

UNIT_NAME = "dankserve.service"


def systemd_running() -> bool:
    """systemd is PID 1 here (so units can be started)."""
    return Path("/run/systemd/system").is_dir() and shutil.which("systemctl") is not None


def unit_installed() -> bool:
    """The dankserve unit is known to systemd."""
    return unit_text() is not None


def unit_text() -> str | None:
    """The dankserve unit as systemd has it (`systemctl cat`), None when it is not installed."""
    if not systemd_running():
        return None
    done = subprocess.run(["systemctl", "cat", UNIT_NAME], capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None


def systemd_manages(config: Path | None) -> bool:
    """The unit runs the daemon of this config: it is installed and the config is the unit's own.

    The unit reads the file its ExecStart= names with `--config` (`dankserve install --config-dir`),
    else the default one; a daemon for any other file (a second instance, `make demo`) runs in the
    background, so `up`/`down` never start or stop the unit for it.
    """
    from dankserve.settings import DEFAULT_CONFIG_PATH, resolve_config_path
    from dankserve.systemd.unit_file import config_of, exec_start

    path, _ = resolve_config_path(config)
    unit = unit_text()
    if unit is None:
        return False
    return path.absolute() == (config_of(exec_start(unit)) or DEFAULT_CONFIG_PATH)


def unit_failed() -> bool:
    """systemd reports the unit failed (e.g. the daemon exited 2/3/4 and is not restarted)."""
    done = subprocess.run(["systemctl", "is-failed", "--quiet", UNIT_NAME], capture_output=True, check=False)
    return done.returncode == 0


def systemctl(*args: str) -> None:
    """Run systemctl, turning a failure into an environment error with its message."""
    done = subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EnvironmentUnusable(
            f"systemctl {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}",
            fix=f"see `journalctl -u {UNIT_NAME}`",
        )


def daemon_request(state_dir: Path, message: dict[str, Any], timeout: float = 120.0) -> dict[str, Any] | None:
    """Ask the running daemon; None when none answers."""
    path = control.socket_path(state_dir)
    try:
        return control.request(path, message, timeout=timeout)
    except PermissionError:
        raise NotTheDaemonsUser(f"cannot reach the daemon's control socket {path}: permission denied") from None
    except (OSError, ValueError):
        return None


def running_settings(state_dir: Path) -> Settings | None:
    """The settings the daemon at `state_dir` runs with (None: no daemon answers, or it speaks another schema)."""
    from pydantic import ValidationError

    from dankserve.settings import Settings

    reply = daemon_request(state_dir, {"command": "settings"}, timeout=5)
    if not reply or not reply.get("ok") or not isinstance(reply.get("settings"), dict):
        return None
    try:
        return Settings.model_validate(reply["settings"])
    except ValidationError:
        return None


def daemon_pid(state_dir: Path) -> int | None:
    """The running daemon's pid, or None; raises when this user cannot tell (another user's state dir): a
    "not running" then would be a guess, and `down` would say it of a daemon that runs."""
    try:
        return instance.running_daemon(state_dir)
    except PermissionError:
        lock = state_dir / instance.LOCK_NAME
        raise NotTheDaemonsUser(f"cannot tell whether a daemon runs: {lock} is closed to uid {os.geteuid()}") from None


def spawn_daemon(argv: list[str], state_dir: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `dankserve run` detached from this terminal; its output goes to daemon.log."""
    instance.ensure_private_dir(state_dir)
    return spawn_detached(argv, state_dir / DAEMON_LOG, env=env, append=True)


def run_argv(config: Path | None, extra: list[str] | None = None) -> list[str]:
    """The command line that runs the daemon with the same interpreter and config."""
    argv = [sys.executable, "-m", "dankserve"]
    if config is not None:
        argv += ["--config", str(config)]
    return [*argv, "run", *(extra or [])]


def stop_daemon(state_dir: Path, timeout: float) -> bool:
    """SIGTERM the background daemon and wait until it is gone; False if it outlived timeout."""
    pid = daemon_pid(state_dir)
    if pid is None or pid <= 0:
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon_pid(state_dir) is None:
            return True
        time.sleep(0.1)
    return False
