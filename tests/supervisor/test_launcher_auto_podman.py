"""`launcher = "auto"` on Podman reads the image's entrypoint (issue 41 item 8, docs/launcher.md): a real daemon on
the real Podman service. The stand-in image's entrypoint is vLLM's own (`vllm serve`, as vllm/vllm-openai's):
auto boots it through the launcher, status says so and why; an image whose entrypoint is a wrapper script
(tests/harness/images.py `wrapper_entrypoint_image`) is not bypassed: booted as it is, the reason named; with
`snapshot = "auto"` the launcher stays off (restarts are restores of the container). `dankserve plan`, which does
not ask Podman, says the entrypoint is read at boot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import workload_name
from dankserve.runtime.launcher_client import LauncherClient
from dankserve.runtime.podman.images import image_entrypoint
from tests.harness.daemon import container_deployment, free_port, running_daemon, write_host
from tests.harness.gpus import StandInGpus
from tests.harness.images import WRAPPER_ENTRYPOINT, wrapper_entrypoint_image
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.slow, pytest.mark.podman]


def _dep(image: str, **extra: Any) -> dict[str, Any]:
    # No launcher settings: the launcher imports vLLM's own entry point (`vllm.entrypoints.cli.main:main`),
    # which the stand-in image has, as vllm/vllm-openai does. `launcher` is left to auto.
    extra = {"gpus": [0], "snapshot": "off", **extra}
    dep = container_deployment(image, free_port(), **extra)
    if "launcher" not in extra:
        del dep["launcher"]
    return dep


def _run(tmp_path: Path, env: PodmanEnv, gpus: StandInGpus, name: str, dep: dict[str, Any]) -> Any:
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    return running_daemon(tmp_path, {name: dep}, hardware=host, extra_globals={"podman_url": env.url})


def test_the_entrypoint_is_read_from_the_real_images_config(podman_env: PodmanEnv, vllm_image: str) -> None:
    """What Podman's image inspect gives for the stand-in (vllm/vllm-openai's shape) and for a wrapper image."""
    inspected = json.loads(podman_env.podman("image", "inspect", vllm_image).stdout)[0]
    assert image_entrypoint(inspected) == ("vllm", "serve")
    wrapper = wrapper_entrypoint_image(podman_env, vllm_image)
    assert image_entrypoint(json.loads(podman_env.podman("image", "inspect", wrapper).stdout)[0]) == (
        WRAPPER_ENTRYPOINT,
    )


def test_auto_boots_vllms_own_entrypoint_through_the_launcher_and_says_why(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    dep = _dep(vllm_image)
    with _run(tmp_path, podman_env, gpus, deployment, dep) as daemon:
        done = daemon.cli("plan", deployment, "--hardware", str(tmp_path / "host.json"))
        assert done.returncode == 0, done.stdout + done.stderr
        said = " ".join(done.stdout.split())  # the note is wrapped
        assert "launcher: used (launcher = auto: the image's entrypoint `vllm serve` is vLLM's own)" in said, said
        after = daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
        assert after["launcher"]["used"] is True, after["launcher"]
        assert "`vllm serve` is vLLM's own" in after["launcher"]["why"]
        server = LauncherClient(daemon.state_dir / "launchers" / deployment).status().server
        assert server is not None and not server.exited, "the server is the launcher's"
        shown = daemon.cli("status", deployment).stdout
        assert "launcher used: launcher = auto: the image's entrypoint `vllm serve` is vLLM's own" in shown, shown
        (ready,) = [e for e in daemon.events_named("image_ready") if e.get("image") == vllm_image][:1]
        assert ready["entrypoint"] == ["vllm", "serve"]


def test_auto_does_not_bypass_a_wrapper_entrypoint_and_says_why(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    wrapper = wrapper_entrypoint_image(podman_env, vllm_image)
    with _run(tmp_path, podman_env, gpus, deployment, _dep(wrapper)) as daemon:
        after = daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
        assert after["launcher"]["used"] is False
        assert f"`{WRAPPER_ENTRYPOINT}` is not vLLM's own" in after["launcher"]["why"], after["launcher"]
        inspected = json.loads(podman_env.podman("inspect", workload_name(deployment)).stdout)[0]
        assert "__main__.py" not in " ".join(inspected["Config"]["Entrypoint"] or []), "not the launcher's"


def test_auto_with_snapshots_on_podman_leaves_the_launcher_off_and_says_why(
    tmp_path: Path, podman_env: PodmanEnv, gpus: StandInGpus, vllm_image: str, deployment: str
) -> None:
    with _run(tmp_path, podman_env, gpus, deployment, _dep(vllm_image, snapshot="auto")) as daemon:
        after = daemon.wait_for(deployment, lambda d: d["state"] == "ready", timeout=120)
        assert after["launcher"]["used"] is False
        why = after["launcher"]["why"]
        assert "`vllm serve` is vLLM's own" in why and 'snapshot = "auto"' in why and "launcher = true" in why


def test_plan_without_podman_says_the_entrypoint_is_read_at_boot(
    tmp_path: Path, gpus: StandInGpus, vllm_image: str
) -> None:
    """`dankserve plan` where no Podman service answers (its socket absent): the plan is made all the same, and
    says the image's entrypoint is read when the daemon ensures the image."""
    from dankserve.testing.config_file import write_config
    from tests.harness.cli import dankserve_cli
    from tests.harness.daemon import daemon_globals

    config = tmp_path / "dankserve.toml"
    globals_ = daemon_globals(tmp_path, {"podman_url": f"unix://{tmp_path}/absent/podman.sock"})
    write_config(config, globals_, {"chat": _dep(vllm_image)})
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in gpus.gpus])
    done = dankserve_cli(config, "plan", "chat", "--hardware", str(host))
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join(done.stdout.split())
    assert "launcher: not used" in said and "when the daemon ensures the image at boot" in said, said
