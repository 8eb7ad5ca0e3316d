"""A deployment's secrets (hf_token_file, api_key_file) as the runtimes take them, and as a snapshot's key
reads them (issue 41: a server restored holds what it read at capture, so a changed file must not restore it)."""

from __future__ import annotations

from dankserve.errors import DankserveError
from dankserve.runtime.base import SecretFile
from dankserve.secret_files import read_secret
from dankserve.settings import DeploymentSettings


def secret_files(dep: DeploymentSettings) -> tuple[SecretFile, ...]:
    """The deployment's secrets: the files they are read from and how vLLM learns of each."""
    secrets: list[SecretFile] = []
    if dep.hf_token_file is not None:
        secrets.append(SecretFile("hf_token", dep.hf_token_file, "HF_TOKEN_PATH"))
    if dep.api_key_file is not None:
        secrets.append(SecretFile("api_key", dep.api_key_file, "VLLM_API_KEY"))
    return tuple(secrets)


def secret_values(dep: DeploymentSettings) -> list[tuple[str, bytes]]:
    """The deployment's secrets as the server reads them; one that cannot be read now gives its reason instead,
    so a snapshot key made of them differs from any capture's."""
    values = []
    for secret in secret_files(dep):
        try:
            values.append((secret.name, read_secret(secret.source, secret.name)))
        except DankserveError as exc:
            values.append((secret.name, f"unreadable: {exc.message}".encode()))
    return values
