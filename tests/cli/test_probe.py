"""Tests for `dankserve probe`, run as a real process so exit codes and stderr are what users see.

No hypothesis here: the GPU machine runs this file with only pytest installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.host.recorded import host_to_json
from dankserve.testing import recorded_host, recorded_host_path
from tests.harness.gpus import nvml_unusable_reason

REPO = Path(__file__).resolve().parents[2]


def dankserve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m dankserve ARGS` from the repository with a clean dankserve environment."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "dankserve", *args],
        check=False,
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO,
        timeout=120,
    )


def test_json_prints_the_recorded_host() -> None:
    """`probe --json --hardware FILE` prints the file's host in the recorded-host format and exits 0."""
    done = dankserve("probe", "--json", "--hardware", str(recorded_host_path("h100x8-2numa")))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == host_to_json(recorded_host("h100x8-2numa"))


def test_text_output_lists_gpus_cpus_numa_and_disks() -> None:
    """The text output is a GPU table plus CPU, RAM, NUMA and disk lines, bus ids unmangled."""
    done = dankserve("probe", "--hardware", str(recorded_host_path("h100x4-2numa")))
    assert done.returncode == 0, done.stderr
    for text in (
        "NVIDIA H100 80GB HBM3",
        "00000000:AB:00.0",
        "CPU: 64 physical cores, 128 logical",
        "NUMA node 1: CPUs 32-63,96-127",
        "disk /var/cache/dankserve",
        "GPU-ecaf348c-6ec9-4412-bd91-36a90baafe8b",
    ):
        assert text in done.stdout


def test_text_output_shows_the_links_matrix() -> None:
    """The text output ends with the links between GPUs laid out like `nvidia-smi topo -m`."""
    done = dankserve("probe", "--hardware", str(recorded_host_path("rtx4090x4-1numa")))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("links between GPUs"))
    assert [line.split() for line in lines[start + 1 : start + 6]] == [
        ["GPU0", "GPU1", "GPU2", "GPU3", "NUMA"],
        ["GPU0", "X", "PXB", "NODE", "NODE", "0"],
        ["GPU1", "PXB", "X", "NODE", "NODE", "0"],
        ["GPU2", "NODE", "NODE", "X", "PXB", "0"],
        ["GPU3", "NODE", "NODE", "PXB", "X", "0"],
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [("h200x2-vm-real", ["GPU0", "X", "NV18", "-"]), ("h100x4-2numa", None), ("h200x1-vm", None)],
)
def test_links_matrix(name: str, expected: list[str] | None) -> None:
    """NVLink pairs read NV#; a host without recorded links says so; one GPU shows no matrix."""
    from dankserve.cli.probe import links_matrix

    lines = links_matrix(recorded_host(name))
    if name == "h100x4-2numa":
        assert lines == ["links between GPUs: not recorded"]
    elif expected is None:
        assert lines == []
    else:
        assert lines[2].split() == expected


def test_environment_variable_names_the_file() -> None:
    """$DANKSERVE_HARDWARE is read when --hardware is not given."""
    done = dankserve("probe", "--json", env={"DANKSERVE_HARDWARE": str(recorded_host_path("a100-80x2-mig"))})
    assert done.returncode == 0, done.stderr
    assert [gpu["mig_mode"] for gpu in json.loads(done.stdout)["gpus"]] == [True, True]


def test_recorded_host_needs_no_settings(tmp_path: Path) -> None:
    """With a recorded host the settings are not read, so a broken config file does not matter."""
    config = tmp_path / "broken.toml"
    config.write_text("this is = = not toml")
    done = dankserve("--config", str(config), "probe", "--json", "--hardware", str(recorded_host_path("h200x1-vm")))
    assert done.returncode == 0, done.stderr


def test_save_writes_the_host(tmp_path: Path) -> None:
    """--save writes the recorded-host JSON that --hardware reads back."""
    target = tmp_path / "saved.json"
    done = dankserve("probe", "--hardware", str(recorded_host_path("rtx3090x1-4core")), "--save", str(target))
    assert done.returncode == 0, done.stderr
    assert f"saved the host description to {target}" in done.stderr
    again = dankserve("probe", "--json", "--hardware", str(target))
    assert json.loads(again.stdout) == host_to_json(recorded_host("rtx3090x1-4core"))


def test_malformed_file_exits_2_naming_file_and_field(tmp_path: Path) -> None:
    """A malformed recorded host exits 2 with the file, the field and the problem, and no traceback."""
    data = host_to_json(recorded_host("h200x1-vm"))
    data["gpus"][0]["compute_capability"] = "nine"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    done = dankserve("probe", "--hardware", str(path))
    assert done.returncode == 2
    assert f"hardware file {path}" in done.stderr
    assert "gpus.0.compute_capability = 'nine'" in done.stderr
    assert "fix:" in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_file_exits_2(tmp_path: Path) -> None:
    """A --hardware file that does not exist exits 2 naming it."""
    done = dankserve("probe", "--hardware", str(tmp_path / "absent.json"))
    assert done.returncode == 2
    assert "does not exist" in done.stderr


def test_save_into_missing_directory_exits_2(tmp_path: Path) -> None:
    """--save into a directory that does not exist exits 2 naming the file."""
    target = tmp_path / "no" / "host.json"
    done = dankserve("probe", "--hardware", str(recorded_host_path("h200x1-vm")), "--save", str(target))
    assert done.returncode == 2
    assert f"cannot write hardware file {target}" in done.stderr


@pytest.mark.skipif(nvml_unusable_reason() is None, reason="NVML works here")
def test_probe_without_gpu_exits_3(tmp_path: Path) -> None:
    """Probing a machine without an NVIDIA driver exits 3, saying what was looked for and how to go on."""
    done = dankserve("probe", env={"DANKSERVE_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 3, done.stderr
    assert "no usable NVIDIA GPU" in done.stderr
    assert "libnvidia-ml.so.1" in done.stderr and "/dev/nvidia*" in done.stderr
    assert "--hardware" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith("GPUs: none usable (below)")  # this machine's other facts: issue 39
    assert dankserve("probe", "--json", env={"DANKSERVE_CACHE_DIR": str(tmp_path)}).stdout == ""


@pytest.mark.gpu
def test_probe_json_on_real_gpus(tmp_path: Path) -> None:
    """On a GPU host `probe --json` exits 0 and lists the GPUs NVML sees, saved output matching."""
    import pynvml

    target = tmp_path / "host.json"
    done = dankserve(
        "probe",
        "--json",
        "--save",
        str(target),
        env={
            "DANKSERVE_STATE_DIR": str(tmp_path),
            "DANKSERVE_CACHE_DIR": str(tmp_path),
            "DANKSERVE_HF_CACHE_DIR": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    assert len(printed["gpus"]) == count
    assert json.loads(target.read_text()) == printed


def test_probe_without_a_gpu_still_prints_this_machines_cpus_memory_and_disks_then_the_error(tmp_path: Path) -> None:
    """Issue 39 (low): with no usable GPU `probe` printed nothing but the error; now the CPU, RAM, NUMA and disk
    lines come first, then the error and its fix (exit 3)."""
    if nvml_unusable_reason() is None:
        pytest.skip("NVML works here: the GPUs are probed")
    config = tmp_path / "dankserve.toml"
    config.write_text(f'state_dir = "{tmp_path}/state"\ncache_dir = "{tmp_path}/cache"\nhf_cache_dir = "{tmp_path}"\n')
    config.chmod(0o600)
    done = dankserve("--config", str(config), "probe")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith("GPUs: none usable (below)\nCPU: ") and "\nRAM: " in done.stdout
    assert f"disk {tmp_path}/cache: " in done.stdout
    assert "error: no usable NVIDIA GPU" in done.stderr and "--hardware FILE" in done.stderr


def test_probe_of_a_recorded_host_says_so_first() -> None:
    """Issue 39 (low): `probe --hardware FILE` (or DANKSERVE_HARDWARE) says on its first line that the host is the
    file's, not this machine's; --json stays the file's JSON alone."""
    path = recorded_host_path("rtx3090x1-4core")
    for done in (
        dankserve("probe", "--hardware", str(path)),
        dankserve("probe", env={"DANKSERVE_HARDWARE": str(path)}),
    ):
        assert done.returncode == 0, done.stderr
        first = done.stdout.splitlines()[0]
        assert first.startswith(f"recorded host {path} (") and "not this machine" in first
    as_json = dankserve("probe", "--json", "--hardware", str(path))
    assert json.loads(as_json.stdout)["gpus"]
