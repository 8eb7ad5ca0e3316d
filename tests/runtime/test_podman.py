"""Tests for dankserve.runtime.podman: pure parts by tables, the runtime against a real Podman service.

The real-Podman tests use the harness fixtures of tests/conftest.py (a private service, stand-in
GPUs, a local registry); they are marked `podman` automatically. No podman-py call is mocked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
import structlog

from dankserve.errors import (
    ConfigError,
    GpuPassthroughUnavailable,
    ImageUnavailable,
    PodmanRequestFailed,
    PodmanUnreachable,
)
from dankserve.exitcodes import ExitCode
from dankserve.runtime.base import (
    LABEL_BOOT,
    LABEL_DEPLOYMENT,
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    GpuRef,
    Mount,
    PullProgress,
    Runtime,
    SecretFile,
    WorkloadSpec,
    workload_name,
)
from dankserve.runtime.podman import (
    HF_CACHE_TARGET,
    GpuPassthrough,
    PodmanRuntime,
    VersionCache,
    cdi_device_names,
    choose_gpu_passthrough,
    conmon_exit_file,
    container_create_kwargs,
    exit_event_from,
    is_transient,
    parse_podman_time,
    parse_vllm_version,
    present_device_nodes,
    pull_error,
    pull_progress,
    read_cdi_device_names,
    serve_entrypoint,
    split_lines,
    with_default_tag,
    workload_from_inspect,
)
from tests.harness.gpus import StandInGpus
from tests.harness.images import busybox_vllm_image, pull_test_image
from tests.harness.podman_service import PodmanEnv, RestartableService
from tests.harness.wait import wait_until

SpecFactory = Callable[..., WorkloadSpec]
GPU0 = GpuRef(index=0, uuid="GPU-aaaa")
GPU1 = GpuRef(index=1, uuid="GPU-bbbb")
HF_TOKEN = SecretFile("hf_token", Path("/unused/hf"), "HF_TOKEN_PATH")
API_KEY = SecretFile("api_key", Path("/unused/key"), "VLLM_API_KEY")


# ---------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------

NVIDIA_YAML = """cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: GPU-aaaa
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
- name: all
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
"""


@pytest.mark.parametrize(
    ("text", "is_json", "names"),
    [
        (NVIDIA_YAML, False, {"0", "GPU-aaaa", "all"}),
        ('{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "1"}]}', True, {"1"}),
        ("kind: vendor.com/device\ndevices:\n- name: '0'\n", False, set()),
        ("kind: nvidia.com/gpu\n", False, set()),
        ("kind: nvidia.com/gpu\ndevices:\n- name: 3\n", False, {"3"}),
    ],
)
def test_cdi_device_names(text: str, is_json: bool, names: set[str]) -> None:
    """A CDI spec yields the device names of kind nvidia.com/gpu only."""
    assert cdi_device_names(text, is_json=is_json) == names


@pytest.mark.parametrize("text", ["- just\n- a list\n", "kind: nvidia.com/gpu\ndevices: {name: x}\n"])
def test_cdi_device_names_rejects_non_specs(text: str) -> None:
    """A document that is not a CDI spec is an error, not an empty device list."""
    with pytest.raises(ValueError):
        cdi_device_names(text, is_json=False)


def test_read_cdi_device_names_skips_broken_and_foreign_files(tmp_path: Path) -> None:
    """Spec files are read from every directory; broken files and other suffixes are skipped."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "nvidia.yaml").write_text(NVIDIA_YAML)
    (tmp_path / "a" / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "a" / "notes.txt").write_text("kind: nvidia.com/gpu\ndevices:\n- name: '9'\n")
    (tmp_path / "b.json").write_text("{}")
    names = read_cdi_device_names([tmp_path / "a", tmp_path / "missing"])
    assert names == {"0", "GPU-aaaa", "all"}


DEV = Path("/dev")
ALL_NODES = frozenset({"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"})


@pytest.mark.parametrize(
    ("gpus", "cdi", "nodes", "expected"),
    [
        ((), frozenset({"0"}), ALL_NODES, GpuPassthrough("none", ())),
        ((GPU0,), frozenset({"0", "GPU-aaaa"}), ALL_NODES, GpuPassthrough("cdi", ("nvidia.com/gpu=GPU-aaaa",))),
        (
            (GPU0, GPU1),
            frozenset({"0", "1"}),
            ALL_NODES,
            GpuPassthrough("cdi", ("nvidia.com/gpu=0", "nvidia.com/gpu=1")),
        ),
        (
            (GPU1,),
            frozenset({"0", "GPU-aaaa"}),
            ALL_NODES,
            GpuPassthrough(
                "device-nodes",
                (
                    "/dev/nvidia1:/dev/nvidia1:rwm",
                    "/dev/nvidiactl:/dev/nvidiactl:rwm",
                    "/dev/nvidia-uvm:/dev/nvidia-uvm:rwm",
                    "/dev/nvidia-uvm-tools:/dev/nvidia-uvm-tools:rwm",
                    "/dev/nvidia-modeset:/dev/nvidia-modeset:rwm",
                ),
            ),
        ),
        (
            (GPU0, GPU1),
            frozenset({"GPU-aaaa"}),
            frozenset({"nvidia0", "nvidia1", "nvidiactl"}),
            GpuPassthrough(
                "device-nodes",
                ("/dev/nvidia0:/dev/nvidia0:rwm", "/dev/nvidia1:/dev/nvidia1:rwm", "/dev/nvidiactl:/dev/nvidiactl:rwm"),
            ),
        ),
    ],
)
def test_choose_gpu_passthrough(
    gpus: tuple[GpuRef, ...], cdi: frozenset[str], nodes: frozenset[str], expected: GpuPassthrough
) -> None:
    """CDI (UUID before index) when every GPU is listed, else its node plus the present control nodes."""
    assert choose_gpu_passthrough(gpus, cdi, nodes, DEV) == expected


def test_choose_gpu_passthrough_without_cdi_or_node_is_environment_error() -> None:
    """A GPU with neither a CDI entry nor a device node is an exit-3 error naming it and the fix."""
    with pytest.raises(GpuPassthroughUnavailable) as info:
        choose_gpu_passthrough((GPU1,), frozenset(), frozenset({"nvidia0", "nvidiactl"}), Path("/x"))
    assert "GPU-bbbb" in info.value.message and "/x/nvidia1" in info.value.message
    assert info.value.fix is not None and "nvidia-ctk cdi generate" in info.value.fix
    assert info.value.exit_code == ExitCode.ENVIRONMENT


def test_present_device_nodes(tmp_path: Path) -> None:
    """Only nvidia* entries of the dev root count; a missing root has none."""
    for name in ("nvidia0", "nvidiactl", "null"):
        (tmp_path / name).touch()
    assert present_device_nodes(tmp_path) == {"nvidia0", "nvidiactl"}
    assert present_device_nodes(tmp_path / "absent") == frozenset()


@pytest.mark.parametrize(
    ("secrets", "entrypoint"),
    [
        ((), ["vllm", "serve"]),
        ((HF_TOKEN,), ["vllm", "serve"]),
        (
            (HF_TOKEN, API_KEY),
            [
                "sh",
                "-c",
                'set -e; VLLM_API_KEY="$(cat /run/secrets/api_key)"; export VLLM_API_KEY; exec vllm serve "$@"',
                "sh",
            ],
        ),
    ],
)
def test_serve_entrypoint(secrets: tuple[SecretFile, ...], entrypoint: list[str]) -> None:
    """Value secrets are read from their files by a fail-closed shell wrapper; path secrets need none."""
    assert serve_entrypoint(secrets) == entrypoint


@pytest.mark.parametrize(
    "secret", [SecretFile("api key", Path("/k"), "VLLM_API_KEY"), SecretFile("k", Path("/k"), "X;rm -rf")]
)
def test_serve_entrypoint_refuses_unsafe_names(secret: SecretFile) -> None:
    """A secret or variable name that is not plain never reaches the shell."""
    with pytest.raises(ValueError):
        serve_entrypoint((secret,))


def spec_for(**overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "deployment": "chat",
        "image": "img",
        "argv": ("org/model", "--port", "8000"),
        "env": {"A": "1"},
        "port": 9000,
        "labels": {LABEL_FINGERPRINT: "fp", LABEL_BOOT: "3"},
    }
    fields.update(overrides)
    return WorkloadSpec(**fields)


NO_GPU = GpuPassthrough("none", ())


@pytest.mark.parametrize(
    ("spec", "journald", "expected"),
    [
        (
            spec_for(),
            False,
            {
                "name": "dankserve-chat",
                "entrypoint": ["vllm", "serve"],
                "command": ["org/model", "--port", "8000"],
                "environment": {"A": "1"},
                "ports": {"8000/tcp": ("127.0.0.1", 9000)},
                "ipc_mode": "host",
                "mounts": [],
                "devices": [],
                "secrets": [],
                "labels": {
                    LABEL_FINGERPRINT: "fp",
                    LABEL_BOOT: "3",
                    LABEL_MANAGED: "true",
                    LABEL_DEPLOYMENT: "chat",
                },
            },
        ),
        (spec_for(shm_size="16g", bind_host="0.0.0.0", container_port=8001), False, {"shm_size": "16g"}),
        (
            spec_for(argv=("org/model",), host_network=True),
            False,
            {"network_mode": "host", "command": ["org/model", "--host", "127.0.0.1", "--port", "9000"]},
        ),
        (spec_for(), True, {"log_config": {"Type": "journald"}}),
        (spec_for(numa_bind=True), False, {"cap_add": ["SYS_NICE"]}),
        (spec_for(privileged=True), False, {"cap_add": ["SYS_ADMIN"], "apparmor_profile": "unconfined"}),
        (
            spec_for(
                cache_dir=Path("/c/chat"),
                mounts=(Mount(Path("/hf"), HF_CACHE_TARGET, read_only=True),),
            ),
            False,
            {
                "mounts": [
                    {"type": "bind", "source": "/hf", "target": HF_CACHE_TARGET, "read_only": True},
                    {"type": "bind", "source": "/c/chat", "target": "/root/.cache/vllm", "read_only": False},
                ],
                "environment": {"A": "1", "VLLM_CACHE_ROOT": "/root/.cache/vllm"},
            },
        ),
        (
            spec_for(cache_dir=Path("/c"), env={"VLLM_CACHE_ROOT": "/cache"}),
            False,
            {"mounts": [{"type": "bind", "source": "/c", "target": "/cache", "read_only": False}]},
        ),
        (
            spec_for(secrets=(HF_TOKEN, API_KEY), labels={LABEL_DEPLOYMENT: "spoofed"}),
            False,
            {
                "secrets": [
                    {"source": "dankserve-chat.hf_token", "target": "hf_token"},
                    {"source": "dankserve-chat.api_key", "target": "api_key"},
                ],
                "environment": {"A": "1", "HF_TOKEN_PATH": "/run/secrets/hf_token"},
                "labels": {LABEL_DEPLOYMENT: "chat", LABEL_MANAGED: "true"},
            },
        ),
    ],
)
def test_container_create_kwargs(spec: WorkloadSpec, journald: bool, expected: dict[str, Any]) -> None:
    """The create request holds the spec's name, command, env, port, mounts, secrets, labels and options."""
    secret_ids = {s.name: f"dankserve-chat.{s.name}" for s in spec.secrets}
    kwargs = container_create_kwargs(spec, gpu=NO_GPU, journald=journald, secret_ids=secret_ids)
    for key, value in expected.items():
        assert kwargs[key] == value, key


@pytest.mark.parametrize(
    ("spec", "absent"),
    [
        (spec_for(), {"shm_size", "cap_add", "apparmor_profile", "privileged", "log_config"}),
        (spec_for(shm_size="1g"), {"ipc_mode"}),
        (spec_for(numa_bind=True), {"apparmor_profile", "privileged"}),
        (spec_for(host_network=True), {"ports"}),
        (spec_for(), {"network_mode"}),
    ],
)
def test_container_create_kwargs_leaves_out(spec: WorkloadSpec, absent: set[str]) -> None:
    """No privilege, capability, log driver or IPC option appears unless the spec asks for it."""
    kwargs = container_create_kwargs(spec, gpu=NO_GPU, journald=False, secret_ids={})
    assert absent.isdisjoint(kwargs)
    assert "SYS_ADMIN" not in kwargs.get("cap_add", [])


def test_container_create_kwargs_passes_gpu_devices() -> None:
    """The chosen GPU devices become the create request's devices."""
    gpu = GpuPassthrough("cdi", ("nvidia.com/gpu=0",))
    assert container_create_kwargs(spec_for(), gpu=gpu, journald=False, secret_ids={})["devices"] == [
        "nvidia.com/gpu=0"
    ]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("vllm/vllm-openai", "vllm/vllm-openai:latest"),
        ("vllm/vllm-openai:v0.33.0", "vllm/vllm-openai:v0.33.0"),
        ("127.0.0.1:5000/x/y", "127.0.0.1:5000/x/y:latest"),
        ("127.0.0.1:5000/x/y:t", "127.0.0.1:5000/x/y:t"),
        ("docker.io/x/y@sha256:abc", "docker.io/x/y@sha256:abc"),
    ],
)
def test_with_default_tag(image: str, expected: str) -> None:
    """A reference without tag or digest gets `:latest` (the registry port is no tag)."""
    assert with_default_tag(image) == expected


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        (
            {"status": "Downloading", "progressDetail": {"current": 10, "total": 100}, "id": "abc"},
            PullProgress("r", "Downloading", 10, 100, "abc"),
        ),
        (
            {"status": "Pulling fs layer", "progressDetail": {}, "id": "abc"},
            PullProgress("r", "Pulling fs layer", layer="abc"),
        ),
        (
            {"status": "Download complete", "progressDetail": {"current": 5, "total": 0}},
            PullProgress("r", "Download complete", 5),
        ),
        ({"stream": "Copying blob sha256:1\n"}, PullProgress("r", "Copying blob sha256:1")),
    ],
)
def test_pull_progress(item: dict[str, Any], expected: PullProgress) -> None:
    """A pull stream item becomes a PullProgress with its layer and byte counts when given."""
    assert pull_progress("r", item) == expected


@pytest.mark.parametrize(
    ("item", "error"),
    [
        ({"status": "Downloading"}, None),
        ({"error": "manifest unknown"}, "manifest unknown"),
        ({"errorDetail": {"message": "denied"}, "progressDetail": {}}, "denied"),
    ],
)
def test_pull_error(item: dict[str, Any], error: str | None) -> None:
    """A failed pull is recognised from its stream item (the HTTP status stays 200)."""
    assert pull_error(item) == error


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("0.33.0\n", "0.33.0"),
        (
            "INFO 11-29 [__init__.py:1] Automatically detected platform cpu.\n0.33.0rc1.dev12+g1234\n",
            "0.33.0rc1.dev12+g1234",
        ),
        ("v0.26.0", "0.26.0"),
        ("WARNING no GPU\n", None),
        ("", None),
    ],
)
def test_parse_vllm_version(output: str, version: str | None) -> None:
    """The version is the last bare version line of `vllm --version`, after any log noise."""
    assert parse_vllm_version(output) == version


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        ([b"a\nb\n"], ["a", "b"]),
        ([b"par", b"tial\nnext", b"\n"], ["partial", "next"]),
        ([b"no newline at end"], ["no newline at end"]),
        ([b"crlf\r\n", b"\n"], ["crlf", ""]),
        ([b"caf\xc3", b"\xa9\n"], ["caf\u00e9"]),
        ([], []),
    ],
)
def test_split_lines(chunks: list[bytes], lines: list[str]) -> None:
    """Log frames are re-split into whole lines, even when a frame cuts a line or a character."""
    assert list(split_lines(chunks)) == lines


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            ["/usr/bin/conmon", "-c", "abc", "--exit-dir", "/run/libpod/exits", "-l", "k8s-file:/x"],
            "/run/libpod/exits/abc",
        ),
        (["/usr/bin/conmon", "--exit-dir=/run/exits", "-c", "abc"], "/run/exits/abc"),
        (["/usr/bin/conmon", "-c", "abc", "--exit-dir"], None),
        (["/usr/bin/conmon", "-c", "abc"], None),
    ],
)
def test_conmon_exit_file(cmdline: list[str], expected: str | None) -> None:
    """conmon's exit file is its --exit-dir joined with the container ID; none without the option."""
    found = conmon_exit_file(cmdline, "abc")
    assert (str(found) if found is not None else None) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-29T19:30:24.816767555Z", 1795980624.816767),
        ("2026-11-29T19:30:24+00:00", 1795980624.0),
        ("0001-01-01T00:00:00Z", None),
        ("", None),
        ("garbage", None),
    ],
)
def test_parse_podman_time(value: str, expected: float | None) -> None:
    """Go timestamps with nanoseconds parse to Unix time; Go's zero time is no time."""
    parsed = parse_podman_time(value)
    assert parsed == pytest.approx(expected) if expected is not None else parsed is None


def test_workload_from_inspect() -> None:
    """An inspect document becomes a Workload with its labels, state, exit code and fingerprint."""
    attrs = {
        "Id": "abc",
        "Name": "dankserve-chat",
        "ImageName": "img:1",
        "State": {
            "Status": "exited",
            "ExitCode": 137,
            "OOMKilled": True,
            "Pid": 0,
            "StartedAt": "0001-01-01T00:00:00Z",
        },
        "Config": {"Labels": {LABEL_DEPLOYMENT: "chat", LABEL_FINGERPRINT: "fp"}},
    }
    workload = workload_from_inspect(attrs)
    assert (workload.deployment, workload.state, workload.exit_code, workload.oom_killed) == (
        "chat",
        "exited",
        137,
        True,
    )
    assert (workload.fingerprint, workload.pid, workload.image, workload.running) == ("fp", None, "img:1", False)
    running = workload_from_inspect({"Id": "x", "State": {"Status": "running", "ExitCode": 0, "Pid": 42}})
    assert (running.state, running.exit_code, running.pid, running.deployment) == ("running", None, 42, "")


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            {"status": "died", "Actor": {"ID": "abc", "Attributes": {"containerExitCode": "3", LABEL_DEPLOYMENT: "d"}}},
            ("abc", "d", 3),
        ),
        ({"Action": "died", "id": "x", "Actor": {"Attributes": {}}}, ("x", "", None)),
        ({"status": "start", "Actor": {"ID": "abc", "Attributes": {}}}, None),
    ],
)
def test_exit_event_from(event: dict[str, Any], expected: tuple[str, str, int | None] | None) -> None:
    """Only `died` events become ExitEvents, with the exit code and deployment label."""
    exit_event = exit_event_from(event)
    if expected is None:
        assert exit_event is None
    else:
        assert exit_event is not None
        assert (exit_event.workload_id, exit_event.deployment, exit_event.exit_code) == expected


def api_error(status: int | None, cause: BaseException | None = None) -> BaseException:
    from podman.errors import APIError

    response = None
    if status is not None:
        response = requests.Response()
        response.status_code = status
    error = APIError("x", response=response)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (api_error(None, requests.exceptions.ConnectionError("refused")), True),
        (api_error(None, requests.exceptions.ReadTimeout("slow")), False),
        (api_error(500), True),
        (api_error(503), True),
        (api_error(404), False),
        (api_error(409), False),
        (api_error(400), False),
        (requests.exceptions.ChunkedEncodingError("cut"), True),
        (ConnectionResetError(), True),
        (ValueError("bug"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    """Connection failures and 5xx are retried; 4xx, timeouts and bugs are not."""
    assert is_transient(exc) is transient


def test_version_cache_persists(tmp_path: Path) -> None:
    """A version put in the cache is found by a later cache on the same file."""
    VersionCache(tmp_path / "c" / "v.json").put("sha256:1", "0.33.0")
    assert VersionCache(tmp_path / "c" / "v.json").get("sha256:1") == "0.33.0"
    assert VersionCache(tmp_path / "c" / "v.json").get("sha256:2") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert VersionCache(tmp_path / "bad.json").get("sha256:1") is None


def test_version_cache_that_cannot_be_written_keeps_the_version_in_memory(tmp_path: Path) -> None:
    """A version cache on an unwritable path (here a file in the way) keeps the version in memory, no error."""
    (tmp_path / "file").write_text("")
    cache = VersionCache(tmp_path / "file" / "v.json")
    cache.put("sha256:1", "0.33.0")
    assert cache.get("sha256:1") == "0.33.0"


def as_runtime(runtime: PodmanRuntime) -> Runtime:
    return runtime  # mypy checks here that PodmanRuntime satisfies the Runtime protocol


def test_podman_runtime_is_a_runtime() -> None:
    """PodmanRuntime provides every method of the Runtime protocol (mypy checks the signatures)."""
    protocol_methods = {name for name in vars(Runtime) if not name.startswith("_")}
    assert protocol_methods <= set(dir(PodmanRuntime))
    assert callable(as_runtime)


def test_unreachable_url_is_exit_3_naming_url_and_fix(tmp_path: Path) -> None:
    """A URL nothing listens on is PodmanUnreachable (exit 3) naming the URL and how to start Podman."""
    url = f"unix://{tmp_path}/podman.sock"
    with pytest.raises(PodmanUnreachable) as info:
        PodmanRuntime(url, attempts=2)
    assert url in info.value.message
    assert info.value.fix is not None and "systemctl enable --now podman.socket" in info.value.fix
    assert info.value.exit_code == ExitCode.ENVIRONMENT


def test_url_with_unknown_scheme_is_config_error() -> None:
    """A podman_url that is no Podman URL is an exit-2 error naming it."""
    with pytest.raises(ConfigError, match="ftp://host"):
        PodmanRuntime("ftp://host/x")


# ---------------------------------------------------------------------------------------------
# Against the real Podman service
# ---------------------------------------------------------------------------------------------


def container_sees(env: PodmanEnv, name: str, script: str) -> str:
    return env.podman("exec", name, "sh", "-c", script).stdout


def ipc_namespace(env: PodmanEnv, name: str) -> str:
    return container_sees(env, name, "readlink /proc/1/ns/ipc").strip()


def inspect_json(env: PodmanEnv, name: str) -> dict[str, Any]:
    data: list[dict[str, Any]] = json.loads(env.podman("inspect", name).stdout)
    return data[0]


def all_command_lines() -> list[str]:
    """The argv of every process on the host (the container's included)."""
    lines = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # ended meanwhile
    return lines


def wait_for_http(url: str, timeout: float = 30) -> int:

    def status() -> int | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return int(response.status)
        except OSError:
            return None

    return wait_until(status, timeout, 0.2, what=f"an answer from {url}")


def test_device_nodes_reach_the_container(
    podman_env: PodmanEnv, gpus: StandInGpus, make_spec: SpecFactory, tmp_path: Path
) -> None:
    """Without a CDI entry the assigned GPU's node and the control nodes are passed; other GPUs' are not."""
    runtime = PodmanRuntime(podman_env.url, cdi_dirs=(), dev_root=gpus.dev_dir, journal_socket=tmp_path / "none")
    workload = runtime.start(make_spec(gpus=(gpus.gpus[1],)))
    seen = container_sees(podman_env, workload.name, "ls /dev").split()
    assert {"nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} <= set(seen)
    assert "nvidia0" not in seen
    runtime.remove(workload.id)
    runtime.close()


def test_cdi_passes_the_gpu_named_by_uuid(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, gpus: StandInGpus, make_spec: SpecFactory
) -> None:
    """With a CDI spec listing the GPU's UUID, Podman injects that device (no /dev/nvidia<index> needed)."""
    # Index 7 has no node: only CDI, through the UUID, can make this work.
    gpu = GpuRef(index=7, uuid=gpus.gpus[1].uuid)
    workload = podman_runtime.start(make_spec(gpus=(gpu,)))
    seen = container_sees(podman_env, workload.name, "ls /dev").split()
    assert {"nvidia1", "nvidiactl", "nvidia-uvm"} <= set(seen)
    assert "nvidia7" not in seen and "nvidia0" not in seen
    podman_runtime.remove(workload.id)


def test_gpu_without_cdi_or_node_creates_nothing(
    podman_env: PodmanEnv, gpus: StandInGpus, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """An unpassable GPU is an exit-3 error raised before any container exists."""
    runtime = PodmanRuntime(podman_env.url, cdi_dirs=(), dev_root=gpus.dev_dir, journal_socket=tmp_path / "none")
    with pytest.raises(GpuPassthroughUnavailable):
        runtime.start(make_spec(gpus=(GpuRef(index=9, uuid="GPU-none"),)))
    assert runtime.find(deployment) is None
    runtime.close()


def test_mounts_and_compile_cache(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, tmp_path: Path
) -> None:
    """Bind mounts appear at their targets (read-only when asked); the compile cache is writable at VLLM_CACHE_ROOT."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.txt").write_text("weights")
    cache = tmp_path / "compile-cache"
    workload = podman_runtime.start(make_spec(mounts=(Mount(hf, HF_CACHE_TARGET, read_only=True),), cache_dir=cache))
    assert container_sees(podman_env, workload.name, f"cat {HF_CACHE_TARGET}/model.txt") == "weights"
    denied = podman_env.podman("exec", workload.name, "sh", "-c", f"touch {HF_CACHE_TARGET}/x", check=False)
    assert denied.returncode != 0
    container_sees(podman_env, workload.name, 'echo compiled > "$VLLM_CACHE_ROOT/artifact"')
    assert (cache / "artifact").read_text() == "compiled\n"
    podman_runtime.remove(workload.id)


def test_failed_create_leaves_no_secrets(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """A container Podman refuses to create (unknown image) leaves neither container nor secrets."""
    (tmp_path / "key").write_text("k")
    (tmp_path / "key").chmod(0o600)
    spec = make_spec(
        image="localhost/dankserve-test-absent:none", secrets=(SecretFile("api_key", tmp_path / "key", "VLLM_API_KEY"),)
    )
    with pytest.raises(PodmanRequestFailed, match="image not known"):
        podman_runtime.start(spec)
    assert podman_runtime.find(deployment) is None
    assert not [n for n in podman_env.podman("secret", "ls", "--format", "{{.Name}}").stdout.split() if deployment in n]


def test_missing_mount_source_is_config_error(
    podman_runtime: PodmanRuntime, make_spec: SpecFactory, tmp_path: Path
) -> None:
    """A mount whose host directory is absent is an exit-2 error naming it, before anything is created."""
    with pytest.raises(ConfigError, match=str(tmp_path / "absent")):
        podman_runtime.start(make_spec(mounts=(Mount(tmp_path / "absent", "/data"),)))


def test_port_is_published_on_loopback_only(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory
) -> None:
    """The server's port answers on 127.0.0.1 at the spec's port, bound to that address only."""
    spec = make_spec()
    workload = podman_runtime.start(spec)
    assert wait_for_http(f"http://127.0.0.1:{spec.port}/health") == 200
    bindings = inspect_json(podman_env, workload.name)["HostConfig"]["PortBindings"]["8000/tcp"]
    assert bindings == [{"HostIp": "127.0.0.1", "HostPort": str(spec.port)}]
    podman_runtime.remove(workload.id)


def test_host_network_binds_loopback_and_publishes_nothing(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory
) -> None:
    """With host_network the server shares the host's network, binds 127.0.0.1:port itself, publishes nothing."""
    spec = dataclasses.replace(make_spec(), host_network=True)
    workload = podman_runtime.start(spec)
    assert wait_for_http(f"http://127.0.0.1:{spec.port}/health") == 200
    inspected = inspect_json(podman_env, workload.name)
    assert inspected["HostConfig"]["NetworkMode"] == "host"
    assert not inspected["HostConfig"].get("PortBindings")
    assert not any(n.get("IPAddress") for n in (inspected["NetworkSettings"].get("Networks") or {}).values())
    podman_runtime.remove(workload.id)


def test_name_labels_ipc_and_capabilities(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str
) -> None:
    """The container is named after the deployment, labelled, shares the host's IPC, and gets no extra privilege."""
    workload = podman_runtime.start(make_spec())
    assert workload.name == workload_name(deployment) and workload.running
    assert workload.labels[LABEL_MANAGED] == "true" and workload.labels[LABEL_DEPLOYMENT] == deployment
    assert (workload.fingerprint, workload.labels[LABEL_BOOT]) == ("fp-1", "1")
    # Podman 4.3's inspect says "shareable" even for ipc=host: compare the namespaces themselves.
    assert ipc_namespace(podman_env, workload.name) == os.readlink("/proc/self/ns/ipc")
    host_config = inspect_json(podman_env, workload.name)["HostConfig"]
    assert not host_config["Privileged"]
    assert not {"CAP_SYS_ADMIN", "CAP_SYS_NICE"} & set(host_config["CapAdd"] or [])
    assert "unconfined" not in json.dumps(host_config.get("SecurityOpt"))
    podman_runtime.remove(workload.id)


def test_shm_size_numa_and_privileged_opt_in(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory
) -> None:
    """A shm size replaces ipc=host; NUMA binding adds SYS_NICE; the privileged opt-in adds SYS_ADMIN with a warning."""
    with structlog.testing.capture_logs() as logs:
        workload = podman_runtime.start(make_spec(shm_size="64m", numa_bind=True, privileged=True))
    assert ipc_namespace(podman_env, workload.name) != os.readlink("/proc/self/ns/ipc")
    host_config = inspect_json(podman_env, workload.name)["HostConfig"]
    assert host_config["ShmSize"] == 64 * 1024 * 1024
    assert {"CAP_SYS_NICE", "CAP_SYS_ADMIN"} <= set(host_config["CapAdd"])
    assert any(entry["event"] == "workload_privileged" and entry["log_level"] == "warning" for entry in logs)
    podman_runtime.remove(workload.id)


def test_secrets_reach_vllm_but_no_inspect_argv_or_log(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """HF token and API key reach vLLM as a file and an env value, and appear in no inspect output, argv or log line."""
    token, key = "hf_TESTTOKEN_8f2a61c0", "sk-TESTKEY-77d1e9b4"
    (tmp_path / "hf_token").write_text(token + "\n")
    (tmp_path / "api_key").write_text(key + "\n")
    for secret in ("hf_token", "api_key"):
        (tmp_path / secret).chmod(0o600)
    secrets = (
        SecretFile("hf_token", tmp_path / "hf_token", "HF_TOKEN_PATH"),
        SecretFile("api_key", tmp_path / "api_key", "VLLM_API_KEY"),
    )
    with structlog.testing.capture_logs() as logs:
        workload = podman_runtime.start(make_spec(secrets=secrets))
        log_lines = list(podman_runtime.logs(workload.id))
    assert container_sees(podman_env, workload.name, 'cat "$HF_TOKEN_PATH"') == token
    assert workload.pid is not None
    environ = Path(f"/proc/{workload.pid}/environ").read_bytes().split(b"\0")
    assert f"VLLM_API_KEY={key}".encode() in environ  # the wrapper exported it for vLLM
    revealing = [
        podman_env.podman("inspect", workload.name).stdout,
        podman_env.podman("secret", "inspect", f"{workload_name(deployment)}.api_key").stdout,
        podman_env.podman("secret", "inspect", f"{workload_name(deployment)}.hf_token").stdout,
        podman_env.podman("logs", workload.name).stdout,
        "\n".join(log_lines),
        json.dumps(logs, default=str),
        *all_command_lines(),
    ]
    for text in revealing:
        assert token not in text and key not in text
    assert "HF_TOKEN_PATH=/run/secrets/hf_token" in revealing[0]
    podman_runtime.remove(workload.id)


def test_secrets_follow_the_file_and_go_with_the_container(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """A changed secret file is picked up by the next start; removing the workload removes its secrets."""
    key_file = tmp_path / "api_key"
    spec = make_spec(secrets=(SecretFile("api_key", key_file, "VLLM_API_KEY"),))
    key_file.write_text("first-key")
    key_file.chmod(0o600)
    first = podman_runtime.start(spec)
    podman_runtime.stop(first.id, 5)  # replacing a workload is the supervisor's: stop and remove, then start
    podman_runtime.remove(first.id)
    key_file.write_text("second-key")
    workload = podman_runtime.start(spec)
    assert container_sees(podman_env, workload.name, "cat /run/secrets/api_key") == "second-key"
    names = podman_env.podman("secret", "ls", "--format", "{{.Name}}").stdout.split()
    assert [n for n in names if n.startswith(workload_name(deployment) + ".")] == [
        f"{workload_name(deployment)}.api_key"
    ]
    podman_runtime.remove(workload.id)
    names = podman_env.podman("secret", "ls", "--format", "{{.Name}}").stdout.split()
    assert not [n for n in names if n.startswith(workload_name(deployment) + ".")]


def test_one_container_per_deployment_and_replacing_is_the_supervisors(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str
) -> None:
    """Starting while the deployment's container exists is refused; stopped and removed, the new one starts."""
    assert podman_runtime.find(deployment) is None
    first = podman_runtime.start(make_spec())
    found = podman_runtime.find(deployment)
    assert found is not None and found.id == first.id and found.fingerprint == "fp-1"
    spec = make_spec()
    with pytest.raises(PodmanRequestFailed, match="already exists"):
        podman_runtime.start(spec)
    podman_runtime.stop(first.id, 5)
    podman_runtime.remove(first.id)
    second = podman_runtime.start(dataclasses.replace(spec, labels={**spec.labels, LABEL_FINGERPRINT: "fp-2"}))
    assert podman_runtime.inspect(first.id) is None
    names = podman_env.podman("ps", "-a", "--filter", f"label={LABEL_DEPLOYMENT}={deployment}", "--format", "{{.ID}}")
    assert len(names.stdout.split()) == 1
    found = podman_runtime.find(deployment)
    assert found is not None and found.id == second.id and found.fingerprint == "fp-2"
    assert second.id in {w.id for w in podman_runtime.list_workloads()}
    podman_runtime.remove(second.id)
    assert second.id not in {w.id for w in podman_runtime.list_workloads()}


def test_foreign_container_with_the_name_is_left_alone(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str, busybox_image: str
) -> None:
    """A container dankserve did not create is never replaced: an exit-3 error names it."""
    podman_env.podman("create", "--name", workload_name(deployment), busybox_image)
    with pytest.raises(PodmanRequestFailed, match="does not manage"):
        podman_runtime.start(make_spec())
    assert podman_runtime.find(deployment) is None
    assert podman_env.podman("container", "exists", workload_name(deployment), check=False).returncode == 0


def test_stop_is_graceful_and_idempotent(podman_runtime: PodmanRuntime, make_spec: SpecFactory) -> None:
    """Stop ends a server that honours SIGTERM without a kill; stopping again or after removal is fine."""
    workload = podman_runtime.start(make_spec())
    # Python as PID 1 ignores SIGTERM until it has installed its handler (as real vLLM does):
    # stop once the server has printed its first line.
    next(iter(podman_runtime.logs(workload.id, follow=True)))
    podman_runtime.stop(workload.id, timeout=30)
    stopped = podman_runtime.inspect(workload.id)
    assert stopped is not None and stopped.state == "exited" and stopped.exit_code != 137
    podman_runtime.stop(workload.id, timeout=30)
    podman_runtime.remove(workload.id)
    podman_runtime.stop(workload.id, timeout=1)
    podman_runtime.remove(workload.id)
    assert podman_runtime.inspect(workload.id) is None


def test_stop_kills_a_container_ignoring_sigterm(
    podman_runtime: PodmanRuntime, make_spec: SpecFactory, busybox_image: str
) -> None:
    """A server that ignores SIGTERM is killed (exit 137) once the stop timeout passes."""
    spec = make_spec(image=busybox_image, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    workload = podman_runtime.start(spec)
    podman_runtime.stop(workload.id, timeout=1)
    stopped = podman_runtime.inspect(workload.id)
    assert stopped is not None and stopped.state == "exited" and stopped.exit_code == 137
    podman_runtime.remove(workload.id)


def test_logs_wait_and_exit_events(podman_runtime: PodmanRuntime, make_spec: SpecFactory, deployment: str) -> None:
    """A crash ends the followed log, releases wait with the exit code, and is reported as an ExitEvent."""
    since = time.time() - 1
    workload = podman_runtime.start(
        make_spec(env={"FAKE_VLLM_BOOT_SECONDS": "0", "FAKE_VLLM_CRASH_AFTER_SECONDS": "3"})
    )
    assert podman_runtime.wait(workload.id, timeout=0.2) is None
    lines = list(podman_runtime.logs(workload.id, follow=True))
    assert "INFO:     Application startup complete." in lines
    assert all("\n" not in line for line in lines)
    assert list(podman_runtime.logs(workload.id)) == lines
    exited = podman_runtime.wait(workload.id, timeout=60)
    assert exited is not None and exited.exit_code not in (None, 0) and exited.deployment == deployment
    event = next(e for e in podman_runtime.events(since=since, until=time.time() + 60) if e.workload_id == workload.id)
    assert (event.deployment, event.exit_code, event.oom_killed) == (deployment, exited.exit_code, False)
    podman_runtime.remove(workload.id)
    gone = podman_runtime.wait(workload.id, timeout=5)
    assert gone is not None and gone.exit_code is None


def test_followed_log_is_read_from_the_k8s_file_with_cut_lines_joined(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory
) -> None:
    """Following a local container reads conmon's k8s-file, not the service's stream; lines conmon cut come
    whole, joined per stream (Podman 4.3's API joins a cut stdout line with the next stderr record); the
    stream ends once the container has exited."""
    name = "n" * 20000  # echoed in one `non-default args` line, longer than conmon's 8 KiB buffer
    workload = podman_runtime.start(
        make_spec(
            argv=("org/model", "--served-model-name", name, "--port", "8000"),
            env={"FAKE_VLLM_BOOT_SECONDS": "0", "FAKE_VLLM_CRASH_AFTER_SECONDS": "2"},
        )
    )
    streams_before = len(podman_env.requests_logged("/logs?"))
    followed = list(podman_runtime.logs(workload.id, follow=True))
    args_line = next(line for line in followed if "non-default args:" in line)
    assert name in args_line and args_line.rstrip("\r").endswith("}")  # cut by conmon, joined whole
    assert "INFO:     Application startup complete." in followed
    exited = podman_runtime.inspect(workload.id)
    assert exited is not None and exited.state in ("exited", "stopped")
    assert len(podman_env.requests_logged("/logs?", at_least=streams_before + 1, timeout=1)) == streams_before
    assert any(line.startswith("\rLoading safetensors checkpoint shards:") for line in followed)
    podman_runtime.remove(workload.id)


def test_server_errors_are_retried_client_errors_not(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str
) -> None:
    """A 5xx (port taken) is retried before failing with exit 3 and leaves nothing; a 404 is asked once."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        starts_before = len(podman_env.requests_logged("/start "))
        with pytest.raises(PodmanRequestFailed, match="address already in use") as info:
            podman_runtime.start(make_spec(port=port))
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    starts = podman_env.requests_logged("/start ", at_least=starts_before + 3)[starts_before:]
    assert len(starts) == 3 and all('" 500 ' in line for line in starts)
    assert podman_runtime.find(deployment) is None
    missing = f"no-such-{deployment}"
    assert podman_runtime.inspect(missing) is None
    asked = podman_env.requests_logged(f"/containers/{missing}/json", at_least=1)
    assert len(asked) == 1 and '" 404 ' in asked[0]


def test_pull_with_progress_from_local_registry(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, registry: str, deployment: str
) -> None:
    """An absent image is pulled with per-layer progress reports, and its digest is recorded."""
    reference = pull_test_image(podman_env, registry, deployment)
    reports: list[PullProgress] = []
    info = podman_runtime.ensure_image(reference, "missing", reports.append)
    assert reports and all(r.reference == reference for r in reports)
    assert {r.status for r in reports} >= {"Download complete"} and any(r.layer for r in reports)
    assert info.digest.startswith("sha256:")
    assert info.digest == podman_env.podman("image", "inspect", "--format", "{{.Digest}}", reference).stdout.strip()
    assert info.vllm_version == "0.33.0"
    podman_env.podman("rmi", reference)


def test_pull_policies(podman_runtime: PodmanRuntime, podman_env: PodmanEnv, registry: str, deployment: str) -> None:
    """never: an absent image is an exit-3 error; missing: a present image is not pulled; always: it is."""
    reference = pull_test_image(podman_env, registry, deployment)
    with pytest.raises(ImageUnavailable, match="'never'") as info:
        podman_runtime.ensure_image(reference, "never")
    assert info.value.exit_code == ExitCode.ENVIRONMENT
    podman_runtime.ensure_image(reference, "missing")
    reports: list[PullProgress] = []
    podman_runtime.ensure_image(reference, "missing", reports.append)
    podman_runtime.ensure_image(reference, "never", reports.append)
    assert reports == []
    podman_runtime.ensure_image(reference, "always", reports.append)
    assert reports
    podman_env.podman("rmi", reference)


def test_pull_of_unknown_image_names_it(podman_runtime: PodmanRuntime, registry: str) -> None:
    """A pull the registry cannot serve is an exit-3 error naming the reference and the registry's answer."""
    reference = f"{registry}/dankserve-test/absent:latest"
    with pytest.raises(ImageUnavailable, match="manifest unknown") as info:
        podman_runtime.ensure_image(reference, "missing")
    assert reference in info.value.message


def test_vllm_version_from_label_or_run_once_per_image(
    podman_env: PodmanEnv, busybox_image: str, gpus: StandInGpus, tmp_path: Path
) -> None:
    """The version comes from the image label, else from running `vllm --version` once per image ID (cached)."""
    labelled = busybox_vllm_image(podman_env, version_label=True)
    runtime = PodmanRuntime(podman_env.url, cache_dir=tmp_path, dev_root=gpus.dev_dir)
    creates = len(podman_env.requests_logged("/containers/create "))
    assert runtime.ensure_image(labelled, "never").vllm_version == "0.33.0"
    assert len(podman_env.requests_logged("/containers/create ")) == creates
    assert runtime.ensure_image(busybox_image, "never").vllm_version == "0.33.0"
    assert len(podman_env.requests_logged("/containers/create ", at_least=creates + 1)) == creates + 1
    image_id = podman_env.podman("image", "inspect", "--format", "{{.Id}}", busybox_image).stdout.strip()
    assert json.loads((tmp_path / "vllm-versions.json").read_text()) == {image_id: "0.33.0"}
    again = PodmanRuntime(podman_env.url, cache_dir=tmp_path, dev_root=gpus.dev_dir)
    assert again.ensure_image(busybox_image, "missing").vllm_version == "0.33.0"
    assert len(podman_env.requests_logged("/containers/create ", at_least=creates + 1)) == creates + 1
    runtime.close()
    again.close()


def test_harness_leaves_host_config_alone(podman_env: PodmanEnv) -> None:
    """The harness's service runs on its own containers.conf and storage, not the host's."""
    assert os.environ.get("CONTAINERS_CONF") != podman_env.env["CONTAINERS_CONF"]
    assert str(podman_env.workdir) in podman_env.env["CONTAINERS_CONF"]
    info = json.loads(podman_env.podman("info", "--format", "json").stdout)
    assert info["store"]["graphRoot"] != "/var/lib/containers/storage"
    assert info["host"]["ociRuntime"]["name"] == "runc"


def test_a_paused_service_fails_a_request_as_transient(podman_env: PodmanEnv, tmp_path: Path) -> None:
    """Podman paused (SIGSTOP) past the request timeout: the request fails as transient (waited out, never a
    failure of the deployment); resumed (SIGCONT), it answers again."""
    service = RestartableService(podman_env, tmp_path / "paused-podman")
    service.start()
    try:
        runtime = PodmanRuntime(service.url, request_timeout=1.0, attempts=1)
        service.pause()
        with pytest.raises(PodmanRequestFailed, match="did not answer in time") as info:
            runtime.find("paused")
        assert info.value.transient
        service.resume()
        assert runtime.find("paused") is None
        runtime.close()
    finally:
        service.resume()
        service.stop()


def test_network_backend_is_read_from_the_service(podman_env: PodmanEnv, podman_runtime: PodmanRuntime) -> None:
    """The service names its network backend, as `podman info` does (the doctor's CNI check reads it)."""
    expected = podman_env.podman("info", "--format", "{{.Host.NetworkBackend}}").stdout.strip()
    assert podman_runtime.network_backend() == expected
    assert expected in {"cni", "netavark"}


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_stand_in_sleep_mode_in_a_container(podman_runtime: PodmanRuntime, make_spec: SpecFactory) -> None:
    """The stand-in image with --enable-sleep-mode and dev mode: level-1 sleep and wake, the level-2 staged
    wake with reload_weights, and completions after each, through the published port."""
    spec = make_spec(
        argv=("test/model", "--port", "8000", "--enable-sleep-mode"),
        env={"FAKE_VLLM_BOOT_SECONDS": "0", "VLLM_SERVER_DEV_MODE": "1"},
    )
    workload = podman_runtime.start(spec)
    base = f"http://127.0.0.1:{spec.port}"
    wait_for_http(base + "/health")
    completion = {"model": "test/model", "prompt": "x", "max_tokens": 3}

    def text() -> str:
        status, body = _call("POST", base + "/v1/completions", completion)
        assert status == 200, body
        return str(json.loads(body)["choices"][0]["text"])

    assert _call("POST", base + "/sleep?level=1")[0] == 200
    assert json.loads(_call("GET", base + "/is_sleeping")[1]) == {"is_sleeping": True}
    assert _call("POST", base + "/v1/completions", completion)[0] == 503
    assert _call("POST", base + "/wake_up")[0] == 200
    assert text() == "The stand-in vLLM"
    assert _call("POST", base + "/sleep?level=2")[0] == 200
    assert _call("POST", base + "/wake_up?tags=weights")[0] == 200
    assert _call("POST", base + "/collective_rpc", {"method": "reload_weights"})[0] == 200
    assert _call("POST", base + "/wake_up?tags=kv_cache")[0] == 200
    assert _call("POST", base + "/reset_prefix_cache")[0] == 200
    assert text() == "The stand-in vLLM"
    logs = "\n".join(podman_runtime.logs(workload.id, follow=False))
    assert "Sleep mode freed" in logs and "seconds to fall asleep." in logs and "seconds to wake up tags" in logs
    podman_runtime.remove(workload.id)
