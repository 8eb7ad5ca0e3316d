"""Tests for dankserve.cluster.ray_node and the stand-in's leader mode against a real Ray head."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.cluster.ray_node import RayNode, head_command, ray_executable, ray_temp_dir, worker_command
from tests.harness.daemon import REPO, STAND_IN, free_port


def test_head_and_worker_commands() -> None:
    """The head declares its GPUs and port; a worker joins the head's address from its own node address."""
    head = head_command("ray", "10.0.0.1", 6379, 4, Path("/t"))
    assert head[:3] == ["ray", "start", "--head"]
    assert {"--port=6379", "--num-gpus=4", "--node-ip-address=10.0.0.1", "--block", "--temp-dir=/t"} <= set(head)
    worker = worker_command("ray", "10.0.0.1:6379", "10.0.0.2", 4, Path("/t"))
    assert {"--address=10.0.0.1:6379", "--node-ip-address=10.0.0.2", "--num-gpus=4"} <= set(worker)
    assert "--head" not in worker


def test_temp_dir_is_short_and_per_daemon(tmp_path: Path) -> None:
    """Ray's temp dir stays short (AF_UNIX paths) and differs between daemons' state dirs."""
    one, two = ray_temp_dir(tmp_path / ("a" * 40)), ray_temp_dir(tmp_path / "b")
    assert one != two
    assert len(str(one)) < 40


def test_node_start_stop_and_alive(tmp_path: Path) -> None:
    """A node's process group is remembered, seen alive, and gone (record removed) after stop."""
    node = RayNode(tmp_path, "head-x")
    pid = node.start([sys.executable, "-c", "import time; time.sleep(60)"])
    assert node.alive() and node.pid() == pid
    RayNode(tmp_path, "head-x").stop(timeout=5)  # as a restarted daemon would
    assert not node.alive()
    assert not (tmp_path / "head-x.json").exists()


@pytest.mark.slow
def test_stand_in_fails_like_vllm_when_too_few_gpus(tmp_path: Path) -> None:
    """The stand-in in leader mode asks Ray for TP x PP GPUs and, with too few, exits with vLLM's message."""
    pytest.importorskip("ray")
    port = free_port()
    ray = ray_executable(None)
    node = RayNode(tmp_path, "head")
    node.start(head_command(ray, "127.0.0.1", port, 1, ray_temp_dir(tmp_path)))
    try:
        env = {
            **os.environ,
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            "FAKE_VLLM_PG_WAIT_SECONDS": "3",
            "FAKE_VLLM_TIME_SCALE": "0.02",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }
        argv = [sys.executable, str(STAND_IN), "serve", "test/tiny", "--port", str(free_port())]
        argv += [
            "--tensor-parallel-size",
            "1",
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=120, check=False)
    finally:
        node.stop()
        shutil.rmtree(ray_temp_dir(tmp_path), ignore_errors=True)
    assert done.returncode == 1
    assert "Cannot provide a placement group of placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}]" in done.stderr
    assert "See `ray status` to make sure the cluster has enough resources." in done.stderr
