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
    assert not use and "read from its config when the daemon ensures the image at boot" in why


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


def test_podman_auto_with_snapshots_leaves_the_launcher_off_and_says_why() -> None:
    """snapshot = "auto" on Podman: restarts restore the container's snapshot, which a launcher's container does not
    have yet: auto leaves the launcher off, naming the entrypoint it read and the way to use it anyway."""
    used, why = launcher_choice("auto", ["vllm", "serve"], "podman", snapshot="auto")
    assert not used and "`vllm serve` is vLLM's own" in why and 'snapshot = "auto"' in why and "launcher = true" in why
    used, why = launcher_choice("auto", ["/entrypoint.sh"], "podman", snapshot="auto")
    assert not used and "not vLLM's own" in why
    assert launcher_choice("auto", ["vllm", "serve"], "podman", snapshot="off")[0]
    assert launcher_choice(True, ["vllm", "serve"], "podman", snapshot="auto")[0]


def test_a_podman_deployment_decides_by_its_images_entrypoint_once_read() -> None:
    """The settings alone do not know the image's entrypoint (`dankserve plan`: read at boot); the daemon hands the
    one it read when it ensured the image (`with_image_entrypoint`) and every answer follows it."""
    from dankserve.settings import DeploymentSettings

    dep = DeploymentSettings(model="m", image="vllm/vllm-openai:v0.33.0", snapshot="off")
    used, why = dep.launcher_choice()
    assert not used and "at boot" in why
    own = dep.with_image_entrypoint(("vllm", "serve"))
    assert own.uses_launcher and "`vllm serve` is vLLM's own" in own.launcher_choice()[1]
    assert own.model_copy(update={"port": 9000}).uses_launcher, "kept through a copy"
    wrapper = dep.with_image_entrypoint(("/usr/local/bin/start.sh",))
    used, why = wrapper.launcher_choice()
    assert not used and "`/usr/local/bin/start.sh` is not vLLM's own" in why
    none = dep.with_image_entrypoint(())
    assert not none.uses_launcher and "`(none)`" in none.launcher_choice()[1]
    assert dep.with_image_entrypoint(None) is dep
    process = DeploymentSettings(model="m", runtime="process", executable="/x/run.sh", snapshot="off")
    assert process.with_image_entrypoint(("vllm", "serve")) is process, "the process runtime runs its executable"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"Entrypoint": ["vllm", "serve"], "Cmd": ["--help"]}, ("vllm", "serve")),
        ({"Entrypoint": None, "Cmd": ["vllm", "serve"]}, ()),
        ({"Cmd": ["sh"]}, ()),
        ({"Entrypoint": "exec vllm serve"}, ("/bin/sh", "-c", "exec vllm serve")),
        ({"Entrypoint": ["vllm", 3]}, None),
        ({"Entrypoint": ["x"] * 65}, None),
        ({"Entrypoint": ["x" * 5000]}, None),
        ({"Entrypoint": {"a": 1}}, None),
    ],
)
def test_the_image_entrypoint_is_read_from_the_inspect_document_as_hostile_input(
    config: dict[str, object], expected: tuple[str, ...] | None
) -> None:
    from dankserve.runtime.podman.images import image_entrypoint

    assert image_entrypoint({"Id": "x", "Config": config}) == expected
    assert image_entrypoint({"Id": "x"}) is None
