"""`dankserve plan` through the real CLI (a subprocess) for vLLM 0.26, 0.33 and 0.34 (issue 42): removed flags and
variables are refused naming the release and the replacement (exit 2); the plans say what each release changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dankserve.exitcodes import ExitCode
from dankserve.testing import HOSTS_DIR
from dankserve.testing.config_file import write_config
from tests.harness.daemon import MODEL_FACTS

HOST = HOSTS_DIR / "h200x2-vm-real.json"


def plan(tmp_path: Path, deployments: dict[str, dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    globals_ = {
        "state_dir": str(tmp_path / "state"),
        "cache_dir": str(tmp_path / "cache"),
        "hf_cache_dir": str(tmp_path / "hf"),
        "gateway": {"listen": "127.0.0.1:9000", "queue_size": 32},
    }
    config = write_config(tmp_path / "dankserve.toml", globals_, deployments)
    env = {k: v for k, v in os.environ.items() if k not in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE")}
    argv = [sys.executable, "-m", "dankserve", "--config", str(config), "plan", "--json", "--hardware", str(HOST)]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def deployment(version: str, port: int, **extra: Any) -> dict[str, Any]:
    image = f"docker.io/vllm/vllm-openai:v{version}"
    return {
        "model": "test/tiny",
        "served_model_name": f"tiny-{port}",
        "image": image,
        "model_facts": MODEL_FACTS,
        "port": port,
        "gpus": [0],
        "gpu_memory_utilization": 0.3,
        **extra,
    }


def test_three_releases_planned_side_by_side(tmp_path: Path) -> None:
    deployments = {"v026": deployment("0.26.0", 8000), "v033": deployment("0.33.0", 8001)}
    deployments["v034"] = deployment("0.34.0", 8002)
    done = plan(tmp_path, deployments)
    assert done.returncode == ExitCode.OK, done.stderr
    plans = {p["deployment"]: p for p in json.loads(done.stdout)}
    assert (
        "--max-num-queued-reqs" not in plans["v026"]["argv"]
        and [n for n in plans["v026"]["notes"] if not n.startswith(("launcher:", "/dev/shm:"))] == []
    )
    for name in ("v033", "v034"):
        argv = plans[name]["argv"]
        seqs = int(argv[argv.index("--max-num-seqs") + 1])
        assert int(argv[argv.index("--max-num-queued-reqs") + 1]) == seqs + 32
        assert any("vllm download-kernels" in note for note in plans[name]["notes"])
    assert not any("extensible" in note for note in plans["v033"]["notes"])
    assert any("extensible KV cache" in note for note in plans["v034"]["notes"])


def test_a_removed_flag_and_variable_are_refused_naming_release_and_replacement(tmp_path: Path) -> None:
    extra = {"extra_args": ["--calculate-kv-scales"], "env": {"VLLM_ENGINE_ITERATION_TIMEOUT_S": "60"}}
    done = plan(tmp_path, {"a": deployment("0.33.0", 8000, **extra)})
    assert done.returncode == ExitCode.INVALID_INPUT, done.stdout + done.stderr
    assert "extra_args --calculate-kv-scales: vLLM 0.28.0 removed it (the image runs 0.33.0)" in done.stderr
    assert "env VLLM_ENGINE_ITERATION_TIMEOUT_S: vLLM 0.32.0 removed it" in done.stderr
    assert "the checkpoint's own k/v scales" in done.stderr
    assert "Traceback" not in done.stderr
    still = plan(tmp_path, {"a": deployment("0.26.0", 8000, **extra)})  # 0.26 still has both
    assert still.returncode == ExitCode.OK, still.stderr
