"""Issue 38.11: an image is a registry reference or a local image's name, nothing else.

`dankserve upgrade --image 'containers-storage:[overlay@DIR]x'` made Podman (as root) create a storage
and leave a mount at DIR, though the upgrade was then refused. Such a transport is refused by the CLI,
by the daemon's control socket (whoever sends the request) and in the config's `image`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.cli import plan_chat
from tests.harness.daemon import free_port, process_deployment, running_daemon


def _transports(target: Path) -> list[str]:
    return [
        f"containers-storage:[overlay@{target}]x",
        f"containers-storage:[overlay@{target}+/run/x]alpine",
        f"docker-archive:{target}/a.tar",
        f"oci:{target}",
        f"dir:{target}",
        "docker://docker.io/vllm/vllm-openai:v0.33.0",
        "vllm/vllm-openai:v0.33.0 --privileged",
    ]


def test_upgrade_refuses_a_transport_at_the_cli_and_at_the_daemon(tmp_path: Path) -> None:
    target = tmp_path / "their-storage"
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny-chat", gpus=[0])}
    with running_daemon(tmp_path, deployments) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        for reference in _transports(target):
            done = daemon.cli("upgrade", "chat", "--image", reference)
            assert done.returncode == 2, (reference, done.stdout, done.stderr)
            assert "--image" in done.stderr and "Traceback" not in done.stderr, done.stderr
            answer = daemon.request({"command": "upgrade", "deployment": "chat", "image": reference})
            assert answer is not None and answer["ok"] is False, answer
            assert "transport" in answer["error"] or "not an image reference" in answer["error"], answer
        assert not target.exists()
        assert daemon.deployment("chat")["phase"] == "ready"  # type: ignore[index]


@pytest.mark.parametrize("reference", ["containers-storage:[overlay@/var/tmp/x]x", "oci:/tmp/x", "a b"])
def test_a_config_image_that_is_no_image_reference_is_refused(tmp_path: Path, reference: str) -> None:
    done = plan_chat(tmp_path, f'image = "{reference}"')
    assert done.returncode == 2, done.stdout + done.stderr
    assert "deployments.chat.image" in done.stderr and "localhost/NAME:TAG" in done.stderr, done.stderr
