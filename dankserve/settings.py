"""dankserve's settings: one TOML file plus ``DANKSERVE_*`` variables, validated by pydantic.

Every key that any part of dankserve reads is declared here, with its default and its
meaning, so keys never change names. `docs/CONFIGURATION.md` is generated from this module.

Where the file lives: ``--config FILE``, else ``$DANKSERVE_CONFIG``, else
``/etc/dankserve/dankserve.toml``. A missing default file means "no deployments"; a missing
file that was named explicitly is an error. Environment variables override the file:
``DANKSERVE_PODMAN_URL``, ``DANKSERVE_STATE_DIR`` ... and nested keys with ``__``
(``DANKSERVE_DEPLOYMENTS__CHAT__PORT=8001``).

Security rules enforced here (each refusal is a ConfigError, exit 2, naming the key, the value
and the fix): a deployment bound to a non-loopback ``host`` must set ``api_key_file``; the
config file must not be writable by group or others nor owned by anyone but root or the user
running dankserve (it decides what runs as root); a secret file (``api_key_file``,
``hf_token_file``, ``cluster_token_file``) that exists must not be writable by its group nor
readable or writable by others.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dankserve.errors import ConfigError
from dankserve.lora_adapters import LoraAdaptersTable, LoraModelSizes
from dankserve.owned import env_problems, extra_args_problems
from dankserve.settings_upgrade import UpgradeTable

DEFAULT_CONFIG_PATH = Path("/etc/dankserve/dankserve.toml")
DEFAULT_IMAGE = "docker.io/vllm/vllm-openai:v0.33.0"
CONFIG_ENV = "DANKSERVE_CONFIG"

PullPolicy = Literal["missing", "always", "never"]
RuntimeKind = Literal["podman", "process"]
Profile = Literal["throughput", "latency"]


MAX_SECONDS = 7 * 24 * 3600.0
"""Upper bound of every duration setting: beyond a week is a typo (and overflows timers)."""
MAX_GIB = 1_000_000.0
"""Upper bound of every GiB amount (a petabyte)."""


def _takes_bool(annotation: Any) -> bool:
    """Whether a field's type accepts a boolean (bool itself, or a union holding it)."""
    if annotation is bool:
        return True
    return any(_takes_bool(arg) for arg in get_args(annotation) if get_origin(annotation) is not list)


def reject_bool_for_non_bool(model: type[BaseModel], value: Any, field_name: str | None) -> Any:
    """A TOML `true` where a number, text or list of them is expected is a type error, not 1.

    (pydantic's lax mode would read `port = true` as port 1.)
    """
    field = model.model_fields.get(field_name or "")
    if field is None or _takes_bool(field.annotation):
        return value
    items = value if isinstance(value, list) else [value]
    if any(isinstance(item, bool) for item in items):
        expected = getattr(field.annotation, "__name__", None) or str(field.annotation).replace("typing.", "")
        raise ValueError(f"a boolean ({value!r}) where {expected} is expected")
    return value


def reject_nul(value: Any) -> Any:
    """A NUL byte anywhere in a text value (or a table's key) is a config error: no program argument,
    environment variable or path can carry one, so the server would never start."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str) and "\x00" in item:
            raise ValueError(
                "holds a NUL byte (\\u0000), which no argument, environment variable or path can carry: remove it"
            )
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            pending += list(item)
    return value


MAX_NAME_LENGTH = 63
"""A deployment's name becomes container, file and DNS-label names (63 is a label's limit)."""


class _Strict(BaseModel):
    """A settings section: unknown keys are errors, values are frozen once loaded, no NaN or
    infinity, no boolean standing in for a number."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_non_bool(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_nul(reject_bool_for_non_bool(cls, value, info.field_name))


class SpeculativeSettings(_Strict):
    """Speculative decoding, passed to vLLM as ``--speculative-config`` JSON."""

    method: str = Field(description="vLLM speculative method: ngram, draft_model, eagle3, dflash, mtp ...")
    model: str | None = Field(default=None, description="Draft model (HF id or path), when the method needs one.")
    tokens: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Speculative tokens per step; unset: 8 for the throughput profile, 16 for latency.",
    )


class CpuOffloadSettings(_Strict):
    """Weights offloaded to CPU memory (vLLM UVA offload). Opt-in: it costs much latency."""

    gib: float = Field(gt=0, le=MAX_GIB, description="GiB of weights per GPU to keep in CPU memory (--cpu-offload-gb).")
    params: list[str] = Field(
        default_factory=list,
        description="Parameter name patterns to offload, e.g. ['experts'] (--cpu-offload-params).",
    )


class ModelFactsSettings(LoraModelSizes, _Strict):
    """Model facts declared by hand, used when the HF cache does not hold the model's files."""

    parameter_bytes: int | None = Field(default=None, gt=0, description="Total bytes of the weights.")
    num_attention_heads: int | None = Field(default=None, gt=0)
    num_key_value_heads: int | None = Field(default=None, gt=0)
    num_hidden_layers: int | None = Field(default=None, gt=0)
    head_dim: int | None = Field(default=None, gt=0)
    max_position_embeddings: int | None = Field(default=None, gt=0)
    moe: bool | None = Field(default=None, description="Mixture-of-experts model.")
    quantization: str | None = Field(default=None, description="e.g. fp8, awq, gptq; unset: unquantised.")
    dtype_bytes: int | None = Field(
        default=None, gt=0, description="Bytes per KV element of the model dtype (2 for bf16)."
    )


class ClusterSettings(_Strict):
    """This daemon's part in multi-host groups: the API other daemons call (see docs/MULTI-HOST.md)."""

    listen: str = Field(
        description="ADDRESS:PORT the cluster API binds to; ADDRESS is also this host's Ray node address."
    )
    token_file: Path = Field(description="File holding the group's shared token (the same on every host).")
    tls_ca_file: Path = Field(
        description="The group's CA certificate (PEM): peers' certificates must be signed by it (docs/MULTI-HOST.md)."
    )
    tls_cert_file: Path = Field(
        description="This host's certificate (PEM), signed by the group's CA, naming the listen address."
    )
    tls_key_file: Path = Field(description="This host's private key (PEM, mode 0600).")
    max_connections: int = Field(
        default=64, ge=1, le=4096, description="Open connections the cluster API accepts at once; more are closed."
    )
    header_timeout_seconds: float = Field(
        default=5.0, gt=0, le=300, description="A peer must finish the TLS handshake and headers within this."
    )
    body_timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="A request body must arrive within this."
    )
    ray_executable: str | None = Field(default=None, description="The `ray` CLI; unset: beside dankserve's Python.")
    ray_port: int = Field(default=6379, ge=1, le=65535, description="Port of the Ray head (GCS) on a leader.")

    @field_validator("listen")
    @classmethod
    def _listen_is_an_address(cls, value: str) -> str:
        return check_address(value, default_port=7390)  # the cluster API's port


class GatewaySettings(_Strict):
    """One OpenAI endpoint in front of every deployment, routed by the request's `model` (docs/GATEWAY.md)."""

    listen: str = Field(
        default="127.0.0.1:9000",
        description="ADDRESS:PORT of the endpoint. Beyond loopback, api_key_file is required.",
    )
    api_key_file: Path | None = Field(
        default=None, description="File holding the key clients send as `Authorization: Bearer KEY` (mode 0600)."
    )
    queue_size: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description="Requests that may wait per deployment while it boots or wakes; more get 503.",
    )
    queue_timeout_seconds: float = Field(
        default=120.0, gt=0, le=MAX_SECONDS, description="A waiting request gets 503 after this long."
    )
    retry_after_seconds: int = Field(
        default=5, ge=1, le=3600, description="A 503's Retry-After when no boot or wake history predicts the wait."
    )
    max_swaps_per_minute: int = Field(
        default=12,
        ge=1,
        le=10_000,
        description="Swaps (a wake that puts others to sleep) each swap group may begin per minute; requests "
        "beyond it wait for the next allowed swap, or get 503 + Retry-After when that is past queue_timeout_seconds.",
    )
    max_request_bytes: int = Field(
        default=32 * 1024 * 1024, ge=1024, le=1 << 31, description="Largest request body accepted (413 beyond)."
    )
    max_connections: int = Field(
        default=512, ge=1, le=100_000, description="Open client connections at once; more are closed at once."
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0, le=3600, description="A client must send a request's headers within this."
    )
    body_timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="A request body must arrive within this."
    )

    @field_validator("listen")
    @classmethod
    def _listen_is_an_address(cls, value: str) -> str:
        return check_address(value)

    @model_validator(mode="after")
    def _exposed_gateway_needs_a_key(self) -> GatewaySettings:
        host, _ = split_listen(self.listen)
        if not is_loopback(host) and self.api_key_file is None:
            raise ValueError(
                f"listen = {self.listen!r} is not a loopback address and no api_key_file is set: anyone who can "
                "reach that address could use every deployment. Set api_key_file to a file (mode 0600) holding "
                'the key, or listen on "127.0.0.1:PORT"'
            )
        return self


def check_address(value: str, default_port: int = 0) -> str:
    """The value, when it is ADDRESS:PORT (or ADDRESS with a default port); ValueError otherwise."""
    host, port = split_listen(value, default_port)
    if not host or not 1 <= port <= 65535:
        raise ValueError(f"{value!r} is not ADDRESS:PORT")
    return value


def split_listen(address: str, default_port: int = 0) -> tuple[str, int]:
    """'HOST:PORT' (or 'HOST', or '[v6]:PORT') as (host, port); a port that is not a number is -1."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else str(default_port)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, str(default_port)
    return host, int(port_text) if port_text.isdigit() else -1


class DeploymentSettings(LoraAdaptersTable, _Strict):
    """One served model: a ``[deployments.NAME]`` table."""

    model: str = Field(min_length=1, description="HF model id (ORG/NAME) or a path inside the HF cache.")
    revision: str | None = Field(default=None, min_length=1, description="HF revision (branch, tag or commit).")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="The vLLM OpenAI server image.")
    pull: PullPolicy = Field(default="missing", description="When to pull the image.")
    runtime: RuntimeKind = Field(
        default="podman", description="podman: a container; process: a plain `vllm serve` process."
    )
    executable: str | None = Field(
        default=None,
        description="process runtime: the `vllm` executable or a Python interpreter with vLLM installed.",
    )
    host: str = Field(
        default="127.0.0.1",
        description="Address the server binds to on the host. Beyond loopback, api_key_file is required.",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="Port the server listens on.")
    api_key_file: Path | None = Field(
        default=None, description="File holding the server's API key (mode 0600 or 0640: never readable by others)."
    )
    hf_token_file: Path | None = Field(
        default=None, description="File holding the Hugging Face token (mode 0600 or 0640: never readable by others)."
    )
    gpus: list[int | str] | None = Field(default=None, description="GPU indices or UUIDs; unset: all GPUs.")
    tensor_parallel_size: int | None = Field(default=None, ge=1, description="Unset: the fewest GPUs that fit.")
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of each GPU vLLM may use; unset: from the table by GPU size. Set to share a GPU.",
    )
    max_model_len: int | Literal["auto"] | None = Field(default=None, description="Context length, or auto.")
    kv_cache_dtype: str | None = Field(default=None, description="Unset: fp8 where supported, else auto.")
    attention_backend: str | None = Field(default=None, description="vLLM attention backend, e.g. FLASH_ATTN.")
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs: faster start, slower serving.")
    speculative: SpeculativeSettings | None = None
    cpu_offload: CpuOffloadSettings | None = None
    kv_offload: float | Literal["auto", "off"] = Field(
        default="auto",
        description="CPU KV-cache offload in GiB (total over TP ranks), auto (by RAM, shared on auto), or off.",
    )
    profile: Profile = Field(default="throughput", description="Tune batching for throughput or latency.")
    numa_bind: bool | None = Field(default=None, description="Unset: bind when the host has several NUMA nodes.")
    shm_size: str | None = Field(default=None, description="Container shared memory (e.g. 16g) instead of ipc=host.")
    privileged: bool = Field(
        default=False,
        description="Opt-in: run the container privileged (SYS_ADMIN, apparmor=unconfined). Warned about.",
    )
    model_facts: ModelFactsSettings | None = Field(
        default=None,
        description="Declared model facts: they override what the HF cache or the Hub says; with them "
        "declared and the model not cached, the Hub is not asked.",
    )
    download: bool | None = Field(
        default=None,
        description="Download the weights into hf_cache_dir before the first boot (the `downloading` phase); "
        "unset: yes for a Hub model id (ORG/NAME) without model_facts.",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description='vLLM --reasoning-parser; unset: the model family\'s own (e.g. qwen3), "off": none.',
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM --tool-call-parser (with --enable-auto-tool-choice); unset: the model family's own "
        '(e.g. hermes for Qwen3), "off": none.',
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment for vLLM.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="Extra vLLM arguments, last; a flag the plan also sets replaces the planned one (checks use it).",
    )
    enabled: bool = Field(default=True, description="Whether the daemon runs this deployment.")
    launcher: bool = Field(
        default=False,
        description="Run vLLM under dankserve's launcher, which imports vLLM once and forks a server per boot: "
        "restarts, down/up and reloads that keep the image, GPUs, mounts and ports skip the container start "
        "and vLLM's import (docs/launcher.md).",
    )
    hosts: list[str] = Field(default_factory=list, description="Other dankserve daemons of a multi-host group.")
    cluster_token_file: Path | None = Field(default=None, description="Shared token of a multi-host group.")
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        description="The name clients send as `model` (--served-model-name); unset: `model`.",
    )
    aliases: list[str] = Field(
        default_factory=list, description="More names the gateway routes to this deployment (rewritten to its name)."
    )
    swap_group: str | None = Field(
        default=None,
        min_length=1,
        description="Deployments of one swap group share GPUs beyond 0.95 of their memory: the awake ones fit, "
        "the others sleep (vLLM's sleep mode) until a request names them.",
    )
    idle_sleep_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SECONDS,
        description="swap groups: put the deployment to sleep after this long without requests; unset: never.",
    )
    pinned: bool = Field(
        default=False, description="swap groups: never put to sleep to make room for another member (nor when idle)."
    )
    sleep_level: Literal["auto", "1", "2", "stop"] = Field(
        default="auto",
        description="swap groups: auto (level 1 when available RAM holds the weights, else 2), or always 1, 2, "
        "or stop (stop and boot again; no sleep mode).",
    )

    @field_validator("gpus")
    @classmethod
    def _gpus_unique(cls, value: list[int | str] | None) -> list[int | str] | None:
        if value is not None:
            if not value:
                raise ValueError("gpus is empty: leave it out for all GPUs, or list indices/UUIDs")
            if len(set(map(str, value))) != len(value):
                raise ValueError(f"gpus lists a GPU twice: {value}")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts_are_addresses(cls, value: list[str]) -> list[str]:
        for address in value:
            check_address(address, default_port=7390)  # the cluster API's port
        return value

    @field_validator("model", "revision")
    @classmethod
    def _not_a_flag(cls, value: str | None) -> str | None:
        if value is not None and value.startswith("-"):
            raise ValueError(f"{value!r} starts with '-': vLLM would read it as a flag; name the model or revision")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, value: list[str]) -> list[str]:
        problems = extra_args_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("env")
    @classmethod
    def _no_owned_env(cls, value: dict[str, str]) -> dict[str, str]:
        problems = env_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("max_model_len")
    @classmethod
    def _max_model_len_positive(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("max_model_len must be a positive integer or 'auto'")
        return value

    @field_validator("swap_group")
    @classmethod
    def _swap_group_is_plain(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_-]+", value):
            raise ValueError(f"swap_group {value!r} may hold only letters, digits, '-' and '_'")
        return value

    @model_validator(mode="after")
    def _swap_settings_need_a_group(self) -> DeploymentSettings:
        if self.swap_group is None and (
            self.pinned or self.idle_sleep_seconds is not None or self.sleep_level != "auto"
        ):
            named = "pinned" if self.pinned else "sleep_level" if self.sleep_level != "auto" else "idle_sleep_seconds"
            raise ValueError(
                f"{named} is set but swap_group is not: only members of a swap group sleep; "
                f'set swap_group = "NAME" (the same on the deployments that share the GPUs) or remove {named}'
            )
        if self.swap_group is not None and self.hosts:
            raise ValueError(
                f"swap_group = {self.swap_group!r} on a multi-host deployment (hosts = {self.hosts}): swap groups "
                "are for deployments on this host's GPUs; remove swap_group or hosts"
            )
        if self.swap_group is not None and not is_loopback(self.host):
            raise ValueError(
                f"swap_group = {self.swap_group!r} with host = {self.host!r}: a member runs with vLLM's dev-mode "
                "routes (/sleep, /collective_rpc ...) that must never be reachable beyond this machine; "
                'set host = "127.0.0.1" and reach it through the [gateway]'
            )
        if self.pinned and self.idle_sleep_seconds is not None:
            raise ValueError(
                "pinned and idle_sleep_seconds are both set: a pinned member never sleeps; remove one of them"
            )
        return self

    @model_validator(mode="after")
    def _exposed_server_needs_a_key(self) -> DeploymentSettings:
        if not is_loopback(self.host) and self.api_key_file is None:
            raise ValueError(
                f"host = {self.host!r} is not a loopback address and no api_key_file is set: anyone who can "
                "reach that address could use the server. Set api_key_file to a file (mode 0600) holding "
                'the key, or bind to host = "127.0.0.1" and put a proxy with authentication in front'
            )
        return self


def parse_listen(value: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) as an address and a port; ValueError naming the problem."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f'{value!r} is not HOST:PORT (e.g. "127.0.0.1:9400" or "[::1]:9400")')
    return host, int(port)


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


def is_loopback(host: str) -> bool:
    """Whether the address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name: it may resolve to anything
        return False


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

    @model_validator(mode="after")
    def _one_deployment_per_port(self) -> Settings:
        seen: dict[tuple[str, int], str] = {}
        for name, dep in self.deployments.items():
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
            if not is_loopback(dep.host):
                raise ValueError(
                    f"deployments.{name}.host = {dep.host!r}: behind the gateway every server listens on loopback "
                    'only (clients reach it through [gateway] listen); set host = "127.0.0.1"'
                )
        _, gateway_port = split_listen(self.gateway.listen)
        for name, dep in self.deployments.items():
            if dep.port == gateway_port:
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


def resolve_config_path(explicit: Path | None, environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to read and whether the user named it (so its absence is an error)."""
    env = os.environ if environ is None else environ
    if explicit is not None:
        return explicit, True
    if env.get(CONFIG_ENV):
        return Path(env[CONFIG_ENV]), True
    return DEFAULT_CONFIG_PATH, False


def config_file_problem(mode: int, owner: int, me: int) -> str | None:
    """Why a config file with this mode and owner must not be trusted, or None when it may be."""
    if mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    if owner not in (0, me):
        return f"is owned by uid {owner}, neither root nor the user running dankserve (uid {me})"
    return None


def secret_file_problem(mode: int) -> str | None:
    """Why a secret file with this mode is unsafe (others may read it, or its group change it), or None."""
    if mode & 0o007:
        return f"is open to others (mode {stat.S_IMODE(mode):04o})"
    if mode & 0o020:
        return f"is writable by its group (mode {stat.S_IMODE(mode):04o})"
    return None


def config_dir_problem(mode: int, owner: int, entry_owner: int, me: int) -> str | None:
    """Why a directory on the way to the config lets someone else swap what is read, or None.

    Only root and the user running dankserve may own it or write it. A sticky directory (`/tmp`,
    mode 1777) is the exception where others may write: there an entry can be renamed or removed
    only by its owner, the directory's owner or root, so it is safe when all of those are root or
    this user."""
    if owner not in (0, me):
        return f"is owned by uid {owner}, neither root nor the user running dankserve (uid {me})"
    if mode & 0o022:
        if mode & stat.S_ISVTX and entry_owner in (0, me):
            return None
        who = " and ".join(w for bit, w in ((0o020, "its group"), (0o002, "others")) if mode & bit)
        return f"is writable by {who} (mode {stat.S_IMODE(mode):04o})"
    return None


MAX_SYMLINKS = 40
"""As the kernel's lookup: more symlinks on the way to the config is a loop."""


def _lookups(path: Path) -> tuple[list[tuple[str, os.stat_result, os.stat_result]], os.stat_result]:
    """Each directory resolving `path` looks a name up in, with its lstat and the entry's; the file's lstat.

    Symlinks are followed as the kernel follows them, so a link's directory counts as well as its
    target's. Raises OSError when a step cannot be looked at."""
    pending = [part for part in str(Path.cwd() / path).split("/") if part]
    pending.reverse()
    current = "/"
    steps: list[tuple[str, os.stat_result, os.stat_result]] = []
    links = 0
    entry = os.lstat(current)  # the path "/" itself
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            entry = os.lstat(current)
            continue
        directory = os.lstat(current)
        candidate = os.path.join(current, name)
        entry = os.lstat(candidate)
        steps.append((current, directory, entry))
        if stat.S_ISLNK(entry.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            target = os.readlink(candidate)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed([part for part in target.split("/") if part]))
        else:
            current = candidate
    return steps, entry


def _check_config_file(path: Path, opened: os.stat_result) -> None:
    """The opened file's own owner and mode (fstat: what is read is what is checked), then every directory
    on the way to it: a config someone else can change or swap decides what dankserve runs as root."""
    me = os.geteuid()
    problem = config_file_problem(opened.st_mode, opened.st_uid, me)
    if problem is not None:
        raise ConfigError(
            f"config file {path} {problem}: whoever can change it decides what dankserve runs as root",
            fix=f"chmod go-w {path} && chown root {path} (or your own user when you run dankserve yourself)",
        )
    try:
        steps, found = _lookups(path)
    except OSError as exc:
        raise ConfigError(
            f"config file {path}: the directories on its way cannot be checked ({exc.strerror or exc})",
            fix="keep the config where root (or the user running dankserve) can look up every directory",
        ) from None
    for directory, info, entry in steps:
        problem = config_dir_problem(info.st_mode, info.st_uid, entry.st_uid, me)
        if problem is not None:
            raise ConfigError(
                f"config file {path}: the directory {directory} on its way {problem}, so someone else can "
                "swap the config for their own",
                fix=f"chown root {directory} && chmod go-w {directory}, or keep the config in a directory only "
                "root (or you) can write, such as /etc/dankserve",
            )
    if (found.st_dev, found.st_ino) != (opened.st_dev, opened.st_ino):
        raise ConfigError(
            f"config file {path} changed while it was read", fix="read it again once nothing is replacing it"
        )


def check_secret_files(settings: Settings) -> None:
    """Refuse secret files that exist and are open to others; absent ones are reported when read."""
    secrets: list[tuple[str, Path | None]] = []
    for name, dep in settings.deployments.items():
        for key in ("api_key_file", "hf_token_file", "cluster_token_file"):
            secrets.append((f"deployments.{name}.{key}", getattr(dep, key)))
    if settings.gateway is not None:
        secrets.append(("gateway.api_key_file", settings.gateway.api_key_file))
    if settings.cluster is not None:
        secrets += [
            ("cluster.token_file", settings.cluster.token_file),
            ("cluster.tls_key_file", settings.cluster.tls_key_file),
        ]
    for key, path in secrets:
        if path is None:
            continue
        try:
            mode = path.stat().st_mode
        except OSError:
            continue
        problem = secret_file_problem(mode)
        if problem is not None:
            raise ConfigError(
                f"{key} = {str(path)!r}: the file {problem}",
                fix=f"chmod 600 {path} (a group may read it, never write it; others get nothing)",
            )
        if stat.S_ISREG(mode) and _holds_no_secret(path):
            raise ConfigError(
                f"{key} = {str(path)!r}: the file is empty or holds only whitespace, "
                "and an empty key is no key (the server would run without one)",
                fix=f"write the secret into {path}",
            )


def read_secret_file(path: Path, what: str, fix: str, *, min_length: int = 1) -> str:
    """A secret's text (secret_files.read_secret: a regular, non-empty file), UTF-8 and at least min_length long."""
    from dankserve.secret_files import read_secret

    try:
        secret = read_secret(path, what).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the {what} file {path} is not UTF-8 text", fix=fix) from None
    if len(secret) < min_length:
        raise ConfigError(
            f"{what} in {path} is {len(secret)} characters long: at least {min_length} are needed", fix=fix
        )
    return secret


MAX_CONFIG_BYTES = 1024 * 1024
"""The largest config file read: a real one is a few KiB; a bigger one is a mistake or an attack
that would cost seconds and hundreds of MB to parse."""


def _read_config_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist; only a safe regular file of a sane size is read.

    Opened without blocking and checked before reading, on the descriptor read from: a FIFO or a
    device would hang the reader (and, on reload, the daemon's main loop), and a check of the
    path would not be of the file read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"config file {path} is not a regular file (a FIFO, device, socket or directory)",
                fix="point --config or DANKSERVE_CONFIG at a regular TOML file",
            )
        _check_config_file(path, info)
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"config file {path} is {info.st_size} bytes, more than the {MAX_CONFIG_BYTES} a config may hold",
                fix="point --config or DANKSERVE_CONFIG at the right file (a real config is a few KiB)",
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:  # it grew while we looked
        raise ConfigError(
            f"config file {path} holds more than the {MAX_CONFIG_BYTES} bytes a config may hold",
            fix="point --config or DANKSERVE_CONFIG at the right file (a real config is a few KiB)",
        )
    return data.decode("utf-8")


def _holds_no_secret(path: Path) -> bool:
    """Whether a readable secret file holds only whitespace (one this user cannot read is checked when used)."""
    try:
        with path.open("rb") as handle:
            return not handle.read(MAX_CONFIG_BYTES).strip()
    except OSError:
        return False


def read_config_file(path: Path, *, required: bool) -> dict[str, Any]:
    """The TOML file's tables, or {} when an unnamed default file is absent."""
    try:
        text = _read_config_text(path)
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}", fix="check its permissions") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})",
            fix="save it as UTF-8 (TOML files are UTF-8)",
        ) from None
    if text is None:
        if required:
            raise ConfigError(
                f"config file {path} does not exist",
                fix="create it (`dankserve install` writes a commented example of every key) "
                f"or point --config/{CONFIG_ENV} elsewhere",
            )
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not valid TOML: {exc}", fix="correct the syntax at that line"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"config file {path} nests arrays or tables too deeply to read",
            fix="flatten the nesting (no dankserve key nests more than a few levels)",
        ) from None


_STATE_DIR_LINE = re.compile(r"""\s*state_dir\s*=\s*(?:"([^"\\]*)"|'([^']*)')\s*(?:#.*)?""")


def state_dir_despite_errors(config: Path | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The state dir (where the running daemon listens) named by a config file that may not validate.

    Read-only commands reach the daemon through it while the file on disk is refused: the top-level
    `state_dir` (from the TOML, or from its line when the TOML does not parse), DANKSERVE_STATE_DIR over
    it, the default without either. A file that others may change names no directory worth trusting."""
    env = os.environ if environ is None else environ
    if env.get("DANKSERVE_STATE_DIR"):
        return Path(env["DANKSERVE_STATE_DIR"])
    default: Path = Settings.model_fields["state_dir"].default
    path, _ = resolve_config_path(config, env)
    try:
        text = _read_config_text(path)  # checked on the descriptor it reads, as load_settings does
    except (ConfigError, OSError, UnicodeDecodeError):
        return default
    if text is None:
        return default
    try:
        value = tomllib.loads(text).get("state_dir")
    except (tomllib.TOMLDecodeError, RecursionError):
        value = None
        for line in text.splitlines():
            if line.lstrip().startswith("["):
                break  # the top-level keys end at the first table
            if found := _STATE_DIR_LINE.fullmatch(line):
                value = found.group(1) if found.group(1) is not None else found.group(2)
    return Path(value) if isinstance(value, str) and value else default


def load_settings(config: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings; every problem becomes a ConfigError (exit 2)."""
    path, required = resolve_config_path(config, environ)
    data = read_config_file(path, required=required)
    private = sorted(key for key in data if key.startswith("_"))
    if private:
        # pydantic-settings reads `_name` arguments as its own options (`_env_prefix` would switch
        # off the DANKSERVE_* overrides): no dankserve key begins with '_'.
        raise ConfigError(
            "invalid configuration:\n  "
            + "\n  ".join(
                f"{path}: unknown key {key!r}; see config/dankserve.toml for the keys allowed" for key in private
            ),
            fix="remove the keys named above (no dankserve key begins with '_')",
        )
    try:
        settings = Settings(**data)
    except RecursionError:
        raise ConfigError(
            f"invalid configuration: {path} nests values too deeply to check",
            fix="flatten the nesting (no dankserve key nests more than a few levels)",
        ) from None
    except ValidationError as exc:
        from dankserve.config_errors import describe

        problems = describe(Settings, exc.errors())
        raise ConfigError(
            "invalid configuration:\n  " + "\n  ".join(f"{path}: {p.line}" for p in problems),
            fix=problems[0].fix
            if len(problems) == 1
            else "correct the keys named above (docs/CONFIGURATION.md, and the example config `dankserve install` "
            "writes, document every key)",
        ) from None
    check_secret_files(settings)
    return settings
