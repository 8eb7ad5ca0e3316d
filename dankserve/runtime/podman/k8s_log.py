"""The k8s-file follower: a running container's log file read directly on this host, followed until
conmon says the container exited."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dankserve.runtime.logfile import ChangeWatch, follow_file, k8s_file_timed_lines, poll_briefly


def conmon_exit_file(cmdline: Sequence[str], container_id: str) -> Path | None:
    """Where conmon writes the container's exit status (its `--exit-dir` and the container ID)."""
    for i, arg in enumerate(cmdline):
        if arg == "--exit-dir" and i + 1 < len(cmdline):
            return Path(cmdline[i + 1]) / container_id
        if arg.startswith("--exit-dir="):
            return Path(arg.partition("=")[2]) / container_id
    return None


def local_k8s_path(attrs: Mapping[str, Any]) -> Path | None:
    """The container's k8s-file log when it is readable on this host, else None."""
    log_config = (attrs.get("HostConfig") or {}).get("LogConfig") or {}
    path = Path(str(log_config.get("Path") or ""))
    if log_config.get("Type") != "k8s-file" or not log_config.get("Path") or not os.access(path, os.R_OK):
        return None
    return path


def local_k8s_log(attrs: Mapping[str, Any]) -> Iterator[tuple[datetime | None, str]] | None:
    """The lines (with conmon's time of each) of a running container's k8s-file log on this host,
    followed until it exits.

    None (read through the API instead) unless the log driver is k8s-file, the file is readable
    here, and the ConmonPid of the inspect document is visible here as conmon for this container.
    conmon drains the container's output into the file and syncs it before it writes the exit
    file, and exits after that, so once either happened the file holds the whole log. The
    follower sleeps on inotify and conmon's pidfd (ChangeWatch) where it can, else polls.
    """
    import psutil

    log_config = (attrs.get("HostConfig") or {}).get("LogConfig") or {}
    path = Path(str(log_config.get("Path") or ""))
    conmon_pid = (attrs.get("State") or {}).get("ConmonPid")
    container_id = str(attrs.get("Id") or "")
    if log_config.get("Type") != "k8s-file" or not conmon_pid or not container_id or not os.access(path, os.R_OK):
        return None
    try:
        conmon = psutil.Process(int(conmon_pid))
        exit_file = conmon_exit_file(conmon.cmdline(), container_id)
        watch = ChangeWatch.open(path, conmon.pid, exit_file.parent if exit_file else None)
        # After the pidfd is open: it is this container's conmon only if the pid still names it.
        if conmon.name() != "conmon" or container_id not in conmon.cmdline():
            if watch is not None:
                watch.close()
            return None
    except (psutil.Error, ValueError):
        return None

    def running() -> bool:
        if exit_file is not None and exit_file.exists():
            return False
        if watch is not None:
            return not watch.process_ended()
        try:
            return conmon.is_running() and conmon.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def lines() -> Iterator[tuple[datetime | None, str]]:
        try:
            yield from k8s_file_timed_lines(follow_file(path, True, running, watch.wait if watch else poll_briefly))
        finally:
            if watch is not None:
                watch.close()

    return lines()
