"""Tests for the launcher's container: what Podman is asked to create, and what the launcher is asked to start."""

from __future__ import annotations

from pathlib import Path

from dankserve.runtime.base import (
    CONTAINER_LAUNCHER_DIR,
    CONTAINER_LAUNCHER_RUN,
    LABEL_CONTAINER_FINGERPRINT,
    LABEL_LAUNCHER,
    GpuRef,
    LauncherSpec,
    SecretFile,
    WorkloadSpec,
    container_fingerprint,
)
from dankserve.runtime.podman import GpuPassthrough, container_create_kwargs, launch_request

SPEC = WorkloadSpec(
    deployment="chat",
    image="localhost/fake-vllm:latest",
    argv=("m", "--max-num-seqs", "8"),
    env={"NO_COLOR": "1"},
    port=8001,
    gpus=(GpuRef(0, "GPU-a"),),
    secrets=(
        SecretFile("api_key", Path("/etc/k"), "VLLM_API_KEY"),
        SecretFile("hf_token", Path("/t"), "HF_TOKEN_PATH"),
    ),
    cache_dir=Path("/var/cache/dankserve/deployments/chat/vllm"),
    launcher=LauncherSpec(Path("/srv/dankserve/launcher"), Path("/var/lib/dankserve/launchers/chat")),
)


def test_a_launcher_container_runs_the_images_python_on_the_read_only_launcher() -> None:
    """The entrypoint is the image's python3 on the mounted launcher; its socket dir is mounted writable."""
    kwargs = container_create_kwargs(
        SPEC, gpu=GpuPassthrough("none", ()), journald=False, secret_ids={"api_key": "a", "hf_token": "h"}
    )
    assert kwargs["entrypoint"] == [
        "python3",
        f"{CONTAINER_LAUNCHER_DIR}/__main__.py",
        "--run-dir",
        CONTAINER_LAUNCHER_RUN,
    ]
    assert kwargs["command"] == []
    mounts = {m["target"]: m for m in kwargs["mounts"]}
    assert mounts[CONTAINER_LAUNCHER_DIR]["read_only"] is True
    assert mounts[CONTAINER_LAUNCHER_RUN]["read_only"] is False
    assert kwargs["labels"][LABEL_LAUNCHER] == "true"
    assert kwargs["labels"][LABEL_CONTAINER_FINGERPRINT] == container_fingerprint(SPEC)


def test_the_launch_request_reads_value_secrets_from_their_files() -> None:
    """The API key is named by its file (read by the launcher), never sent; path secrets and the cache root are env."""
    request = launch_request(SPEC)
    assert request.argv == SPEC.argv
    assert request.env_files == {"VLLM_API_KEY": "/run/secrets/api_key"}
    assert "VLLM_API_KEY" not in request.env
    assert request.env["HF_TOKEN_PATH"] == "/run/secrets/hf_token"
    assert request.env["VLLM_CACHE_ROOT"] == "/root/.cache/vllm"


def test_the_container_fingerprint_ignores_what_a_new_server_can_change() -> None:
    """argv, env and labels reach the next server; image, GPUs, ports and mounts make a new container."""
    from dataclasses import replace

    same = replace(SPEC, argv=("m", "--max-num-seqs", "16"), env={"NO_COLOR": "0"}, labels={"x": "y"})
    assert container_fingerprint(same) == container_fingerprint(SPEC)
    for changed in (
        replace(SPEC, image="other:1"),
        replace(SPEC, gpus=(GpuRef(1, "GPU-b"),)),
        replace(SPEC, port=8002),
        replace(SPEC, shm_size="8g"),
    ):
        assert container_fingerprint(changed) != container_fingerprint(SPEC)
