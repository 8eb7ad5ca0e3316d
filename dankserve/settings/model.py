"""The whole settings model: the global keys, the sections and the deployments (docs/CONFIGURATION.md renders it)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dankserve.settings.deployment import DeploymentSettings
from dankserve.settings.sections import ClusterSettings, GatewaySettings
from dankserve.settings.upgrade import UpgradeTable
from dankserve.settings.values import (
    MAX_NAME_LENGTH,
    MAX_SECONDS,
    is_loopback,
    parse_listen,
    reject_bool_for_non_bool,
    reject_nul,
    split_listen,
)

DEFAULT_HF_CACHE_DIR = Path("/var/cache/dankserve/huggingface")


def default_hf_cache_dir(environ: Mapping[str, str]) -> Path:
    """hf_cache_dir when the config leaves it out: huggingface_hub's own HF_HOME / HF_HUB_CACHE.

    The container mounts this directory at /root/.cache/huggingface and vLLM reads hub/ below it,
    so an HF_HUB_CACHE is taken only when it is such a hub/ directory.
    """
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"])
    hub_cache = environ.get("HF_HUB_CACHE")
    if hub_cache and Path(hub_cache).name == "hub":
        return Path(hub_cache).parent
    return DEFAULT_HF_CACHE_DIR


def keyless_gateway_exposure(settings: Settings, name: str) -> str | None:
    """Why deployment `name`'s key protects nothing (None: it does): a gateway without a key passes the key on
    to it, so every local user reaches the deployment through the gateway's loopback address."""
    gateway = settings.gateway
    dep = settings.deployments.get(name)
    if gateway is None or gateway.api_key_file is not None or dep is None or dep.api_key_file is None:
        return None
    return (
        f"deployment {name!r} has an api_key_file, but the gateway at {gateway.listen} has none and passes the "
        "deployment's key on: any local user reaches it through the gateway without a key; set [gateway] "
        "api_key_file"
    )


class Settings(UpgradeTable, BaseSettings):
    """Global settings and the deployments."""

    model_config = SettingsConfigDict(
        env_prefix="DANKSERVE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    podman_url: str = Field(default="unix:///run/podman/podman.sock", description="Podman REST API URL.")
    state_dir: Path = Field(default=Path("/var/lib/dankserve"), description="Learned boot facts, pid, control socket.")
    cache_dir: Path = Field(default=Path("/var/cache/dankserve"), description="Per-deployment torch.compile caches.")
    snapshot_max_bytes: int = Field(
        default=64 * 2**30,
        ge=0,
        le=2**50,
        description="Disk budget of the snapshots under state_dir/snapshots; the least recently used go first "
        "(docs/snapshots.md). 0: no snapshot is kept.",
    )
    hf_cache_dir: Path = Field(
        default_factory=lambda: default_hf_cache_dir(os.environ),
        description="Hugging Face cache (HF_HOME layout: models under hub/), mounted at /root/.cache/huggingface; "
        "unset: $HF_HOME, else the parent of $HF_HUB_CACHE when that ends in /hub, else "
        "/var/cache/dankserve/huggingface.",
    )
    vllm_version: str | None = Field(default=None, description="vLLM version when the image cannot tell.")
    restart_backoff_initial_seconds: float = Field(
        default=2.0, ge=0, le=MAX_SECONDS, description="Second retry's delay (the first is immediate)."
    )
    restart_backoff_max_seconds: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS, description="Longest delay between restarts."
    )
    restart_backoff_multiplier: float = Field(default=2.0, ge=1, description="Growth of the delay per failure.")
    restart_jitter_seconds: float = Field(
        default=1.0, ge=0, le=MAX_SECONDS, description="Random jitter added to each delay."
    )
    failure_window_seconds: float = Field(
        default=900.0, gt=0, le=MAX_SECONDS, description="Window in which failures are counted."
    )
    max_failures_in_window: int = Field(default=5, ge=1, description="More failures in the window: failed.")
    boot_timeout_seconds: float = Field(
        default=1800.0, gt=0, le=MAX_SECONDS, description="No readiness within this: restart."
    )
    stop_timeout_seconds: float = Field(default=60.0, gt=0, le=MAX_SECONDS, description="Graceful stop before a kill.")
    gpu_memory_settle_seconds: float = Field(
        default=30.0,
        ge=0,
        le=MAX_SECONDS,
        description="After a server dies, wait up to this long for its GPU memory to be freed before "
        "giving up on the learned KV size and profiling.",
    )
    health_interval_seconds: float = Field(
        default=3.0, gt=0, le=MAX_SECONDS, description="Health probe period while ready."
    )
    gateway: GatewaySettings | None = Field(
        default=None, description="One OpenAI endpoint for every deployment, routed by model name."
    )
    metrics_listen: str | None = Field(
        default=None,
        description='Serve Prometheus metrics on HOST:PORT (e.g. "127.0.0.1:9400"); unset: no metrics endpoint. '
        "Beyond loopback anyone who can reach it reads the deployments' names, models and load.",
    )
    metrics_api_key_file: Path | None = Field(
        default=None,
        description="File holding the key a scrape must send as `Authorization: Bearer KEY` (Prometheus' "
        "`authorization: {credentials_file: ...}`), mode 0600; unset: /metrics answers anyone who reaches it.",
    )
    serving_scrape_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        le=MAX_SECONDS,
        description="How often each ready server's /metrics and the GPUs' memory are read (in the background).",
    )
    stall_seconds: float = Field(
        default=120.0,
        ge=0,
        le=MAX_SECONDS,
        description="Requests pending but no token processed for this long: the engine hangs (0: no stall check).",
    )
    liveness_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        le=MAX_SECONDS,
        description="While idle, a one-token completion at most this often; two failures in a row: the engine "
        "hangs (0: no token probe).",
    )
    liveness_timeout_seconds: float = Field(
        default=30.0, gt=0, le=MAX_SECONDS, description="How long a token probe may take before it counts as failed."
    )
    preemption_warning_interval_seconds: float = Field(
        default=300.0,
        gt=0,
        le=MAX_SECONDS,
        description="Rising preemptions are warned about (log and status) at most this often per deployment.",
    )
    log_format: Literal["auto", "console", "json", "journald"] = Field(default="auto", description="Daemon log output.")
    cluster: ClusterSettings | None = Field(default=None, description="Multi-host groups: this daemon's cluster API.")
    deployments: dict[str, DeploymentSettings] = Field(default_factory=dict)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_non_bool(cls, value: Any, info: ValidationInfo) -> Any:
        value = reject_bool_for_non_bool(cls, value, info.field_name)
        return value if isinstance(value, dict) else reject_nul(value)  # the sections check their own keys

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_address(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @field_validator("deployments")
    @classmethod
    def _names_are_plain(cls, value: dict[str, DeploymentSettings]) -> dict[str, DeploymentSettings]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):  # ASCII: it becomes a container name
                raise ValueError(f"deployment name {name!r} may hold only letters, digits, '-' and '_'")
            if len(name) > MAX_NAME_LENGTH:  # it names files, a container and a pod: keep them all legal
                raise ValueError(
                    f"deployment name {name[:20]!r}... is {len(name)} characters long: at most {MAX_NAME_LENGTH}"
                )
        return value

    def serves_on_socket(self, dep: DeploymentSettings) -> bool:
        """Whether the deployment's server listens on its private unix socket (listen = socket, or auto with
        a [gateway]) rather than on TCP host:port: the one reading of `listen`."""
        return dep.listen == "socket" or (dep.listen == "auto" and self.gateway is not None)

    @model_validator(mode="after")
    def _one_deployment_per_port(self) -> Settings:
        seen: dict[tuple[str, int], str] = {}
        for name, dep in self.deployments.items():
            if self.serves_on_socket(dep):
                continue  # its port is unused
            for other_key, other in seen.items():
                same_addr = other_key[0] == dep.host or "0.0.0.0" in (other_key[0], dep.host)
                if other_key[1] == dep.port and same_addr:
                    raise ValueError(
                        f"deployments {other!r} and {name!r} both use port {dep.port}: "
                        "give each deployment its own port"
                    )
            seen[(dep.host, dep.port)] = name
        return self

    @model_validator(mode="after")
    def _swap_groups_are_whole(self) -> Settings:
        members: dict[str, list[str]] = {}
        for name, dep in self.deployments.items():
            if dep.swap_group is not None and dep.enabled:
                members.setdefault(dep.swap_group, []).append(name)
        for group, names in members.items():
            runtimes = {self.deployments[n].runtime for n in names}
            if len(runtimes) > 1:
                raise ValueError(
                    f"swap group {group!r} mixes runtimes ({', '.join(sorted(runtimes))}): give its members "
                    "(" + ", ".join(names) + ") the same runtime"
                )
        return self

    @model_validator(mode="after")
    def _gateway_names_are_unique(self) -> Settings:
        if self.gateway is None:
            return self
        owner: dict[str, str] = {}
        for name, dep in self.deployments.items():
            for model in [dep.served_model_name or dep.model, *dep.aliases, *dep.adapters]:
                if owner.get(model, name) != name:
                    raise ValueError(
                        f"deployments {owner[model]!r} and {name!r} both answer to model {model!r} at the gateway: "
                        "give each a distinct served_model_name, alias or adapter name"
                    )
                owner[model] = name
            if not is_loopback(dep.host) and not self.serves_on_socket(dep):
                raise ValueError(
                    f"deployments.{name}.host = {dep.host!r}: behind the gateway every server listens on loopback "
                    'only (clients reach it through [gateway] listen); set host = "127.0.0.1", or listen = "socket"'
                )
        _, gateway_port = split_listen(self.gateway.listen)
        for name, dep in self.deployments.items():
            if dep.port == gateway_port and not self.serves_on_socket(dep):
                raise ValueError(f"deployments.{name}.port = {dep.port} is the gateway's port: give it another")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; env overrides them.
        return (env_settings, init_settings)
