"""Tests for dankserve.runtime.podman.quadlet: the unit's keys and quoting (read back as Quadlet and systemd
read it), and the unit's `podman run` against the stand-in, side by side with the runtime's own container."""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dankserve.runtime.base import (
    LABEL_BOOT,
    LABEL_DEPLOYMENT,
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    GpuRef,
    LauncherSpec,
    Mount,
    SecretFile,
    WorkloadSpec,
)
from dankserve.runtime.podman import (
    DEFAULT_CDI_DIRS,
    HF_CACHE_TARGET,
    GpuPassthrough,
    PodmanRuntime,
    choose_gpu_passthrough,
    container_create_kwargs,
    present_device_nodes,
    read_cdi_device_names,
)
from dankserve.runtime.podman.quadlet import (
    KEY_SYNTAX,
    PODMAN_OPTION,
    QUADLET_CONTAINER_KEYS,
    Unrepresentable,
    container_unit,
    emitted_keys,
    exported_secret_name,
    podman_run_args,
    quote_arg,
    raw_value,
    render_unit,
    request_entries,
    secret_create_command,
    unknown_keys,
)
from tests.harness.gpus import StandInGpus
from tests.harness.podman_service import PodmanEnv
from tests.harness.quadlet import (
    generated_exec_start,
    generator_version,
    normalised_options,
    quadlet_generator,
    read_entries,
    unit_from_text,
    without_generator_options,
)
from tests.harness.wait import wait_until

GPU0 = GpuRef(index=0, uuid="GPU-aaaa")
CDI0 = GpuPassthrough("cdi", ("nvidia.com/gpu=GPU-aaaa",))
HOSTILE = [
    'it\'s 100% "quoted" $HOME ${HOME} $$ %n %% \\ back\\slash',
    "tab\tnew\nline",
    "ünïcødé ✓",
    "--flag=va lue",
    "#not-a-comment",
    "'single'",
    "semi;colon",
]


def full_spec(tmp_path: Path, **overrides: Any) -> WorkloadSpec:
    """A spec using every field the create request knows: secrets of both kinds, mounts, GPUs, shm, caps."""
    fields: dict[str, Any] = {
        "deployment": "chat",
        "image": "localhost/vllm:0.33.0",
        "argv": ("org/model", "--served-model-name", *HOSTILE[:1], "--port", "8000"),
        "env": {"A": "1", **{f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}},
        "port": 9000,
        "labels": {LABEL_FINGERPRINT: "fp", LABEL_BOOT: "3"},
        "gpus": (GPU0,),
        "mounts": (Mount(tmp_path / "hf cache,1", HF_CACHE_TARGET, read_only=True),),
        "secrets": (
            SecretFile("hf_token", tmp_path / "hf_token", "HF_TOKEN_PATH"),
            SecretFile("api_key", tmp_path / "api_key", "VLLM_API_KEY"),
        ),
        "shm_size": "16g",
        "numa_bind": True,
        "privileged": True,
        "cache_dir": tmp_path / "cache",
    }
    fields.update(overrides)
    return WorkloadSpec(**fields)


def test_every_key_written_is_in_quadlets_reference(tmp_path: Path) -> None:
    """Every key of every section is one of Podman 5's Quadlet [Container] keys or the few systemd keys allowed."""
    for spec in (full_spec(tmp_path), full_spec(tmp_path, shm_size=None, bind_host="0.0.0.0", secrets=())):
        text = render_unit(container_unit(spec, CDI0, stop_timeout=60), description="d")
        sections = emitted_keys(text)
        assert set(sections) == {"Unit", "Container", "Service", "Install"}
        assert unknown_keys(sections) == []
    assert set(KEY_SYNTAX) <= QUADLET_CONTAINER_KEYS and set(PODMAN_OPTION) <= QUADLET_CONTAINER_KEYS
    assert unknown_keys({"Container": ["Ipc"], "Service": ["ExecStart"]}) == ["Container.Ipc", "Service.ExecStart"]


def test_unit_reads_back_as_the_create_request(tmp_path: Path) -> None:
    """Read as Quadlet and systemd read it, the unit holds the request's words exactly, hostile values included."""
    unit = container_unit(full_spec(tmp_path), CDI0, stop_timeout=60)
    text = render_unit(unit, description="100% $HOME")
    assert [(e.key, e.words) for e in read_entries(text)] == [(e.key, e.words) for e in unit.entries]
    assert podman_run_args(unit_from_text(text, "chat")) == podman_run_args(unit)
    assert "Description=100%% $HOME" in text


def test_the_unit_says_what_the_runtime_asks_podman_for(tmp_path: Path) -> None:
    """Entrypoint, argv, env, mounts, devices, secrets, IPC or shm, caps and AppArmor are the create request's."""
    spec = full_spec(tmp_path)
    kwargs = container_create_kwargs(spec, gpu=CDI0, journald=False, secret_ids={"hf_token": "x", "api_key": "y"})
    args = podman_run_args(container_unit(spec, CDI0, stop_timeout=7.2))
    assert f"--entrypoint={json.dumps(kwargs['entrypoint'])}" in args
    assert args[-len(kwargs["command"]) - 1 :] == [spec.image, *kwargs["command"]]
    pairs = list(itertools.pairwise(args))
    for key, value in kwargs["environment"].items():
        assert ("--env", f"{key}={value}") in pairs
    assert ("--device", "nvidia.com/gpu=GPU-aaaa") in pairs and ("--shm-size", "16g") in pairs
    assert ("--cap-add", "sys_nice") in pairs and ("--cap-add", "sys_admin") in pairs
    assert "--security-opt=apparmor=unconfined" in args and ("--stop-timeout", "8") in pairs
    assert ("--publish", "127.0.0.1:9000:8000/tcp") in pairs and ("--pull", "missing") in pairs
    hf_mount = f'type=bind,"source={tmp_path}/hf cache,1",destination={HF_CACHE_TARGET},ro=true'
    assert ("--mount", hf_mount) in pairs
    assert ("--mount", f"type=bind,source={tmp_path}/cache,destination=/root/.cache/vllm") in pairs
    secret = exported_secret_name("chat", "api_key")
    assert ("--secret", f"{secret},type=mount,target=api_key") in pairs
    assert ("--label", f"{LABEL_DEPLOYMENT}=chat") in pairs
    assert not any(a.startswith(LABEL_MANAGED) for a in args)  # a running dankserve leaves the unit's container alone
    assert "--ipc=host" in podman_run_args(container_unit(full_spec(tmp_path, shm_size=None), CDI0, stop_timeout=1))
    hosted = podman_run_args(container_unit(full_spec(tmp_path, host_network=True), CDI0, stop_timeout=1))
    assert hosted[hosted.index("--network") + 1] == "host" and "--publish" not in hosted


def test_secrets_are_named_not_inlined(tmp_path: Path) -> None:
    """No secret value is in the unit; it names Podman secrets not the runtime's and says how to create them."""
    (tmp_path / "api_key").write_text("sk-SECRET-VALUE")
    unit = container_unit(full_spec(tmp_path), CDI0, stop_timeout=1)
    text = render_unit(unit, description="d")
    assert "sk-SECRET-VALUE" not in text
    assert f"#   {secret_create_command(exported_secret_name('chat', 'api_key'), tmp_path / 'api_key')}" in text
    assert exported_secret_name("chat", "api_key") != "dankserve-chat.api_key"  # dankserve removes its own


def test_the_header_names_the_file_the_service_name_comes_from(tmp_path: Path) -> None:
    """`systemctl start dankserve-chat` works only for a file saved as dankserve-chat.container: the header says so."""
    text = render_unit(container_unit(full_spec(tmp_path), CDI0, stop_timeout=1), description="d")
    assert "Save it as /etc/containers/systemd/dankserve-chat.container" in text.replace("\n# ", " ")
    assert "`systemctl start dankserve-chat`" in text.replace("\n# ", " ")


def test_a_launcher_workload_is_exported_as_plain_vllm_serve(tmp_path: Path) -> None:
    """The launcher is dankserve's: the unit runs `vllm serve` with the argv itself."""
    spec = full_spec(tmp_path, secrets=(), launcher=LauncherSpec(tmp_path / "l", tmp_path / "run"))
    args = podman_run_args(container_unit(spec, CDI0, stop_timeout=1))
    assert '--entrypoint=["vllm", "serve"]' in args and args[-2:] == ["--port", "8000"]
    assert not any("io.dankserve.launcher" in a or "/opt/dankserve/launcher" in a for a in args)


def test_a_new_request_field_cannot_be_dropped_silently() -> None:
    """A create-request field without a rendering is an error, not a unit that lacks it."""
    with pytest.raises(ValueError, match="healthcheck"):
        request_entries({"name": "n", "entrypoint": [], "command": [], "healthcheck": {}})


@pytest.mark.parametrize("word", ["", ";", "a\x85b"])
def test_unrepresentable_arguments_are_refused(word: str) -> None:
    """An empty word, a lone `;` or a C1 control cannot pass Quadlet and systemd unchanged: refused by name."""
    with pytest.raises(Unrepresentable):
        quote_arg(word)


@pytest.mark.parametrize("value", ["", " lead", "trail ", '"quoted"', "ends\\", "new\nline"])
def test_unrepresentable_raw_values_are_refused(value: str) -> None:
    """A raw value that Quadlet's trimming or line continuation would change is refused."""
    with pytest.raises(Unrepresentable):
        raw_value(value)


# ---------------------------------------------------------------------------------------------
# Against the real Podman service and the stand-in
# ---------------------------------------------------------------------------------------------


def inspect(env: PodmanEnv, name: str) -> dict[str, Any]:
    data: list[dict[str, Any]] = json.loads(env.podman("inspect", name).stdout)
    return data[0]


def wait_for_server(env: PodmanEnv, name: str, timeout: float = 60) -> dict[str, Any]:
    """The container once its PID 1 is the stand-in vLLM (the entrypoint's shell has exec'd)."""

    def serving() -> dict[str, Any] | None:
        data = inspect(env, name)
        pid = data["State"]["Pid"]
        if (
            pid
            and b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and "sh\0-c" not in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        ):
            return data
        assert data["State"]["Status"] == "running", env.podman("logs", name).stdout
        return None

    return wait_until(serving, timeout, 0.2, what="the server to start")


def container_facts(env: PodmanEnv, name: str) -> dict[str, Any]:
    """What the stand-in was given: its argv and environment, mounts, devices, secrets, labels, IPC, caps."""
    data = wait_for_server(env, name)
    pid = data["State"]["Pid"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    host_config = data["HostConfig"]
    return {
        "argv": Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"),
        "environ": sorted(e for e in environ if e and not e.startswith(b"HOSTNAME=")),
        "mounts": sorted((m["Source"], m["Destination"], m["RW"]) for m in data["Mounts"]),
        "devices": sorted(env.podman("exec", name, "ls", "/dev").stdout.split()),
        "secrets": env.podman("exec", name, "sh", "-c", "cat /run/secrets/*").stdout,
        "labels": {k: v for k, v in data["Config"]["Labels"].items() if k != LABEL_MANAGED},
        "host_ipc": os.readlink(f"/proc/{pid}/ns/ipc") == os.readlink("/proc/self/ns/ipc"),
        "host_net": os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"),
        "entrypoint": data["Config"]["Entrypoint"],
        "cmd": data["Config"]["Cmd"],
        "shm": host_config["ShmSize"],
        "caps": sorted(host_config["CapAdd"] or []),
        "ports": host_config.get("PortBindings") or {},
        "security": sorted(o for o in host_config.get("SecurityOpt") or [] if "apparmor" in o),
    }


@pytest.mark.parametrize("variant", ["host-network-ipc-host", "published-port-shm"])
def test_the_units_podman_run_gives_the_stand_in_what_dankserve_gives_it(
    *,
    variant: str,
    podman_runtime: PodmanRuntime,
    podman_env: PodmanEnv,
    make_spec: Any,
    gpus: StandInGpus,
    tmp_path: Path,
) -> None:
    """The unit's `podman run` (read back from its text) gives the stand-in vLLM the argv, environment, mounts,
    GPU devices, secrets, labels, IPC/shm, network and capabilities of the container dankserve's runtime creates."""
    hf = tmp_path / "hf cache,1"
    hf.mkdir()
    (tmp_path / "hf_token").write_text("hf_TOKEN_quadlet\n")
    (tmp_path / "api_key").write_text("sk-KEY-quadlet\n")
    for secret in ("hf_token", "api_key"):
        (tmp_path / secret).chmod(0o600)
    secrets = (
        SecretFile("hf_token", tmp_path / "hf_token", "HF_TOKEN_PATH"),
        SecretFile("api_key", tmp_path / "api_key", "VLLM_API_KEY"),
    )
    extra = {"shm_size": "64m", "numa_bind": True} if variant == "published-port-shm" else {"host_network": True}
    spec = make_spec(
        argv=("test/model", "--served-model-name", HOSTILE[0], "--port", "8000"),
        env={"FAKE_VLLM_BOOT_SECONDS": "0", **{f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}},
        gpus=(gpus.gpus[0],),
        mounts=(Mount(hf, HF_CACHE_TARGET, read_only=True),),
        cache_dir=tmp_path / "cache",
        secrets=secrets,
        **extra,
    )
    workload = podman_runtime.start(spec)
    try:
        dankserves = container_facts(podman_env, workload.name)
    finally:
        podman_runtime.remove(workload.id)
    gpu = choose_gpu_passthrough(
        spec.gpus, read_cdi_device_names(DEFAULT_CDI_DIRS), present_device_nodes(gpus.dev_dir), gpus.dev_dir
    )
    unit = container_unit(spec, gpu, stop_timeout=5)
    text = render_unit(unit, description="test")
    for name, path in unit.secrets.items():
        created = subprocess.run(
            ["sh", "-c", secret_create_command(name, path)], env=dict(podman_env.env), capture_output=True, check=False
        )
        assert created.returncode == 0, created.stderr
    try:
        podman_env.podman("run", "--detach", *podman_run_args(unit_from_text(text, spec.deployment)))
        exported = container_facts(podman_env, workload.name)
    finally:
        podman_env.podman("rm", "-f", "-t", "0", workload.name, check=False)
        for name in unit.secrets:
            podman_env.podman("secret", "rm", name, check=False)
    assert exported == dankserves
    hosted = variant == "host-network-ipc-host"
    assert (exported["host_ipc"], exported["host_net"], bool(exported["ports"])) == (hosted, hosted, not hosted)
    assert b"--served-model-name" in exported["argv"] and HOSTILE[0].encode() in exported["argv"]
    assert b"HOSTILE_1=tab\tnew\nline" in exported["environ"]
    assert b"VLLM_API_KEY=sk-KEY-quadlet" in exported["environ"]


@pytest.mark.parametrize("image", ["localhost/vllm:0.33.0", "docker.io/vllm/vllm-openai:v0.33.0"])
def test_quadlets_generator_writes_the_same_podman_run(tmp_path: Path, image: str) -> None:
    """Where this host's Podman has Quadlet (4.4+; Debian 12's 4.3 has none), `quadlet -dryrun` accepts the unit
    and its ExecStart holds the options and argv `podman_run_args` gives (the health check, and for a registry
    tag AutoUpdate='s label, too)."""
    generator = quadlet_generator()
    if generator is None:
        pytest.skip("no Quadlet generator here (Podman 4.3 has none; it came with 4.4, Entrypoint= with 5.0)")
    if generator_version(generator) < (5, 0):
        pytest.skip(f"Quadlet {generator_version(generator)} predates Entrypoint= (Podman 5.0)")
    unit = container_unit(full_spec(tmp_path, image=image), CDI0, stop_timeout=60)
    (tmp_path / "units").mkdir()
    (tmp_path / "units" / "dankserve-chat.container").write_text(render_unit(unit, description="d"))
    generated = generated_exec_start(generator, tmp_path / "units")
    assert generated[1] == "run"
    ours = normalised_options(podman_run_args(unit))
    theirs = without_generator_options(normalised_options(generated[2:]))
    tail = ours[ours.index(unit.entries[0].words[0]) :]  # the image, then Exec='s words
    assert theirs[-len(tail) :] == tail
    options = theirs[: -len(tail)]
    assert collections.Counter(options) == collections.Counter(ours[: -len(tail)])
