"""A snapshot deployment's secrets as dankserve's files bind-mounted into its container instead of Podman
secrets (issue 41, runtime/podman/secret_mounts.py): a restore with import mounts what the archive names, a path
that outlives the container. Pure parts first, then the real Podman service."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dankserve.errors import ConfigError, PodmanRequestFailed
from dankserve.runtime.base import SecretFile, WorkloadSpec, workload_name
from dankserve.runtime.podman import PodmanRuntime, secret_mounts
from dankserve.runtime.podman.cdi import GpuPassthrough
from dankserve.runtime.podman.spec import container_create_kwargs
from dankserve.snapshot.key import SnapshotKey, invalid_reason, secrets_digest
from tests.harness.podman_service import PodmanEnv

SpecFactory = Callable[..., WorkloadSpec]


def _secret(tmp_path: Path, name: str, value: str, env_var: str) -> SecretFile:
    path = tmp_path / f"{name}.src"
    path.write_text(value + "\n")
    path.chmod(0o600)
    return SecretFile(name, path, env_var)


def test_the_create_request_mounts_the_files_read_only_where_podman_mounts_secrets(tmp_path: Path) -> None:
    secrets = (
        SecretFile("hf_token", Path("/k/hf"), "HF_TOKEN_PATH"),
        SecretFile("api_key", Path("/k/a"), "VLLM_API_KEY"),
    )
    spec = WorkloadSpec("chat", "img", ("m",), {}, 9000, secrets=secrets, secrets_dir=tmp_path / "s")
    kwargs = container_create_kwargs(spec, gpu=GpuPassthrough("cdi", ()), journald=False, secret_ids={})
    assert kwargs["secrets"] == []
    assert {
        "type": "bind",
        "source": str(tmp_path / "s" / "api_key"),
        "target": "/run/secrets/api_key",
        "read_only": True,
    } in kwargs["mounts"]
    assert kwargs["labels"][secret_mounts.LABEL_SECRETS_DIR] == str(tmp_path / "s")
    assert kwargs["environment"]["HF_TOKEN_PATH"] == "/run/secrets/hf_token"


def test_files_are_written_0600_in_a_0700_directory_and_a_bad_source_writes_nothing(tmp_path: Path) -> None:
    good = _secret(tmp_path, "api_key", "k-1", "VLLM_API_KEY")
    target = tmp_path / "secrets" / "chat"
    secret_mounts.write(target, (good,))
    assert (target / "api_key").read_bytes() == b"k-1"
    assert ((target / "api_key").stat().st_mode & 0o777, target.stat().st_mode & 0o777) == (0o600, 0o700)
    assert target.parent.stat().st_mode & 0o777 == 0o700
    loose = _secret(tmp_path, "hf_token", "t", "HF_TOKEN_PATH")
    loose.source.chmod(0o644)
    (target / "api_key").unlink()
    with pytest.raises(ConfigError, match="open to others"):
        secret_mounts.write(target, (good, loose))
    assert not (target / "api_key").exists(), "all read before any is written"


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="not a directory of this user's"):
        secret_mounts.write(tmp_path / "link", (_secret(tmp_path, "api_key", "k", "VLLM_API_KEY"),))
    assert not (elsewhere / "api_key").exists()


def test_removal_deletes_only_the_labelled_directorys_files_its_mounts_name(tmp_path: Path) -> None:
    """A label or a mount naming another file (or a symlink) deletes nothing else."""
    ours, other = tmp_path / "ours", tmp_path / "other"
    ours.mkdir()
    other.mkdir()
    for path in (ours / "api_key", other / "api_key"):
        path.write_text("x")
    (ours / "hf_token").symlink_to(other / "api_key")
    attrs = {
        "Config": {"Labels": {secret_mounts.LABEL_SECRETS_DIR: str(ours)}},
        "Mounts": [
            {"Source": str(ours / "api_key"), "Destination": "/run/secrets/api_key"},
            {"Source": str(ours / "hf_token"), "Destination": "/run/secrets/hf_token"},
            {"Source": str(other / "api_key"), "Destination": "/run/secrets/x"},
            {"Source": str(ours / "api_key2"), "Destination": "/data"},
        ],
    }
    secret_mounts.remove(attrs)
    assert not (ours / "api_key").exists()
    assert (other / "api_key").exists() and (ours / "hf_token").is_symlink()
    secret_mounts.remove({"Config": {"Labels": {secret_mounts.LABEL_SECRETS_DIR: "relative"}}, "Mounts": []})


def test_the_key_holds_the_secrets_digest_and_never_shows_it() -> None:
    base = dict(
        argv=("m",), env={}, image_digest="d", vllm_version="v", driver_version="1", gpu_model="g", gpu_uuid="u",
        kernel_release="k", criu_version="c", dankserve_version="x", weights=(),
    )  # fmt: skip
    old = SnapshotKey.of(**base, secrets=secrets_digest([("api_key", b"old-key")]))  # type: ignore[arg-type]
    new = SnapshotKey.of(**base, secrets=secrets_digest([("api_key", b"new-key")]))  # type: ignore[arg-type]
    assert secrets_digest([]) == "" and old.secrets.startswith("sha256:")
    why = invalid_reason(old, new)
    assert why == "the secret files' contents (hf_token_file, api_key_file) changed since the capture"
    assert invalid_reason(old, old) is None


@pytest.mark.podman
def test_a_container_gets_the_files_not_podman_secrets_and_they_go_with_it(
    podman_runtime: PodmanRuntime, podman_env: PodmanEnv, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """The token reaches vLLM as a file, the key as a value, no Podman secret is made, inspect shows no value, and
    removing the container deletes the files (a failed create leaves none)."""
    token, key = "hf_MOUNTED_5a1c", "sk-MOUNTED-9e02"
    secrets = (_secret(tmp_path, "hf_token", token, "HF_TOKEN_PATH"), _secret(tmp_path, "api_key", key, "VLLM_API_KEY"))
    directory = tmp_path / "state" / "secrets" / deployment
    workload = podman_runtime.start(make_spec(secrets=secrets, secrets_dir=directory))
    assert podman_env.podman("exec", workload.name, "sh", "-c", 'cat "$HF_TOKEN_PATH"').stdout == token
    assert workload.pid is not None
    assert f"VLLM_API_KEY={key}".encode() in Path(f"/proc/{workload.pid}/environ").read_bytes().split(b"\0")
    names = podman_env.podman("secret", "ls", "--format", "{{.Name}}").stdout.split()
    assert not [n for n in names if n.startswith(workload_name(deployment) + ".")]
    inspected = podman_env.podman("inspect", workload.name).stdout
    assert token not in inspected and key not in inspected
    assert json.loads(inspected)[0]["Config"]["Labels"][secret_mounts.LABEL_SECRETS_DIR] == str(directory)
    podman_runtime.remove(workload.id)
    assert sorted(os.listdir(directory)) == []
    with pytest.raises(PodmanRequestFailed, match="image not known"):
        podman_runtime.start(
            make_spec(image="localhost/dankserve-test-absent:none", secrets=secrets, secrets_dir=directory)
        )
    assert sorted(os.listdir(directory)) == []


@pytest.mark.podman
def test_the_files_stay_while_another_container_mounts_them(
    podman_runtime: PodmanRuntime, make_spec: SpecFactory, deployment: str, tmp_path: Path
) -> None:
    """An upgrade's trial mounts the same files as the container it replaces: removing the old one keeps them
    (the trial's restore in place at its capture mounts them again); removing the last one deletes them."""
    import dataclasses

    secrets = (_secret(tmp_path, "api_key", "k-trial", "VLLM_API_KEY"),)
    directory = tmp_path / "state" / "secrets" / deployment
    old = podman_runtime.start(make_spec(secrets=secrets, secrets_dir=directory))
    spec = make_spec(secrets=secrets, secrets_dir=directory)
    trial = podman_runtime.start(dataclasses.replace(spec, deployment=deployment + "-trial", port=spec.port + 1))
    podman_runtime.remove(old.id)
    assert (directory / "api_key").read_bytes() == b"k-trial"
    podman_runtime.remove(trial.id)
    assert not (directory / "api_key").exists()


def test_host_ipc_is_told_by_the_process_namespace_as_podman_4_3_inspect_says_shareable_for_both() -> None:
    """Podman 4.3.1's inspect says `shareable` for ipc=host as for a private namespace: the capture asks the
    container's process whether its IPC namespace is this one's (the host's)."""
    from dankserve.runtime.podman.checkpoint import shared_shm

    shareable = {"HostConfig": {"IpcMode": "shareable"}}
    assert shared_shm(shareable, os.getpid())
    assert not shared_shm(shareable, None) and not shared_shm(shareable, 1 << 30)  # no such process
    assert shared_shm({"HostConfig": {"IpcMode": "host"}})
