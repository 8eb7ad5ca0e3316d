"""`make try-it` and `make try-it-podman`: a private copy of config/try-it.toml to drive the daemon by hand.

`python -m dankserve.testing.try_it [--dir D]` writes D (default: this user's `dankserve-try-it-USER`
under the temporary directory, so a second user's copy never clashes): the config with free ports
for the gateway, the metrics and each deployment, the stand-in vLLM linked as D/bin/vllm, and a
recorded two-H200 host D/host.json (the stand-in keeps each server's GPU memory beside it, in
D/host.json.processes, as NVML would list it: `dankserve status` shows it). It prints the exports
for every terminal and writes them to D/env.sh (`. D/env.sh` in a second terminal), then exits.

With `--podman` the same deployments run as containers of the stand-in image, through Podman as on a
GPU host: it sets up two stand-in GPU device nodes and a CDI spec naming them (dankserve.testing.gpus),
a private Podman service (dankserve.testing.podman_service) and the stand-in image in its storage,
writes the config with `podman_url` and `image` (the host file in the HF cache the containers mount, so
the stand-in's per-process GPU memory lands beside it), prints the exports, and keeps all of it until
Ctrl-C (or SIGTERM): then it stops the daemon, removes the containers, stops the service and removes
the nodes and the spec. Needs root and Debian's podman, runc, conmon and mmdebstrap, as `make demo`.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import shlex
import signal
import socket
import sys
import tempfile
import threading
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dankserve.runtime.base import CONTAINER_HF_HOME
from dankserve.testing import write_recorded_host
from dankserve.testing.config_file import write_config
from dankserve.testing.podman_service import REPO

TEMPLATE = REPO / "config" / "try-it.toml"
STAND_IN = REPO / "containers" / "fake-vllm" / "vllm.py"
PURPOSE = "tryit"
"""Names the private Podman storage (`DANKSERVE_TRYIT_PODMAN_ROOT`, else ~/.cache/dankserve-tryit/podman)."""
CDI_PREFIX = "dankserve-try-it-"
TOOLS = ("podman", "runc", "conmon", "mmdebstrap")
HOST_FILE = "host.json"
FIXED_DIR = "/tmp/dankserve-try-it"
"""The directory config/try-it.toml names (replaced by the private one)."""


class TryItRefused(Exception):
    """The set-up cannot run here (the message says why and what to do)."""


def default_dir() -> Path:
    """This user's copy: `dankserve-try-it-USER` in the temporary directory (the uid where no name is known)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry (a bare container)
        user = str(os.getuid())
    return Path(tempfile.gettempdir()) / f"dankserve-try-it-{user}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _listen(address: str, port: int) -> str:
    return f"{address.rpartition(':')[0]}:{port}"


def try_it_config(
    template: Mapping[str, Any], workdir: Path, ports: Iterator[int], *, image: str | None, podman_url: str | None
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """config/try-it.toml's globals and deployments for `workdir`: its paths there, every port a free one,
    the stand-in's per-process GPU memory beside the host file; `image` (and `podman_url`): containers of
    that image instead of processes. Pure but for the ports handed in."""

    def moved(value: Any) -> Any:
        return value.replace(FIXED_DIR, str(workdir)) if isinstance(value, str) else value

    globals_ = {k: moved(v) for k, v in template.items() if k != "deployments"}
    globals_["metrics_listen"] = _listen(globals_["metrics_listen"], next(ports))
    if "gateway" in globals_:
        globals_["gateway"] = {**globals_["gateway"], "listen": _listen(globals_["gateway"]["listen"], next(ports))}
    if podman_url is not None:
        globals_["podman_url"] = podman_url
    deployments: dict[str, dict[str, Any]] = {}
    for name, dep in template["deployments"].items():
        out = {k: moved(v) for k, v in dep.items()}
        out["port"] = next(ports)
        env = {k: moved(v) for k, v in dep.get("env", {}).items()}
        if image is not None:  # the readings go where the container writes: the HF cache it mounts
            out = {k: v for k, v in out.items() if k not in ("runtime", "executable")}
            out |= {"image": image, "pull": "never"}
            env["FAKE_VLLM_NVML_DIR"] = f"{CONTAINER_HF_HOME}/{HOST_FILE}.processes"
        out["env"] = env
        deployments[name] = out
    return globals_, deployments


def host_file(workdir: Path, globals_: Mapping[str, Any], *, process: bool) -> Path:
    """The recorded host: in the directory for processes, in the HF cache a container mounts (its per-process
    readings beside it, where the stand-in in the container writes them) for containers."""
    return workdir / HOST_FILE if process else Path(globals_["hf_cache_dir"]) / HOST_FILE


def exports(workdir: Path, globals_: Mapping[str, Any], *, process: bool) -> list[str]:
    """The lines every terminal runs before `dankserve ...` (D/env.sh holds them); TRY_IT_DIR, GATEWAY and
    METRICS are for docs/TRY-IT.md's commands."""
    path = [str(workdir / "bin")] if process else []
    path.append(str(Path(sys.executable).parent))  # this venv's dankserve
    lines = [
        f'export PATH={shlex.quote(":".join(path))}:"$PATH"',
        f"export DANKSERVE_CONFIG={shlex.quote(str(workdir / 'dankserve.toml'))}",
        f"export DANKSERVE_HARDWARE={shlex.quote(str(host_file(workdir, globals_, process=process)))}",
        f"export TRY_IT_DIR={shlex.quote(str(workdir))}",
        f"export METRICS=http://{globals_['metrics_listen']}",
    ]
    if "gateway" in globals_:
        lines.append(f"export GATEWAY=http://{globals_['gateway']['listen']}")
    return lines


def prepare(workdir: Path) -> None:
    """The private directory (0700, this user's), refused while a daemon runs from it."""
    from dankserve import servicectl

    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if workdir.stat().st_uid != os.getuid():
        raise TryItRefused(f"{workdir} belongs to another user: name a directory of yours with --dir")
    if servicectl.daemon_pid(workdir / "state") is not None:
        raise TryItRefused(
            f"a dankserve daemon runs from {workdir} now: `dankserve down` (with its exports) first, then again"
        )


def write_files(workdir: Path, globals_: Mapping[str, Any], deployments: Mapping[str, Any], *, process: bool) -> Path:
    """The config, the stand-in link (process runtime) and env.sh; the config's path."""
    config = write_config(workdir / "dankserve.toml", globals_, deployments)
    if process:
        (workdir / "bin").mkdir(exist_ok=True)
        link = workdir / "bin" / "vllm"
        link.unlink(missing_ok=True)
        link.symlink_to(STAND_IN)
        (workdir / "host.json.processes").mkdir(exist_ok=True)
    (workdir / "env.sh").write_text("\n".join(exports(workdir, globals_, process=process)) + "\n")
    return config


def announce(workdir: Path, globals_: Mapping[str, Any], *, process: bool) -> None:
    lines = [
        f"try-it: {workdir} ({'the stand-in vLLM as processes' if process else 'stand-in containers through Podman'})",
        "run these in every terminal (or `. " + str(workdir / "env.sh") + "`):",
        *(f"  {line}" for line in exports(workdir, globals_, process=process)),
        "then: dankserve up chat; dankserve status  (docs/TRY-IT.md lists more)",
    ]
    print("\n".join(lines), flush=True)


def set_up_processes(workdir: Path) -> None:
    prepare(workdir)
    template = tomllib.loads(TEMPLATE.read_text())
    ports = iter(free_port, None)
    globals_, deployments = try_it_config(template, workdir, ports, image=None, podman_url=None)
    write_recorded_host(host_file(workdir, globals_, process=True))
    write_files(workdir, globals_, deployments, process=True)
    announce(workdir, globals_, process=True)


@contextlib.contextmanager
def podman_environment(workdir: Path) -> Iterator[None]:
    """Stand-in GPUs, the private Podman service, the image, host file and config; all undone after."""
    from dankserve import servicectl
    from dankserve.testing.gpus import stand_in_gpus
    from dankserve.testing.podman_service import build_stand_in_image, missing_requirements, podman_service

    missing = missing_requirements(TOOLS)
    if missing:
        raise TryItRefused(
            f"missing {', '.join(missing)}: run `make try-it-podman` as root on Debian 12 (it installs the tools), "
            "or `make try-it` for the stand-in as plain processes"
        )
    prepare(workdir)
    with contextlib.ExitStack() as stack:
        gpus = stack.enter_context(stand_in_gpus(workdir / "gpus", count=2, prefix=CDI_PREFIX))
        podman = stack.enter_context(podman_service(workdir / "podman", purpose=PURPOSE))
        image = build_stand_in_image(podman, quiet=True)
        template = tomllib.loads(TEMPLATE.read_text())
        ports = iter(free_port, None)
        globals_, deployments = try_it_config(template, workdir, ports, image=image, podman_url=podman.url)
        hardware = host_file(workdir, globals_, process=False)
        hardware.parent.mkdir(parents=True, exist_ok=True)
        write_recorded_host(hardware, uuids=[g.uuid for g in gpus.gpus])
        write_files(workdir, globals_, deployments, process=False)

        def stop_all() -> None:
            servicectl.stop_daemon(workdir / "state", 60)
            names = podman.podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
            if names:
                podman.podman("rm", "-f", "-t", "0", *names, check=False)

        stack.callback(stop_all)
        print(f"stand-in GPUs: nodes in {gpus.dev_dir}, CDI spec {gpus.cdi_spec}; Podman service at {podman.url}")
        announce(workdir, globals_, process=False)
        yield


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dankserve.testing.try_it", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="the private directory (default: %(default)s)")
    parser.add_argument(
        "--podman", action="store_true", help="containers through a private Podman service with stand-in GPUs"
    )
    args = parser.parse_args(argv)
    workdir = (args.dir or default_dir()).absolute()
    try:
        if not args.podman:
            set_up_processes(workdir)
            return 0
        signal.signal(signal.SIGTERM, _stop)
        with podman_environment(workdir):
            print("kept until Ctrl-C (then the daemon, containers, Podman service and stand-in GPUs go)", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
        print("try-it: removed the stand-in GPUs and stopped the Podman service", flush=True)
        return 0
    except TryItRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:  # during the set-up: what was made is undone already (the exit stack)
        print("try-it: interrupted; what was set up is removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
