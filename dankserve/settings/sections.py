"""The settings' tables beside the deployments: speculative decoding, CPU offload, model facts, [cluster], [gateway]."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from dankserve.lora_adapters import LoraModelSizes
from dankserve.settings.values import MAX_GIB, MAX_SECONDS, _Strict, check_address, is_loopback, split_listen


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
        default=None,
        gt=0,
        description="Bytes per KV element of the model dtype (2 for bf16); unset: 2, as vLLM's --dtype auto.",
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


_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]{1,253}(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]{2,45}\](:[0-9]{1,5})?")
"""An origin as a browser's `Origin` header sends it (RFC 6454): scheme, host, an optional port."""


class GatewaySettings(_Strict):
    """One OpenAI endpoint in front of every deployment, routed by the request's `model` (docs/GATEWAY.md)."""

    listen: str = Field(
        default="127.0.0.1:9000",
        description="ADDRESS:PORT of the endpoint. Beyond loopback, api_key_file is required.",
    )
    api_key_file: Path | None = Field(
        default=None, description="File holding the key clients send as `Authorization: Bearer KEY` (mode 0600)."
    )
    keys_dir: Path | None = Field(
        default=None, description="Directory (mode 0700) of client keys, one NAME.toml each (docs/GATEWAY.md, Keys)."
    )
    max_in_flight: int | None = Field(
        default=None, ge=1, le=100_000, description="Requests passed to each deployment at once; unset: --max-num-seqs."
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
    allowed_origins: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Web origins whose pages may call the gateway from a browser (CORS), e.g. "
        '"https://chat.example.com" (scheme://host[:port]); "*": any page. Empty: no cross-origin calls '
        "(a preflight gets 403, never 401).",
    )

    @field_validator("allowed_origins")
    @classmethod
    def _origins_are_origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"allowed_origins has {origin!r}, which is not an origin: write scheme://host[:port] as the "
                    'browser sends it, without a path or a trailing slash (e.g. "https://chat.example.com"), or "*"'
                )
        return value

    @field_validator("listen")
    @classmethod
    def _listen_is_an_address(cls, value: str) -> str:
        return check_address(value)

    @model_validator(mode="after")
    def _exposed_gateway_needs_a_key(self) -> GatewaySettings:
        host, _ = split_listen(self.listen)
        if not is_loopback(host) and self.api_key_file is None and self.keys_dir is None:
            raise ValueError(
                f"listen = {self.listen!r} is not a loopback address and no api_key_file or keys_dir is set: anyone "
                "who can reach that address could use every deployment. Set api_key_file to a file (mode 0600) "
                'holding the key (or keys_dir), or listen on "127.0.0.1:PORT"'
            )
        return self
