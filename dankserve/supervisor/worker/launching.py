"""The interpreter's side of the launcher (issue 15): what the worker asks a deployment's launcher.

The machine decides (supervisor/machine/: `StopServer`, `StartWorkload.launcher_id`,
`LauncherLost`, `LauncherFound`); this module only talks to the launcher's socket
(runtime/launcher_client.py) and the runtime, and turns answers into the machine's events.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from dankserve.errors import EnvironmentUnusable
from dankserve.launcher import protocol
from dankserve.runtime.base import (
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_LAUNCHER,
    Runtime,
    Workload,
    WorkloadSpec,
    container_fingerprint,
)
from dankserve.runtime.launcher_client import LauncherClient, LauncherRefused, LauncherUnreachable
from dankserve.supervisor import machine as m

LISTEN_TIMEOUT_SECONDS = 60.0
"""How long a new launcher workload may take to open its socket (a container start, Python's start)."""


def is_launcher(workload: Workload) -> bool:
    return workload.labels.get(LABEL_LAUNCHER) == "true"


def found_launcher(
    workload: Workload, run_dir: Path, spec: WorkloadSpec | None, plan_fingerprint: str
) -> m.ExistingWorkload:
    """A launcher workload found while planning: what its server runs and whether this boot (`spec`; None:
    the deployment no longer uses the launcher) may keep it."""
    try:
        status = LauncherClient(run_dir).status()
    except (LauncherUnreachable, LauncherRefused):
        return m.ExistingWorkload(workload.id, workload.running, same_plan=False)  # replaced
    server = status.server
    running = server is not None and not server.exited
    fits = (
        spec is not None
        and workload.labels.get(LABEL_CONTAINER_FINGERPRINT) == container_fingerprint(spec)
        and status.version == protocol.VERSION  # an older dankserve's launcher: its server is adopted, not reused
    )
    launcher = m.LauncherFound(
        reusable=fits and workload.running,
        server=server.id if server is not None else None,
        server_running=running,
    )
    same_plan = server is not None and server.fingerprint == plan_fingerprint
    return m.ExistingWorkload(workload.id, workload.running, same_plan=same_plan, launcher=launcher)


def start_server(
    runtime: Runtime, workload_id: str, run_dir: Path, spec: WorkloadSpec, boot: int, *, timeout: float, new: bool
) -> m.WorkloadStarted | m.LauncherLost:
    """Ask the launcher `workload_id` for server number `boot` of `spec` (`new`: it was just started)."""
    client = LauncherClient(run_dir)
    request = runtime.launch_request(spec)
    try:
        if new:
            client.wait_listening(LISTEN_TIMEOUT_SECONDS)
        server = client.start(boot, request, spec.labels.get("io.dankserve.fingerprint"), timeout)
    except LauncherUnreachable as exc:
        if new:
            raise EnvironmentUnusable(
                f"the launcher of {spec.deployment!r} did not answer within {LISTEN_TIMEOUT_SECONDS:.0f} s: {exc}",
                fix="see `dankserve logs` (the image needs python3 for the launcher), or set launcher = false",
            ) from None
        return m.LauncherLost(str(exc))
    except LauncherRefused as exc:
        if new:
            raise EnvironmentUnusable(f"the launcher refused the server: {exc}", fix="see `dankserve logs`") from None
        return m.LauncherLost(f"it refused the server: {exc}")
    return m.WorkloadStarted(workload_id, boot, server=server.id)


def stop_server(run_dir: Path, timeout: float) -> None:
    """Stop the launcher's server (gone already, or the launcher gone: nothing to stop)."""
    with contextlib.suppress(LauncherUnreachable, LauncherRefused):
        LauncherClient(run_dir).stop(timeout)


def remove_launcher(runtime: Runtime, deployment: str, timeout: float) -> str | None:
    """Stop and remove `deployment`'s launcher workload if one exists; its id (None: there was none)."""
    found = runtime.find(deployment)
    if found is None or not is_launcher(found):
        return None
    runtime.stop(found.id, timeout)
    runtime.remove(found.id)
    return found.id


def wait_server(runtime: Runtime, workload_id: str, run_dir: Path, timeout: float) -> m.Exited | m.StillRunning:
    """The server's exit, as the launcher saw it; the launcher's own when it is gone."""
    try:
        server = LauncherClient(run_dir).wait(timeout)
    except (LauncherUnreachable, LauncherRefused):
        ended = runtime.wait(workload_id, timeout=timeout)
        return m.StillRunning() if ended is None else m.Exited(ended.exit_code, ended.oom_killed, launcher_gone=True)
    if server is None:
        return m.StillRunning()
    return m.Exited(server.exit_code, server.oom_killed)


def server_log(lines: Iterator[str], server: int | None) -> Iterator[str]:
    """The lines of one of the launcher's servers (all lines when `server` is None)."""
    return lines if server is None else protocol.server_lines(lines, server)
