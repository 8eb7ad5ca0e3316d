"""Hostile input while the daemon supervises: a bad config on reload, the daemon itself out of file
descriptors, a state file from a newer release. None of them may stop or replace a healthy container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dankserve.state import SCHEMA_VERSION, STATE_FILE
from tests.harness.daemon import REPO, RunningDaemon, container_deployment, free_port, running_daemon
from tests.harness.faults import (
    ContainerWatch,
    FaultTally,
    containers_of,
    cycles,
    descriptors_exhausted,
    is_ready,
    read_state,
    reproduce,
    tally,
)
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import hold_for, holds_within

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]


def running_ids(env: PodmanEnv, name: str) -> list[str]:
    return [c["Id"] for c in containers_of(env, name) if c.get("State") == "running"]


def more_events(daemon: RunningDaemon, event: str, than: int) -> Callable[[], bool]:
    return lambda: len(daemon.events_named(event)) > than


def reload_error_cleared(daemon: RunningDaemon) -> bool:
    status = daemon.status()
    return status is not None and status["daemon"]["config"]["refused"] is None


def _bomb(config: Path, good: str) -> None:
    config.write_text(good + "x = " + "[" * 5000 + "]" * 5000 + "\n")


def _pydantic_option(config: Path, good: str) -> None:
    config.write_text("_cli_parse_args = true\n" + good)


def _fifo(config: Path, good: str) -> None:
    config.unlink()
    os.mkfifo(config, 0o600)


def _huge(config: Path, good: str) -> None:
    config.write_text(good + "# " + "x" * (2 << 20) + "\n")


def _owned_flag(config: Path, good: str) -> None:
    config.write_text(
        good.replace('model = "test/tiny"\n', 'model = "test/tiny"\nextra_args = ["--host", "0.0.0.0"]\n')
    )


def _unknown_key(config: Path, good: str) -> None:
    config.write_text("flavour = 1\n" + good)


BAD_RELOADS: dict[str, Callable[[Path, str], None]] = {
    "TOML nesting bomb": _bomb,
    "pydantic-settings option (_cli_parse_args)": _pydantic_option,
    "a FIFO as the config": _fifo,
    "a 2 MiB config": _huge,
    "--host in extra_args": _owned_flag,
    "unknown key": _unknown_key,
}


def test_a_bad_config_on_reload_keeps_the_running_deployment(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """SIGHUP with a broken config (each kind) keeps the running config and container; status reports the refusal;
    the good config reloaded again clears it."""
    name = deployments[0]
    record = FaultTally(
        "11-bad-config-on-reload",
        "SIGHUP with a broken config: a TOML nesting bomb, `_cli_parse_args`, a FIFO, a 2 MiB file, "
        "`--host` in extra_args, an unknown key",
        "the daemon logs `reload_rejected` and reports it in `status` (`daemon.config.refused`); the same container "
        "keeps serving (ready, no boot); the good config reloaded clears the error; SIGTERM still stops the daemon",
        reproduce("tests/reliability/test_hostile_input.py::test_a_bad_config_on_reload_keeps_the_running_deployment"),
    )
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        boots = daemon.wait_for(name, is_ready, timeout=120)["boots"]
        good = daemon.config.read_text()
        for cycle in range(cycles("bad_reload")):
            for kind, corrupt in BAD_RELOADS.items():
                before = running_ids(podman_env, name)
                rejected = len(daemon.events_named("reload_rejected"))
                record.inject(kind)
                corrupt(daemon.config, good)
                daemon.signal(signal.SIGHUP)
                seen = holds_within(more_events(daemon, "reload_rejected", rejected), 30)
                status = daemon.status() or {}
                reported = (status.get("daemon", {}).get("config") or {}).get("refused") is not None
                if daemon.config.is_fifo():
                    daemon.config.unlink()
                daemon.config.write_text(good)
                daemon.config.chmod(0o600)
                daemon.signal(signal.SIGHUP)
                cleared = holds_within(lambda: reload_error_cleared(daemon), 30)
                try:
                    now = daemon.wait_for(name, is_ready, timeout=30)
                except AssertionError as exc:
                    record.lose(f"cycle {cycle}, {kind}: not ready: {str(exc)[:300]}")
                    continue
                if not seen or not reported:
                    record.lose(f"cycle {cycle}, {kind}: rejected {seen}, reported in status {reported}")
                elif not cleared:
                    record.lose(f"cycle {cycle}, {kind}: the good config reloaded did not clear the error")
                elif now["boots"] != boots or running_ids(podman_env, name) != before:
                    record.lose(f"cycle {cycle}, {kind}: the container was replaced (boots {boots} -> {now['boots']})")
                else:
                    record.recover()
        assert daemon.stop() == 0
    assert watch.breaches == []
    record.check()


def test_the_daemon_out_of_descriptors_keeps_its_deployment(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """The daemon's descriptor limit cut to what it holds (EMFILE on every new socket) for a few health
    intervals: its own error, so the healthy container is neither killed nor counted as failed."""
    name = deployments[0]
    record = FaultTally(
        "12-daemon-out-of-descriptors",
        "the daemon's RLIMIT_NOFILE cut below its lowest free descriptor for 4 s (every new socket fails with EMFILE: "
        "health probes, the control socket, Podman calls), then restored",
        "the daemon logs `health_probe_not_sent` and no `health_failed`; the same container stays ready with no "
        "boot, restart or failure counted; status answers again once descriptors are back",
        reproduce("tests/reliability/test_hostile_input.py::test_the_daemon_out_of_descriptors_keeps_its_deployment"),
    )
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        first = daemon.wait_for(name, is_ready, timeout=120)
        assert daemon.proc is not None
        for cycle in range(cycles("daemon_emfile")):
            before = running_ids(podman_env, name)
            not_sent = len(daemon.events_named("health_probe_not_sent"))
            record.inject("EMFILE")
            with descriptors_exhausted(daemon.proc.pid):
                holds_within(more_events(daemon, "health_probe_not_sent", not_sent), 15)
                hold_for(4, "the fault held: more probes meet the exhausted descriptor table")
            try:
                now = daemon.wait_for(name, is_ready, timeout=30)
            except AssertionError as exc:
                record.lose(f"cycle {cycle}: not ready after: {str(exc)[:300]}")
                continue
            if daemon.events_named("health_failed"):
                record.lose(f"cycle {cycle}: a health check was counted against the server")
            elif len(daemon.events_named("health_probe_not_sent")) <= not_sent:
                record.lose(f"cycle {cycle}: no probe failed for want of descriptors (the fault did not bite)")
            elif (now["boots"], now["restarts"], now["last_failure"]) != (first["boots"], first["restarts"], None):
                record.lose(f"cycle {cycle}: boots/restarts/failure changed: {now}")
            elif running_ids(podman_env, name) != before:
                record.lose(f"cycle {cycle}: the container was replaced")
            else:
                record.recover()
        assert daemon.stop() == 0
    assert watch.breaches == []
    record.check()


def _dankserve(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "DANKSERVE_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_a_state_file_from_a_newer_release_is_never_destroyed(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """A downgrade: state.json from a newer dankserve. `status` reports it and changes nothing; the daemon exits 3
    and changes nothing; with the file restored the next daemon adopts the running container."""
    name = deployments[0]
    record = FaultTally(
        "13-state-file-newer-release",
        "state.json written by a newer dankserve (schema_version above this one's) found by `status` without a "
        "daemon and by a daemon starting (the previous one killed with -9 or stopped)",
        "`status` exits 0 and says `written by a newer dankserve`; `run` exits 3 with the fix, no traceback; the "
        "file is byte-for-byte unchanged and nothing is moved aside; the old file put back, the next daemon adopts "
        "the container (no boot; one boot after a daemon that was stopped)",
        reproduce("tests/reliability/test_hostile_input.py::test_a_state_file_from_a_newer_release_is_never_destroyed"),
    )
    state_dir = tmp_path / "state"
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        boots = daemon.wait_for(name, is_ready, timeout=120)["boots"]
        for cycle in range(cycles("state_newer")):
            how = "killed" if cycle % 2 == 0 else "stopped"
            if how == "killed":
                daemon.kill()
            else:
                assert daemon.stop() == 0
            mine = (state_dir / STATE_FILE).read_bytes()
            newer = json.dumps(
                {"schema_version": SCHEMA_VERSION + 1 + cycle, "deployments": {name: {"down": True}}, "more": [1]}
            ).encode()
            (state_dir / STATE_FILE).write_bytes(newer)
            record.inject(f"daemon {how}")
            status = _dankserve(daemon.config, "status")
            run = _dankserve(daemon.config, "run", "--hardware", str(stand_in_host))
            untouched = (state_dir / STATE_FILE).read_bytes() == newer and not list(state_dir.glob("*.corrupt-*"))
            (state_dir / STATE_FILE).write_bytes(mine)
            daemon.start()
            try:
                now = daemon.wait_for(name, is_ready, timeout=120)
            except AssertionError as exc:
                record.lose(f"cycle {cycle}: not ready after: {str(exc)[:300]}")
                break
            if status.returncode != 0 or "written by a newer dankserve" not in status.stderr:
                record.lose(f"cycle {cycle}: status exit {status.returncode}: {status.stderr[-300:]}")
            elif run.returncode != 3 or "fix:" not in run.stderr or "Traceback" in run.stderr:
                record.lose(f"cycle {cycle}: run exit {run.returncode}: {run.stderr[-300:]}")
            elif not untouched:
                record.lose(f"cycle {cycle}: the newer release's state file was changed or moved")
            elif now["boots"] != boots + (0 if how == "killed" else 1):  # a stopped daemon stopped its container
                record.lose(f"cycle {cycle}, daemon {how}: boots {boots} -> {now['boots']}")
            else:
                read_state(state_dir)
                record.recover()
            boots = now["boots"]
        assert daemon.stop() == 0
    assert watch.breaches == []
    record.check()
