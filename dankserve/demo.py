"""`make demo`: dankserve's whole flow on a machine without a GPU, with a stand-in vLLM.

It is a demo and says so: the server is the stand-in of containers/ (docs/stand-in-vllm.md),
which speaks vLLM 0.33's command line, log lines and endpoints and sleeps a scaled copy of a
real H200 boot, but runs no model. The host is a recorded 2 x H200 machine (dankserve/testing/hosts/) and
the GPUs are stand-in device nodes. Everything else is real: the dankserve CLI and daemon,
Podman, the container, the compile cache on disk and the learned KV-cache size.

The flow, through the real CLI: `dankserve plan` (a reason per flag) -> `dankserve up` (live
phases until ready) -> the container is killed -> the daemon restarts it with the learned
KV-cache bytes and a compile-cache hit (`dankserve up` follows) -> `dankserve status` ->
`dankserve down`; then a summary with the cold and warm boot times.

What it sets up is removed again at the end, also after an error or Ctrl-C: two stand-in GPU
device nodes and a uniquely named CDI spec (/etc/cdi/dankserve-demo-*.yaml), a private Podman
service, and a private directory with the config, the host file, the state and the caches.
Only the private image storage stays (~/.cache/dankserve-demo/podman, with the stand-in image,
so the next run starts at once). Needs root (device nodes, /etc/cdi, rootful Podman) and
Debian's podman, runc, conmon and mmdebstrap (`make demo` installs them).

Run: `make demo`, or `.venv/bin/python -m dankserve.demo [--keep]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from dankserve.runtime.base import workload_name

DEPLOYMENT = "demo"
PURPOSE = "demo"
"""Names the private Podman storage and run root (dankserve.testing.podman_service)."""
CDI_PREFIX = "dankserve-demo-"
DEMO_TOOLS = ("podman", "runc", "conmon", "mmdebstrap")
TIME_SCALE = 0.05
"""The stand-in sleeps this fraction of a real H200 boot: cold 116.2 s -> about 6 s."""
UP_TIMEOUT_SECONDS = 300
"""`dankserve up --timeout`: a boot that hangs ends the demo (and its clean-up runs) instead of waiting on."""
REAL_H200_BOOTS = "cold 116.2 s, compile cache kept 80.0 s, cache kept + learned KV bytes 52.8 s"

# A Llama-3.2-1B-shaped model, declared (nothing is downloaded; the stand-in loads no weights).
MODEL = "meta-llama/Llama-3.2-1B-Instruct"
MODEL_FACTS: dict[str, Any] = {
    "parameter_bytes": 2_471_645_184,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "moe": False,
    "dtype_bytes": 2,
}
BANNER = f"""\
================================================================================
 dankserve DEMO - runs with a STAND-IN vLLM, not the real one.
 The stand-in (containers/fake-vllm) prints vLLM 0.33's log lines, takes its flags,
 serves its endpoints and sleeps {TIME_SCALE:g} x the time of a real H200 boot, but runs no
 model. The host is a recorded 2 x H200 machine; its GPUs are stand-in device nodes.
 The dankserve CLI and daemon, Podman and the container are real.
================================================================================"""


class DemoFailed(Exception):
    """A step of the demo did not do what it should (the message says which)."""


@dataclass(frozen=True)
class Boot:
    """One boot of the demo deployment, from `dankserve status --json` and the daemon's log."""

    number: int
    seconds: float | None
    kv_cache_memory_bytes: int | None
    learned_used: bool
    compile_cache_hit: bool | None
    restored: bool = False
    """A snapshot's restore (docs/snapshots.md): no vLLM boot, so no KV sizing or compile cache."""


@dataclass(frozen=True)
class Leftovers:
    """What is still there after the demo cleaned up (all empty/False when nothing is)."""

    containers: tuple[str, ...]
    processes: tuple[str, ...]
    cdi_spec: bool
    device_nodes: bool

    @property
    def none(self) -> bool:
        return not (self.containers or self.processes or self.cdi_spec or self.device_nodes)


@dataclass
class FlowResult:
    """What the flow saw, for the summary (filled step by step; a failed run leaves gaps)."""

    steps: list[str] = field(default_factory=list)
    boots: list[Boot] = field(default_factory=list)
    restarts: int | None = None
    endpoint: str | None = None


# -- the summary (pure) ---------------------------------------------------------------------------


def format_gib(value: int | None) -> str:
    return "?" if value is None else f"{value / 2**30:.2f} GiB ({value:,} bytes)"


def boot_line(boot: Boot, label: str) -> str:
    took = "?" if boot.seconds is None else f"{boot.seconds:.1f} s"
    if boot.restored:
        return f"  boot {boot.number} ({label}): ready in {took}; restored from the snapshot taken after boot 1"
    kv = "learned, passed as --kv-cache-memory-bytes" if boot.learned_used else "profiled by vLLM, then learned"
    hit = {True: "hit", False: "miss (compiled)", None: "unknown"}[boot.compile_cache_hit]
    return (
        f"  boot {boot.number} ({label}): ready in {took}; KV cache {format_gib(boot.kv_cache_memory_bytes)}, "
        f"{kv}; compile cache {hit}"
    )


def summary_lines(result: FlowResult, leftovers: Leftovers, failure: str | None) -> list[str]:
    """The closing summary: what happened, the boot times cold vs warm, and what is left."""
    lines = [
        "",
        "=" * 80,
        " Summary of the dankserve DEMO (stand-in vLLM, recorded 2 x H200 host, no GPU used)",
        "=" * 80,
    ]
    lines += [f"  - {step}" for step in result.steps]
    if len(result.boots) >= 1:
        lines.append(boot_line(result.boots[0], "cold"))
    if len(result.boots) >= 2:
        lines.append(boot_line(result.boots[1], "warm, after the kill"))
        cold, warm = result.boots[0].seconds, result.boots[1].seconds
        if cold and warm:
            lines.append(
                f"  boot time cold vs warm: {cold:.1f} s -> {warm:.1f} s ({100 * (1 - warm / cold):.0f} % less). "
                f"The stand-in imitates a real H200 ({REAL_H200_BOOTS})."
            )
    if result.restarts is not None:
        lines.append(f"  restarts: {result.restarts}")
    if leftovers.none:
        lines.append(
            "  left running: nothing (no container, no daemon, Podman service stopped, "
            "CDI spec and device nodes removed)"
        )
    else:
        what = []
        if leftovers.containers:
            what.append(f"containers {', '.join(leftovers.containers)}")
        if leftovers.processes:
            what.append(f"processes {'; '.join(leftovers.processes)}")
        if leftovers.cdi_spec:
            what.append("the CDI spec")
        if leftovers.device_nodes:
            what.append("the stand-in device nodes")
        lines.append(f"  LEFT BEHIND: {', '.join(what)}")
    lines.append(f"  result: {'FAILED: ' + failure if failure else 'the demo ran to the end'}")
    lines.append("  On a GPU host: README.md (`make up`) and docs/OPERATIONS.md.")
    return lines


# -- talking to the CLI ---------------------------------------------------------------------------


class Cli:
    """Runs the real `dankserve` CLI (this interpreter's), echoing each command and its output."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def run(self, *args: str, show: bool = True) -> str:
        """`dankserve ARGS`; its output. A non-zero exit is a DemoFailed."""
        if show:
            say(f"$ dankserve {' '.join(args)}")
        proc = subprocess.Popen(
            [sys.executable, "-m", "dankserve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
        )
        assert proc.stdout is not None
        out = []
        for line in proc.stdout:
            out.append(line)
            if show:
                say("    " + line.rstrip("\n"))
        code = proc.wait()
        if code != 0:
            tail = "".join(out[-15:]) if not show else ""
            raise DemoFailed(f"`dankserve {' '.join(args)}` exited with {code}\n{tail}".rstrip())
        return "".join(out)

    def status(self) -> dict[str, Any]:
        """This deployment's entry of `dankserve status --json`."""
        doc = json.loads(self.run("status", "--json", show=False))
        for dep in doc["deployments"]:
            if dep["name"] == DEPLOYMENT:
                return dict(dep)
        raise DemoFailed(f"`dankserve status --json` does not list {DEPLOYMENT!r}")


def say(text: str = "") -> None:
    print(text, flush=True)


def step(text: str) -> None:
    say()
    say(f"--> {text}")


# -- the flow -------------------------------------------------------------------------------------


def ready_times(daemon_log: Path) -> list[float | None]:
    """boot_seconds of each `ready` event in the daemon's JSON log, in order."""
    times: list[float | None] = []
    with contextlib.suppress(OSError):
        for line in daemon_log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if isinstance(event, dict) and event.get("event") == "ready" and event.get("deployment") == DEPLOYMENT:
                    seconds = event.get("boot_seconds")
                    times.append(float(seconds) if isinstance(seconds, (int, float)) else None)
    return times


def boot_from(status: dict[str, Any], seconds: float | None) -> Boot:
    return Boot(
        number=int(status["boots"]),
        seconds=seconds,
        kv_cache_memory_bytes=status.get("kv_cache_memory_bytes"),
        learned_used=bool(status.get("kv_cache_learned_used")),
        compile_cache_hit=status.get("compile_cache_hit"),
        restored=(status.get("last_boot") or {}).get("kind") == "restore",
    )


def wait_until(what: str, check: Any, timeout: float) -> Any:
    """Poll check() until it returns something truthy; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise DemoFailed(f"{what}: not within {timeout:.0f} s")


def show_models(endpoint: str) -> str:
    """The model id the server lists at /v1/models (proof that it serves)."""
    with urllib.request.urlopen(f"{endpoint}/models", timeout=5) as response:
        doc = json.loads(response.read())
    return str(doc["data"][0]["id"])


def run_flow(cli: Cli, podman: Any, state_dir: Path, result: FlowResult) -> None:
    """plan -> up -> kill -> restart -> status -> down, through the real CLI."""
    from dankserve import servicectl

    step("What dankserve would run, and why (`dankserve plan`: one reason per flag)")
    cli.run("plan", DEPLOYMENT)
    result.steps.append("planned the vLLM command line for the recorded H200 host, a reason per flag")

    step("Start it (`dankserve up`): the daemon starts in the background; phases are shown live")
    cli.run("up", "--timeout", str(UP_TIMEOUT_SECONDS))
    first = cli.status()
    if first["state"] != "ready":
        raise DemoFailed(f"after `dankserve up` the deployment is {first['state']}, not ready")
    result.endpoint = str(first["endpoint"])
    say(f"    GET {result.endpoint}/models -> {show_models(result.endpoint)!r} (the stand-in answers)")
    result.boots.append(boot_from(first, None))
    result.steps.append(f"`dankserve up`: boot 1 ready at {result.endpoint} (first boot: profiled, learned)")

    container = workload_name(DEPLOYMENT)
    step(f"Kill the server's container ({container}) as a crash would")
    say(f"$ podman kill {container}")
    podman.podman("kill", container)

    def noticed() -> bool:
        reply = servicectl.daemon_request(state_dir, {"command": "status"}, timeout=5)
        if not reply or not reply.get("ok"):
            return False
        dep = next(d for d in reply["status"]["deployments"] if d["name"] == DEPLOYMENT)
        return bool(dep["state"] != "ready" or dep["boots"] > first["boots"])

    wait_until("the daemon noticing the dead container", noticed, 30)
    result.steps.append(f"killed the container ({container}); the daemon restarted it at once")

    step("The daemon restarts it with the learned KV-cache bytes; `dankserve up` follows until ready")
    cli.run("up", "--timeout", str(UP_TIMEOUT_SECONDS))
    second = cli.status()
    if second["state"] != "ready" or second["boots"] != first["boots"] + 1:
        raise DemoFailed(f"after the restart: state {second['state']}, boots {second['boots']}")
    times = ready_times(state_dir / servicectl.DAEMON_LOG)
    result.boots[0] = boot_from(first, times[0] if times else None)
    result.boots.append(boot_from(second, times[1] if len(times) > 1 else None))
    result.restarts = int(second["restarts"])
    if result.boots[1].restored:
        # Snapshots on (the default, docs/snapshots.md): the server captured after boot 1 is restored, no vLLM boot
        result.steps.append("boot 2 restored the snapshot captured after boot 1 (vLLM did not boot again)")
    else:
        if not second["kv_cache_learned_used"] or second["kv_cache_memory_bytes"] != first["kv_cache_memory_bytes"]:
            raise DemoFailed("the restart did not use the KV-cache bytes learned from the first boot")
        if second["compile_cache_hit"] is not True:
            raise DemoFailed("the restart did not hit the compile cache")
        result.steps.append("boot 2 used the learned --kv-cache-memory-bytes and hit the compile cache")

    step("What `dankserve status` says now")
    cli.run("status")

    step("Stop everything (`dankserve down`)")
    cli.run("down")
    result.steps.append("`dankserve down`: stopped the container and the daemon")


# -- set-up and clean-up --------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def demo_config(workdir: Path, podman_url: str) -> dict[str, Any]:
    """The global keys of the demo's config (the deployment is DEPLOYMENT, below)."""
    return {
        "podman_url": podman_url,
        "state_dir": str(workdir / "state"),
        "cache_dir": str(workdir / "cache"),
        "hf_cache_dir": str(workdir / "cache" / "huggingface"),
        # The stand-in image's tag (:latest) names no vLLM release: plan for the one it imitates.
        "vllm_version": "0.33.0",
        "log_format": "json",
        "stop_timeout_seconds": 10.0,
        "health_interval_seconds": 1.0,
        "boot_timeout_seconds": 300.0,
    }


def demo_deployment(image: str, port: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "image": image,
        "pull": "never",
        "port": port,
        "gpus": [0],
        "env": {
            "FAKE_VLLM_TIME_SCALE": str(TIME_SCALE),
            "FAKE_VLLM_MODEL_BYTES": str(MODEL_FACTS["parameter_bytes"]),
            "FAKE_VLLM_KV_BYTES_PER_TOKEN": "32768",
        },
        "model_facts": MODEL_FACTS,
    }


def processes_mentioning(needles: Sequence[str]) -> tuple[str, ...]:
    """Processes (not this one) whose command line mentions any of the needles."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            if any(needle in cmdline for needle in needles):
                found.append(f"{proc.pid} {cmdline[:100]}")
    return tuple(found)


def find_leftovers(podman_env: dict[str, str], workdir: Path, run_root: Path, cdi_spec: Path | None) -> Leftovers:
    """Containers in the demo's storage, processes of the demo, the CDI spec and the nodes."""
    containers: tuple[str, ...] = ()
    if podman_env:  # the set-up got as far as the Podman service
        done = subprocess.run(
            ["podman", "ps", "-a", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            env=podman_env,
            check=False,
        )
        containers = tuple(done.stdout.split()) if done.returncode == 0 else (f"(podman ps: {done.stderr.strip()})",)
    return Leftovers(
        containers=containers,
        processes=processes_mentioning([str(workdir), str(run_root)]),
        cdi_spec=cdi_spec is not None and cdi_spec.exists(),
        device_nodes=(workdir / "gpus" / "dev").exists(),
    )


def stop_daemon_and_containers(cli: Cli, state_dir: Path, podman: Any) -> None:
    """After an error: stop a daemon the demo started and remove any container it left."""
    from dankserve import servicectl

    if servicectl.daemon_pid(state_dir) is not None:
        with contextlib.suppress(DemoFailed):
            cli.run("down", show=False)
        servicectl.stop_daemon(state_dir, 30)
    names = podman.podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    if names:
        podman.podman("rm", "-f", "-t", "0", *names, check=False)


@contextlib.contextmanager
def private_workdir(keep: bool) -> Iterator[Path]:
    workdir = Path(tempfile.mkdtemp(prefix="dankserve-demo-"))  # 0700
    try:
        yield workdir
    finally:
        if keep:
            say(f"kept {workdir} (config, host file, state, daemon log, caches)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@dataclass
class Touched:
    """What the set-up made so far, so the leftover check knows where to look even after a failure."""

    podman_env: dict[str, str] = field(default_factory=dict)
    cdi_spec: Path | None = None


@contextlib.contextmanager
def demo_environment(workdir: Path, touched: Touched) -> Iterator[tuple[Cli, Any]]:
    """Stand-in GPUs, the private Podman service, the image, host file and config; all undone after."""
    from dankserve.testing import write_recorded_host
    from dankserve.testing.config_file import write_config
    from dankserve.testing.gpus import stand_in_gpus
    from dankserve.testing.podman_service import build_stand_in_image, podman_service, storage_root

    step("Setting up: stand-in GPUs, a private Podman service, the stand-in vLLM image")
    with contextlib.ExitStack() as stack:
        gpus = stack.enter_context(stand_in_gpus(workdir / "gpus", count=2, prefix=CDI_PREFIX))
        touched.cdi_spec = gpus.cdi_spec
        say(f"    stand-in GPU nodes in {gpus.dev_dir}; CDI spec {gpus.cdi_spec}")
        podman = stack.enter_context(podman_service(workdir / "podman", purpose=PURPOSE))
        touched.podman_env = dict(podman.env)
        say(f"    private Podman service at {podman.url} (storage {storage_root(PURPOSE)})")
        image = build_stand_in_image(podman)
        port = free_port()
        host_file = write_recorded_host(workdir / "host.json", uuids=[g.uuid for g in gpus.gpus])
        config = write_config(
            workdir / "dankserve.toml", demo_config(workdir, podman.url), {DEPLOYMENT: demo_deployment(image, port)}
        )
        env = {**os.environ, "DANKSERVE_CONFIG": str(config), "DANKSERVE_HARDWARE": str(host_file)}
        env.pop("NOTIFY_SOCKET", None)
        cli = Cli(env)
        stack.callback(stop_daemon_and_containers, cli, workdir / "state", podman)
        say(f"    config {config}; recorded host {host_file} (2 x H200, stand-in GPU UUIDs)")
        say("    every command below runs with DANKSERVE_CONFIG and DANKSERVE_HARDWARE pointing there")
        yield cli, podman


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when it ran to the end and left nothing behind."""
    parser = argparse.ArgumentParser(prog="python -m dankserve.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="keep the private directory (config, state, logs)")
    args = parser.parse_args(argv)
    from dankserve.testing.podman_service import missing_requirements, run_root, storage_root

    say(BANNER)
    missing = missing_requirements(DEMO_TOOLS)
    if missing:
        say(f"error: the demo cannot run here: missing {', '.join(missing)}")
        say("  fix: run `make demo` as root on Debian 12 (it installs podman, runc, conmon and mmdebstrap)")
        return 3
    signal.signal(signal.SIGTERM, _interrupt)
    result = FlowResult()
    failure: str | None = None
    touched = Touched()
    with private_workdir(args.keep) as workdir:
        try:
            with demo_environment(workdir, touched) as (cli, podman):
                run_flow(cli, podman, workdir / "state", result)
        except DemoFailed as exc:
            failure = str(exc)
        except KeyboardInterrupt:
            failure = "interrupted"
        except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
            failure = f"{type(exc).__name__}: {exc}"
        leftovers = find_leftovers(
            touched.podman_env, workdir, run_root(storage_root(PURPOSE), PURPOSE), touched.cdi_spec
        )
        for line in summary_lines(result, leftovers, failure):
            say(line)
    return 0 if failure is None and leftovers.none else 1


if __name__ == "__main__":
    sys.exit(main())
