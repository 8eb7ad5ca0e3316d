"""One ``[deployments.NAME]`` table: the served model and how to run it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from dankserve.launcher_choice import launcher_choice
from dankserve.lora_adapters import LoraAdaptersTable
from dankserve.owned import env_problems, extra_args_problems
from dankserve.settings.sections import CpuOffloadSettings, ModelFactsSettings, SpeculativeSettings
from dankserve.settings.swap import SwapFitSettings
from dankserve.settings.values import (
    IMAGE_FIX,
    MAX_SECONDS,
    _Strict,
    check_address,
    image_reference_problem,
    is_loopback,
)

DEFAULT_IMAGE = "docker.io/vllm/vllm-openai:v0.34.0"

PullPolicy = Literal["missing", "always", "never"]
RuntimeKind = Literal["podman", "process"]
Profile = Literal["throughput", "latency"]
BackendListen = Literal["auto", "socket", "tcp"]


class DeploymentSettings(LoraAdaptersTable, SwapFitSettings, _Strict):
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
    port: int = Field(default=8000, ge=1, le=65535, description="Port the server listens on (listen = tcp).")
    listen: BackendListen = Field(
        default="auto",
        description="Where the server listens. socket: a unix socket in a 0700 directory under state_dir "
        "(vLLM's --uds), which only the daemon's user can open: clients come through the [gateway], host and "
        "port are unused. tcp: host:port, where every local user reaches every route of vLLM, including the "
        "ones its key does not guard (/sleep, /collective_rpc, LoRA loading: `dankserve plan` lists them). "
        "auto: socket when [gateway] is set, else tcp. The socket needs vLLM 0.10.1 or later (--uds).",
    )
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
        description="CPU KV-cache offload in GiB (total over TP ranks), auto (by RAM, shared among the deployments "
        "on auto), or off.",
    )
    profile: Profile = Field(default="throughput", description="Tune batching for throughput or latency.")
    numa_bind: bool | None = Field(default=None, description="Unset: bind when the host has several NUMA nodes.")
    shm_size: str | None = Field(
        default=None,
        description='Container /dev/shm size (e.g. 16g), or "host" for the host\'s (ipc=host). Unset: a private one of '
        "half the host's RAM where snapshots are on (a ceiling, not an allocation), else ipc=host.",
    )
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
    launcher: bool | Literal["auto"] = Field(
        default="auto",
        description="Run vLLM under dankserve's launcher, which imports vLLM once and forks a server per boot: "
        "restarts, down/up and reloads that keep the image, GPUs, mounts and ports skip the container start "
        "and vLLM's import (docs/launcher.md). auto: where the command it replaces is vLLM's own (the `vllm` "
        "script or a Python with vLLM) and snapshots do not restore the restarts instead (`dankserve plan` "
        "and `status` say which and why).",
    )
    hosts: list[str] = Field(default_factory=list, description="Other dankserve daemons of a multi-host group.")
    cluster_token_file: Path | None = Field(default=None, description="Shared token of a multi-host group.")
    snapshot: Literal["auto", "off"] = Field(
        default="auto",
        description="Snapshots of the warm server (docs/snapshots.md): auto captures the ready server once per "
        "plan and restores it on restarts instead of a boot (the process runtime, one GPU; anything wrong boots "
        "normally). off: never capture or restore, and the snapshot there was is deleted; a snapshot holds the "
        "server's memory, secrets included.",
    )
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
    sleep_level: Literal["auto", "1", "2", "stop", "suspend"] = Field(
        default="auto",
        description="swap groups: auto (level 1 when available RAM holds the weights, else 2; suspend when the "
        "GPU is too tight for the woken member beside the sleepers' leftovers), or always 1, 2, stop (stop and "
        "boot again; no sleep mode), or suspend (level 1, then a GPU checkpoint of the server: 0 bytes left on "
        "the GPU; needs the GPU checkpoint API, docs/snapshots.md).",
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

    @field_validator("image")
    @classmethod
    def _an_image_reference(cls, value: str) -> str:
        problem = image_reference_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}: {IMAGE_FIX}")
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

    _image_entrypoint: tuple[str, ...] | None = PrivateAttr(default=None)
    """The image's entrypoint, read from its config when the daemon ensured the image (never from the file)."""

    def with_image_entrypoint(self, entrypoint: tuple[str, ...] | None) -> DeploymentSettings:
        """This deployment as the daemon runs it once its image's entrypoint is read (Podman): what
        `launcher = "auto"` decides by. None (not read yet, or the process runtime): itself."""
        if entrypoint is None or self.runtime != "podman" or entrypoint == self._image_entrypoint:
            return self
        known = self.model_copy()
        known._image_entrypoint = entrypoint
        return known

    def launcher_choice(self) -> tuple[bool, str]:
        """Whether this deployment's boots go through the launcher, and why (`launcher = "auto"`: the one
        answer; dankserve/launcher_choice.py). Podman: by the image's entrypoint once the daemon read it."""
        if self.runtime == "process":
            entrypoint = tuple(shlex.split(self.executable)) if self.executable else None
        else:
            entrypoint = self._image_entrypoint
        return launcher_choice(self.launcher, entrypoint, self.runtime, snapshot=self.snapshot)

    @property
    def uses_launcher(self) -> bool:
        return self.launcher_choice()[0]
