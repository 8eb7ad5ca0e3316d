"""`dankserve doctor` through the real CLI (a subprocess): the recorded host it suggests is accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.testing import HOSTS_DIR
from dankserve.testing.config_file import write_config

REPO = Path(__file__).resolve().parents[2]
HOST = HOSTS_DIR / "h200x2-vm-real.json"


def doctor(config: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE")}
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "--config", str(config), "doctor", "--json", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
        check=False,
    )


def test_doctor_reads_the_recorded_host_of_hardware_or_dankserve_hardware(tmp_path: Path) -> None:
    """`doctor --hardware FILE` and DANKSERVE_HARDWARE=FILE check the recorded host instead of the driver (the
    fix doctor prints without a GPU suggests exactly these); a process deployment needs no Podman: exit 0."""
    globals_ = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)}
    config = write_config(tmp_path / "dankserve.toml", globals_, {"a": {"model": "o/m", "runtime": "process"}})
    for done in (doctor(config, "--hardware", str(HOST)), doctor(config, env={"DANKSERVE_HARDWARE": str(HOST)})):
        assert done.returncode == 0, done.stdout + done.stderr
        checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
        assert checks["recorded host"]["verdict"] == "ok" and str(HOST) in checks["recorded host"]["detail"]
        assert "nvidia driver" not in checks and "device nodes" not in checks


def test_doctor_with_a_broken_recorded_host_fails_naming_the_file(tmp_path: Path) -> None:
    """A --hardware file that is not a recorded host is a failed check naming the file: exit 3."""
    globals_ = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)}
    config = write_config(tmp_path / "dankserve.toml", globals_, {"a": {"model": "o/m", "runtime": "process"}})
    broken = tmp_path / "host.json"
    broken.write_text("{not json")
    done = doctor(config, "--hardware", str(broken))
    assert done.returncode == 3
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert checks["recorded host"]["verdict"] == "fail" and str(broken) in checks["recorded host"]["detail"]


def test_doctor_names_the_kernels_a_start_would_fetch(tmp_path: Path) -> None:
    """A container deployment whose vLLM has `vllm download-kernels` (0.32+) and no kept kernels: doctor names
    the ones its start would fetch and the fix; kept ones pass; a 0.26 image has nothing to check (issue 42)."""
    globals_ = {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache"),
        "hf_cache_dir": str(tmp_path),
        "podman_url": f"unix://{tmp_path}/no-podman.sock",
    }
    deployments: dict[str, dict[str, object]] = {
        "new": {"model": "o/m", "image": "docker.io/vllm/vllm-openai:v0.34.0"},
        "old": {"model": "o/m", "image": "docker.io/vllm/vllm-openai:v0.26.0", "port": 8001},
    }
    config = write_config(tmp_path / "dankserve.toml", globals_, deployments)
    checks = {c["name"]: c for c in json.loads(doctor(config, "--hardware", str(HOST)).stdout)["checks"]}
    kernels = checks["kernels for new"]
    assert kernels["verdict"] == "warn"
    assert "vLLM 0.34.0 would fetch flashinfer-cubin, flashinfer-jit-cache at start" in kernels["detail"]
    kept = tmp_path / "cache" / "deployments" / "new" / "vllm" / "kernels" / "0.34.0"
    assert f"PIP_TARGET={kept} vllm download-kernels" in kernels["fix"]
    assert "kernels for old" not in checks
    for package in ("flashinfer_cubin", "flashinfer_jit_cache"):
        (kept / package).mkdir(parents=True)
    checks = {c["name"]: c for c in json.loads(doctor(config, "--hardware", str(HOST)).stdout)["checks"]}
    assert checks["kernels for new"]["verdict"] == "ok"


def test_doctor_warns_when_a_podman_deployment_has_no_gpu_device_on_this_host(tmp_path: Path) -> None:
    """Issue 39.8: with a recorded host (`--hardware`) doctor used to say all ok while `up` failed for want of a
    device: a Podman deployment whose GPU has no CDI entry and no device node here is a warning naming the GPU
    and the fix (`make try-it-podman` to try without a GPU); a process deployment is not checked."""
    globals_ = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)}
    deployments: dict[str, dict[str, object]] = {
        "chat": {"model": "o/m", "gpus": [1]},
        "local": {"model": "o/m", "runtime": "process", "port": 8001},
    }
    config = write_config(tmp_path / "dankserve.toml", globals_, deployments)
    done = doctor(config, "--hardware", str(HOST))
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    uuid = json.loads(HOST.read_text())["gpus"][1]["uuid"]
    devices = checks["GPU devices for chat"]
    if Path("/dev/nvidia1").exists():
        pytest.skip("this machine has a GPU 1 device node")
    assert devices["verdict"] == "warn", devices
    assert (
        f"GPU 1 ({uuid}) has no CDI entry" in devices["detail"]
        and "`dankserve up chat` would fail" in devices["detail"]
    )
    assert "make try-it-podman" in devices["fix"] and "nvidia-ctk cdi generate" in devices["fix"]
    assert "GPU devices for local" not in checks


def test_doctor_says_where_it_read_the_free_space_of_a_missing_dir_and_how_to_run_podman_without_systemd(
    tmp_path: Path,
) -> None:
    """Issue 39 (low): a cache dir that does not exist yet is read on the nearest existing dir, and the line says
    so; where no systemd runs, the Podman fix is `podman system service`, not `systemctl enable podman.socket`."""
    missing = tmp_path / "not" / "yet"
    globals_ = {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(missing),
        "hf_cache_dir": str(tmp_path),
        "podman_url": f"unix://{tmp_path}/no-podman.sock",
    }
    config = write_config(tmp_path / "dankserve.toml", globals_, {"chat": {"model": "o/m"}})
    done = doctor(config, "--hardware", str(HOST))
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    disk = checks[f"disk {missing}"]
    assert f"free on {tmp_path} (the directory does not exist yet" in disk["detail"], disk
    assert "does not exist" not in checks[f"disk {tmp_path}"]["detail"]
    podman = checks["podman"]
    assert podman["verdict"] == "fail"
    if Path("/run/systemd/system").is_dir():
        assert "systemctl" in podman["fix"]
    else:
        assert f"podman system service --time=0 unix://{tmp_path}/no-podman.sock" in podman["fix"], podman
        assert "systemctl" not in podman["fix"]


def _cuda_package(root: Path, *, bindings: bool) -> Path:
    """A `cuda` package first on the path: a regular package hides an installed namespace `cuda`, so without
    `bindings/` cuda-bindings is missing whatever this host has (the import system is the seam)."""
    (root / "cuda").mkdir(parents=True, exist_ok=True)
    (root / "cuda" / "__init__.py").write_text("")
    if bindings:
        (root / "cuda" / "bindings").mkdir(exist_ok=True)
        (root / "cuda" / "bindings" / "__init__.py").write_text("raise ImportError('found, never imported')\n")
    return root


def test_doctor_says_snapshots_are_off_without_cuda_bindings_and_the_fix(tmp_path: Path) -> None:
    """On a real GPU host (no --hardware: the driver's checkpoint edge) without cuda-bindings the snapshots check
    says off, the reason and `pip install 'dankserve[snapshot]'`, found without importing CUDA; with them found,
    or with a recorded host (the stand-in's edge), it does not mention them (issue 41)."""
    globals_ = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path), "hf_cache_dir": str(tmp_path)}
    config = write_config(tmp_path / "dankserve.toml", globals_, {"a": {"model": "o/m", "runtime": "process"}})

    def snapshots(*args: str, bindings: bool) -> dict[str, str]:
        shadow = _cuda_package(tmp_path / ("with" if bindings else "without"), bindings=bindings)
        path = os.pathsep.join([str(shadow), str(REPO), os.environ.get("PYTHONPATH", "")])
        done = doctor(config, *args, env={"PYTHONPATH": path})
        check: dict[str, str] = {c["name"]: c for c in json.loads(done.stdout)["checks"]}["snapshots"]
        return check

    missing = snapshots(bindings=False)
    assert missing["verdict"] == "warn" and "cuda-bindings is not installed" in missing["detail"], missing
    assert "pip install 'dankserve[snapshot]'" in (missing["fix"] or "")
    assert "cuda-bindings" not in snapshots(bindings=True)["detail"]
    assert "cuda-bindings" not in snapshots("--hardware", str(HOST), bindings=False)["detail"]
