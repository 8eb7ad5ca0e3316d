"""A rehearsal of the H200 launcher bench on a machine without a GPU, before device time is spent.

Runs bench/real_vllm/launcher.py with the stand-in vLLM (containers/) in place of real vLLM, on
either runtime, through the same code paths as on the GPU machine: the daemon, the launcher, the
kills, `down`/`up`, reloads, the greedy comparison and the manual boots by hand. The figures mean
nothing (the stand-in sleeps a scaled boot); what a rehearsal finds is a bench bug, the kind that
otherwise costs a lease. Needs root for the podman runtime (stand-in GPU device nodes, a CDI spec
in /etc/cdi, rootful Podman with the stand-in image: `make fake-vllm-image`).

    .venv/bin/python bench/real_vllm/rehearse.py podman [STEPS] [launcher.py options]
    .venv/bin/python bench/real_vllm/rehearse.py process cold,greedy
    REHEARSE_MODEL=qwen3-8b .venv/bin/python bench/real_vllm/rehearse.py process \
        cold,launcher-kill,launcher-down-up,manual-best,summary --requests   (issue 28's run)
    .venv/bin/python bench/real_vllm/rehearse.py swap --swaps 4 --modes level1,level2mt   (swap.py, 8B + 14B)
    .venv/bin/python bench/real_vllm/rehearse.py upgrade [--rooms sleep,stop]   (upgrade.py --stand-in, as root)
    .venv/bin/python bench/real_vllm/rehearse.py snapshot [STEPS]   (snapshot_daemon.py: issue 41 through the
        daemon, the stand-in's 8B shape, real CRIU, as root)

STEPS defaults to `all`. The work directory is a fresh temporary one; its results (launcher.json),
logs and the daemon's log stay there and are named at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dankserve.testing import write_recorded_host
from dankserve.testing.gpus import stand_in_gpus

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "containers" / "fake-vllm"
IMAGE = os.environ.get("FAKE_VLLM_IMAGE", "localhost/fake-vllm:latest")
SOCKET = "/run/podman/podman.sock"  # the daemon's default podman_url, as on the GPU machine
TIME_SCALE = "0.05"
IMPORT_SECONDS = "1.74"  # vLLM's 17.4 s import on the H200, scaled as bench/launcher_restart.py does
FIRST_REQUEST_SECONDS = "0.05"  # the first request's kernel compile (0.7 s after the H200 cold boot), scaled by hand
# The tinyllama test model's shape: the planner reads config.json from the model's directory.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}
# Issue 28's shapes (REHEARSE_MODEL=qwen3-8b|qwen3-14b), as make_qwen3.py builds them on the GPU machine.
QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
MODEL_CONFIGS = {
    "tinyllama": MODEL_CONFIG,
    "qwen3-8b": {
        **QWEN3,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
    },
    "qwen3-14b": {
        **QWEN3,
        "hidden_size": 5120,
        "intermediate_size": 17408,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
    },
}


def podman_service(env: dict[str, str], log: Path) -> subprocess.Popen[bytes] | None:
    """A `podman system service` on the default socket, unless one answers there already."""
    answered = subprocess.run(
        ["podman", "--url", f"unix://{SOCKET}", "info"], env=env, capture_output=True, check=False
    )
    if answered.returncode == 0:
        return None
    Path(SOCKET).parent.mkdir(parents=True, exist_ok=True)
    argv = ["podman", "system", "service", "--time=0", f"unix://{SOCKET}"]
    service = subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not Path(SOCKET).exists():
        if time.monotonic() > deadline or service.poll() is not None:
            raise SystemExit(f"the Podman service did not start; see {log}")
        time.sleep(0.1)
    return service


def rehearse_swap(rest: list[str]) -> int:
    """bench/real_vllm/swap.py REST against the stand-in: two Qwen3-shaped members (8B, 14B) in one swap group."""
    work = Path(tempfile.mkdtemp(prefix="rehearse-swap-", dir="/var/tmp"))
    env = {**os.environ, "SWAP_WORK": str(work), "SWAP_PYTHON": str(STAND_IN / "vllm.py")}
    env |= {"FAKE_VLLM_TIME_SCALE": TIME_SCALE, "FAKE_VLLM_FIRST_REQUEST_SECONDS": FIRST_REQUEST_SECONDS}
    # Mode stoplauncher: the launcher imports the stand-in's CLI where it would import vLLM's.
    launcher = {"DANKSERVE_LAUNCHER_ENTRY": "fake_vllm.cli:main", "DANKSERVE_LAUNCHER_PRELOAD": "fake_vllm.cli"}
    jit = {"FAKE_VLLM_FIRST_REQUEST_SECONDS": FIRST_REQUEST_SECONDS}  # the daemon passes a member its own env
    env["SWAP_MEMBER_ENV"] = json.dumps({**launcher, **jit, "DANKSERVE_LAUNCHER_PATH": str(STAND_IN)})
    for key, shape in (("SWAP_MODEL_A", "qwen3-8b"), ("SWAP_MODEL_B", "qwen3-14b")):
        model = work / "models" / shape
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(MODEL_CONFIGS[shape]))
        env[key] = str(model)
    with stand_in_gpus(work, count=1, prefix="dankserve-rehearse-") as gpus:
        host = write_recorded_host(work / "host.json", "h200x1-vm", [gpu.uuid for gpu in gpus.gpus])
        env["DANKSERVE_HARDWARE"] = str(host)
        argv = [sys.executable, str(REPO / "bench" / "real_vllm" / "swap.py"), "--out", str(work / "out"), *rest]
        code = subprocess.run(argv, env=env, check=False).returncode
    print(f"rehearsal {'passed' if code == 0 else f'FAILED (exit {code})'}: results and logs in {work}")
    return code


def upgrade_knobs() -> dict[str, str]:
    """The stand-in's knobs for upgrade.py --stand-in (the deployment's env): scaled boots, and streamed
    tokens spaced out so the upgrade's fixed request has a decode rate to compare."""
    return {
        "FAKE_VLLM_TIME_SCALE": TIME_SCALE,
        "FAKE_VLLM_FIRST_REQUEST_SECONDS": FIRST_REQUEST_SECONDS,
        "FAKE_VLLM_TOKEN_SECONDS": "0.01",
    }


def rehearse_upgrade(rest: list[str]) -> int:
    """bench/real_vllm/upgrade.py --stand-in REST: the stand-in image and a copy of it differing by one label,
    on rootful Podman (the default socket, as on the GPU machine), stand-in GPUs and the recorded H200 host."""
    work = Path(tempfile.mkdtemp(prefix="rehearse-upgrade-", dir="/var/tmp"))
    env = {**os.environ, "UPGRADE_WORK": str(work)}
    env.setdefault("CONTAINERS_CONF", str(REPO / "build" / "fake-vllm" / "containers.conf"))
    with stand_in_gpus(work, count=1, prefix="dankserve-rehearse-") as gpus:
        host = write_recorded_host(work / "host.json", "h200x1-vm", [gpu.uuid for gpu in gpus.gpus])
        env["DANKSERVE_HARDWARE"] = str(host)
        service = podman_service(env, work / "podman-service.log")
        try:
            argv = [sys.executable, str(REPO / "bench" / "real_vllm" / "upgrade.py"), "--stand-in"]
            code = subprocess.run([*argv, "--out", str(work / "out"), *rest], env=env, check=False).returncode
        finally:
            if service is not None:
                service.terminate()
                service.wait(30)
    print(f"rehearsal {'passed' if code == 0 else f'FAILED (exit {code})'}: results and logs in {work}")
    return code


def rehearse_snapshot(rest: list[str]) -> int:
    """bench/real_vllm/snapshot_daemon.py REST against the stand-in as the process runtime's executable (its
    8B Qwen3 shape), a recorded H200 host with stand-in GPUs (their GPU checkpoint is the stand-in's) and
    the real CRIU on PATH."""
    work = Path(tempfile.mkdtemp(prefix="rehearse-snapshot-", dir="/var/tmp"))
    model = work / "models" / "q8b"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIGS["qwen3-8b"]))
    with stand_in_gpus(work, count=1, prefix="dankserve-rehearse-") as gpus:
        host = write_recorded_host(work / "host.json", "h200x1-vm", [gpu.uuid for gpu in gpus.gpus])
        (work / "host.json.processes").mkdir(exist_ok=True)
        knobs = {"FAKE_VLLM_TIME_SCALE": "0.2", "FAKE_VLLM_NVML_DIR": f"{host}.processes"}
        env = {**os.environ, "DANKSERVE_HARDWARE": str(host), "SNAPD_WORK": str(work / "snapd")}
        env |= {"SNAPD_MODEL": str(model), "SNAPD_LABEL": "8b", "SNAPD_EXECUTABLE": str(STAND_IN / "vllm.py")}
        env |= {"SNAPD_EXTRA_ENV": json.dumps(knobs), "OUT": str(work / "out")}
        (work / "out").mkdir()
        argv = [sys.executable, str(REPO / "bench" / "real_vllm" / "snapshot_daemon.py"), *rest]
        code = subprocess.run(argv, env=env, check=False).returncode
    print(f"rehearsal {'passed' if code == 0 else f'FAILED (exit {code})'}: results and logs in {work}")
    return code


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "snapshot":
        return rehearse_snapshot(sys.argv[2:])
    if len(sys.argv) >= 2 and sys.argv[1] == "swap":
        return rehearse_swap(sys.argv[2:])
    if len(sys.argv) >= 2 and sys.argv[1] == "upgrade":
        return rehearse_upgrade(sys.argv[2:])
    if len(sys.argv) < 2 or sys.argv[1] not in ("process", "podman"):
        print(__doc__, file=sys.stderr)
        return 2
    runtime, steps, rest = sys.argv[1], (sys.argv[2:3] or ["all"])[0], sys.argv[3:]
    work = Path(tempfile.mkdtemp(prefix=f"rehearse-{runtime}-", dir="/var/tmp"))
    shape = os.environ.get("REHEARSE_MODEL", "tinyllama")
    model = work / "hf" / shape
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(MODEL_CONFIGS[shape]))
    knobs = {"FAKE_VLLM_TIME_SCALE": TIME_SCALE, "FAKE_VLLM_IMPORT_SECONDS": IMPORT_SECONDS}
    knobs["FAKE_VLLM_FIRST_REQUEST_SECONDS"] = FIRST_REQUEST_SECONDS
    knobs["DANKSERVE_LAUNCHER_ENTRY"] = "fake_vllm.cli:main"
    knobs["DANKSERVE_LAUNCHER_PRELOAD"] = "fake_vllm.cli"
    env = {
        **os.environ,
        "PROOF_WORK": str(work),
        "PROOF_RUNTIME": runtime,
        "PROOF_MODEL": str(model),
        "LAUNCHER_RESULTS": str(work / "launcher.json"),
        **knobs,
    }
    if runtime == "process":
        env["PROOF_VLLM_EXECUTABLE"] = str(STAND_IN / "vllm.py")
        env["DANKSERVE_LAUNCHER_PATH"] = str(STAND_IN)
    else:
        env["PROOF_IMAGE"] = IMAGE
        env["PROOF_EXTRA_ENV"] = json.dumps(knobs)  # the image's own PYTHONPATH finds the stand-in
        env.setdefault("CONTAINERS_CONF", str(REPO / "build" / "fake-vllm" / "containers.conf"))
    with stand_in_gpus(work, count=1, prefix="dankserve-rehearse-") as gpus:
        host = write_recorded_host(work / "host.json", "h200x1-vm", [gpu.uuid for gpu in gpus.gpus])
        env["DANKSERVE_HARDWARE"] = str(host)
        service = podman_service(env, work / "podman-service.log") if runtime == "podman" else None
        try:
            argv = [sys.executable, str(REPO / "bench" / "real_vllm" / "launcher.py"), steps, *rest]
            code = subprocess.run(argv, env=env, check=False).returncode
        finally:
            subprocess.run(
                [sys.executable, str(REPO / "bench" / "real_vllm" / "launcher.py"), "stop"], env=env, check=False
            )
            if service is not None:
                service.terminate()
                service.wait(30)
    print(f"rehearsal {'passed' if code == 0 else f'FAILED (exit {code})'}: results and logs in {work}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
