"""Where the Hub and the HF cache are, and the token: from the settings and the environment.

Honours `HF_ENDPOINT` (another Hub or a mirror), `HF_HUB_OFFLINE` (no network at all), the
deployment's `hf_token_file` (else huggingface_hub's own `HF_TOKEN` / stored token) and
`revision`. The cache is `hf_cache_dir/hub`, the layout vLLM reads through the container's
`/root/.cache/huggingface` mount; `hf_cache_dir` itself defaults to `HF_HOME` (see settings).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dankserve.errors import ConfigError
from dankserve.secret_files import read_secret

DEFAULT_ENDPOINT = "https://huggingface.co"
TRUE_VALUES = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubAccess:
    """How to reach one model on the Hub and where its files are cached."""

    endpoint: str
    cache_dir: Path
    """The hub cache (`models--ORG--NAME/...`)."""
    token: str | None
    """None: huggingface_hub's own lookup (HF_TOKEN, the stored token)."""
    offline: bool
    facts_dir: Path
    """Model facts read from the Hub, kept under the state dir."""


def is_hub_id(model: str) -> bool:
    """Whether a model names a Hub repo (ORG/NAME), not a local path."""
    return not model.startswith(("/", ".", "~")) and model.count("/") == 1


def is_local_path(model: str) -> bool:
    """Whether a model is written as a path (vLLM then reads that directory), not as a Hub repo id.

    A Hub repo id is ORG/NAME (or a bare NAME, which may be a canonical Hub model); a path starts with
    '/', '.' or '~', or has more than one '/' (huggingface_hub allows one)."""
    return not is_hub_id(model) and (model.startswith(("/", ".", "~")) or "/" in model)


def offline_mode(environ: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it."""
    return environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE_VALUES


def read_token(path: Path | None, deployment: str) -> str | None:
    """The token in `hf_token_file` (None when unset); a missing, empty or untrusted file is a config error."""
    if path is None:
        return None
    what = f"deployments.{deployment}.hf_token_file"
    try:
        token = read_secret(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} file {path} is not UTF-8 text", fix=f"write the token into {path}") from None
    return token


def hub_access(
    hf_cache_dir: Path,
    state_dir: Path,
    deployment: str,
    token_file: Path | None,
    environ: Mapping[str, str] | None = None,
) -> HubAccess:
    """The access of one deployment."""
    env = os.environ if environ is None else environ
    return HubAccess(
        endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"),
        cache_dir=hf_cache_dir / "hub",
        token=read_token(token_file, deployment),
        offline=offline_mode(env),
        facts_dir=state_dir / "model-facts",
    )
