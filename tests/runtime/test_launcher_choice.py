"""`launcher = "auto"` (dankserve/runtime/launcher_choice.py): the launcher where the command it replaces is
vLLM's own, and the reason otherwise; true and false keep their meaning."""

from __future__ import annotations

import pytest

from dankserve.launcher_choice import launcher_choice


@pytest.mark.parametrize(
    "entrypoint",
    [
        ["vllm", "serve"],
        ["/usr/local/bin/vllm", "serve"],
        ["vllm"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        ["/usr/bin/python3.12", "-m", "vllm.entrypoints.cli.main"],
    ],
)
def test_auto_uses_the_launcher_for_vllm_s_own_image_entrypoints(entrypoint: list[str]) -> None:
    use, why = launcher_choice("auto", entrypoint, "podman")
    assert use and "vLLM's own" in why


@pytest.mark.parametrize(
    "entrypoint",
    [["/bin/sh", "-c", "exec vllm serve"], ["/entrypoint.sh"], ["python3", "/app/serve.py"], ["vllm", "bench"], []],
)
def test_auto_says_why_not_for_other_entrypoints(entrypoint: list[str]) -> None:
    use, why = launcher_choice("auto", entrypoint, "podman")
    assert not use and "not vLLM's own" in why and "launcher = true" in why


@pytest.mark.parametrize("executable", [["/opt/venv/bin/vllm"], ["/opt/venv/bin/python3"], ["python"]])
def test_auto_uses_the_launcher_when_the_process_runtime_runs_vllm(executable: list[str]) -> None:
    use, why = launcher_choice("auto", executable, "process")
    assert use and "process runtime" in why


def test_auto_refuses_a_wrapper_executable_and_an_unread_entrypoint() -> None:
    use, why = launcher_choice("auto", ["/usr/local/bin/run-vllm.sh"], "process")
    assert not use and "run-vllm.sh" in why
    use, why = launcher_choice("auto", None, "podman")
    assert not use and "could not be read" in why


def test_true_and_false_keep_their_meaning() -> None:
    assert launcher_choice(True, ["/entrypoint.sh"], "podman") == (True, "launcher = true")
    assert launcher_choice(False, ["vllm", "serve"], "podman") == (False, "launcher = false")


def test_auto_leaves_the_restarts_to_snapshots_on_the_process_runtime() -> None:
    """snapshot = "auto" restores a process deployment's restarts (issue 41): auto does not use the launcher, and
    says so; true still does; snapshot = "off" lets auto choose as before."""
    used, why = launcher_choice("auto", ["/venv/bin/vllm"], "process", snapshot="auto")
    assert not used and 'snapshot = "auto" restores' in why and "launcher = true" in why
    assert launcher_choice(True, ["/venv/bin/vllm"], "process", snapshot="auto")[0]
    assert launcher_choice("auto", ["/venv/bin/vllm"], "process", snapshot="off")[0]


def test_the_settings_default_is_auto_and_their_answer_is_the_choice() -> None:
    from dankserve.settings import DeploymentSettings

    dep = DeploymentSettings(model="m", runtime="process", executable="/venv/bin/vllm", snapshot="off")
    assert dep.launcher == "auto" and dep.uses_launcher
    assert not DeploymentSettings(model="m", runtime="process", executable="/venv/bin/vllm").uses_launcher
    assert not DeploymentSettings(model="m", runtime="process", executable="/x/run.sh", snapshot="off").uses_launcher
    assert not DeploymentSettings(model="m", image="vllm/vllm-openai:v0.33.0").uses_launcher, "entrypoint not read"
    assert DeploymentSettings(model="m", launcher=True).uses_launcher
