"""The OpenAI-compatible HTTP surface of vLLM 0.33 that a supervisor touches (stdlib http.server).

/health and /ping: 200 with an empty body, 503 once the engine is dead
(vllm/entrypoints/serve/instrumentator/health.py). /version: {"version": "0.33.0"}.
/v1/*: guarded by the API key like vllm/entrypoints/serve/middleware/authenticate.py
(401 {"error": "Unauthorized"}). /metrics: Prometheus text with vLLM's metric names.
Minimal /v1/completions and /v1/chat/completions (deterministic text, streaming as SSE).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import select
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Final

from . import VLLM_VERSION, releases
from . import messages as msg
from .logfmt import access_message
from .lora import LoraRegistry, adapter_token_ids
from .messages import ENGINE_DEAD_CLIENT_MESSAGE, JIT_DURING_INFERENCE
from .nvml_record import write_record
from .output import Output
from .serve_config import ServeConfig

if TYPE_CHECKING:
    from .engine_core import EngineLink

GIB: Final = 1 << 30
GUARDED_PREFIXES: Final = ("/v1", "/v2", "/inference", "/cohere")
TTFT_BUCKETS: Final = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
"""vllm/v1/metrics/loggers.py's buckets of vllm:time_to_first_token_seconds (the first of them)."""
STAND_IN_TTFT_SECONDS: Final = 0.015
HUNG_POLL_SECONDS: Final = 0.2
FILLER_WORDS: Final = ("The", " stand-in", " vLLM", " answers", " with", " a", " fixed", " text", ".")


@dataclass
class EngineState:
    """Counters the server and the stats logger share; every access holds `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False
    hung: bool = False
    """The engine stopped making progress: /health still 200, completions never answer."""
    running: int = 0
    waiting: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    preemptions_total: int = 0
    requests_total: int = 0
    kernels_compiled: bool = False
    aborted_total: int = 0
    interval_prompt_tokens: int = 0
    interval_generation_tokens: int = 0
    interval_preemptions: int = 0
    kv_usage: float = 0.0  # fraction, 1.0 = full
    sleeping_tags: set[str] = field(default_factory=set)
    """Memory pools asleep ('weights', 'kv_cache'); empty when awake."""
    sleep_level: int = 0
    weights_stale: bool = False
    """Woken from level 2 without reload_weights: the weights are garbage (completions decode to nothing)."""
    woken: bool = False
    """Woken at least once since the boot (FAKE_VLLM_WAKE_TOKENS_DIFFER answers other ids from then on)."""
    ttft_counts: list[int] = field(default_factory=lambda: [0] * len(TTFT_BUCKETS))
    ttft_sum: float = 0.0
    ttft_count: int = 0
    release: releases.ReleaseState = field(default_factory=releases.ReleaseState)
    """Admission, sleep-mode metrics and checkpoints of the newer releases (releases.py)."""


@dataclass(frozen=True)
class ServerFacts:
    """What the endpoints report about the engine."""

    config: ServeConfig
    max_model_len: int
    num_gpu_blocks: int
    started: int
    token_seconds: float = 0.0
    """Delay between streamed tokens; 0 streams the whole text in one event."""
    dev_mode: bool = False
    """VLLM_SERVER_DEV_MODE=1: the dev-mode routes exist (/sleep, /wake_up, /is_sleeping, ...)."""
    first_request_seconds: float = 0.0
    """The first completion's kernel compile (vLLM's JIT during inference): its wait, then the warning."""
    sleep_seconds: float = 0.22
    wake_seconds: float = 0.2
    reload_seconds: float = 0.5
    sleep_freed_bytes: int = 0
    """GPU memory (rank 0) a sleep frees, at either level."""
    kv_cache_bytes: int = 0
    """GPU memory (rank 0) of the KV cache: what 0.34's `/checkpoint/prepare` releases (the weights stay)."""
    asleep_used_bytes: int = 0
    """GPU memory (rank 0) still in use while asleep (CUDA context, graphs, NCCL)."""
    own_asleep_bytes: int = 0
    """What this process itself holds asleep (asleep_used_bytes less other processes' memory)."""
    nvml_dir: str | None = None
    sleep_keeps_memory: bool = False
    wake_tokens_differ: bool = False
    tokens_differ_file: str | None = None
    """While this file exists, completions answer other ids (FAKE_VLLM_TOKENS_DIFFER_FILE)."""
    lora: LoraRegistry = field(default_factory=lambda: LoraRegistry(False, 16))
    """The LoRA adapters served (mutable: /v1/load_lora_adapter adds to it)."""
    lora_runtime_updating: bool = False
    """VLLM_ALLOW_RUNTIME_LORA_UPDATING: /v1/load_lora_adapter and /v1/unload_lora_adapter exist."""
    keep_alive_seconds: float | None = 5.0
    """VLLM_HTTP_TIMEOUT_KEEP_ALIVE (vLLM passes it to uvicorn as timeout_keep_alive; 5 by default): an idle
    keep-alive connection is closed after it (here a socket timeout, which bounds each read and write too)."""

    @property
    def own_awake_bytes(self) -> int:
        return self.own_asleep_bytes + self.sleep_freed_bytes


def _approximate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def completion_text(max_tokens: int, *, reverse: bool = False) -> str:
    """The base model's fixed text; an adapter's (`reverse`) says the words backwards, so tests tell them apart."""
    words = FILLER_WORDS[::-1] if reverse else FILLER_WORDS
    return "".join(words[index % len(words)] for index in range(max(0, max_tokens)))


def completion_token_ids(max_tokens: int) -> list[int]:
    """The ids of completion_text's words, as `return_token_ids` asks (the word's index, from 100)."""
    return [100 + index % len(FILLER_WORDS) for index in range(max(0, max_tokens))]


def metrics_text(facts: ServerFacts, state: EngineState) -> str:
    """Prometheus exposition with the vLLM 0.33 names a supervisor reads (vllm/v1/metrics/loggers.py)."""
    config = facts.config
    labels = f'engine="0",model_name="{config.served_model_name}"'
    with state.lock:
        running, usage = state.running, state.kv_usage
        preemptions, prompt, generation = (
            state.preemptions_total,
            state.prompt_tokens_total,
            state.generation_tokens_total,
        )
        requests, aborted = state.requests_total, state.aborted_total
        waiting = state.waiting
        ttft_counts, ttft_sum, ttft_count = list(state.ttft_counts), state.ttft_sum, state.ttft_count
    info = {
        "block_size": "16",
        "cache_dtype": config.kv_cache_dtype,
        "calculate_kv_scales": "False",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(config.gpu_memory_utilization),
        "kv_cache_memory_bytes": str(config.kv_cache_memory_bytes),
        "num_gpu_blocks": str(facts.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "engine": "0",
    }
    info_labels = ",".join(f'{key}="{value}"' for key, value in sorted(info.items()))
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{labels}}} {float(preemptions)}",
        "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
        "# TYPE vllm:prompt_tokens_total counter",
        f"vllm:prompt_tokens_total{{{labels}}} {float(prompt)}",
        "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
        "# TYPE vllm:generation_tokens_total counter",
        f"vllm:generation_tokens_total{{{labels}}} {float(generation)}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(requests - aborted)}',
        f'vllm:request_success_total{{{labels},finished_reason="abort"}} {float(aborted)}',
        "# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        *(
            f'vllm:time_to_first_token_seconds_bucket{{{labels},le="{bound}"}} {float(count)}'
            for bound, count in zip(TTFT_BUCKETS, ttft_counts, strict=True)
        ),
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {float(ttft_count)}',
        f"vllm:time_to_first_token_seconds_count{{{labels}}} {float(ttft_count)}",
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} {ttft_sum}",
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f"vllm:cache_config_info{{{info_labels}}} 1.0",
        *releases.metrics_lines(labels, state.release),
    ]
    return "\n".join(lines) + "\n"


class FakeVllmHTTPServer(ThreadingHTTPServer):
    """Bound early like vLLM's setup_server, listening only once the engine is ready."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 2048  # uvicorn's default backlog (socketserver's 5 drops connections under load)

    def __init__(self, address: tuple[str, int] | str, facts: ServerFacts, state: EngineState, output: Output) -> None:
        """`address`: (host, port), or a unix socket's path (`--uds`: vLLM's create_server_unix_socket binds it,
        never removing a file already there, and the server ignores host and port)."""
        if isinstance(address, str):
            self.address_family = socket.AF_UNIX
            self.allow_reuse_address = False
        elif ":" in address[0]:
            self.address_family = socket.AF_INET6
        handler = UnixRequestHandler if isinstance(address, str) else RequestHandler
        super().__init__(address, handler, bind_and_activate=False)  # type: ignore[arg-type]
        self.facts = facts
        self.state = state
        self.output = output
        self.engine: EngineLink | None = None
        """The engine core (engine_core.py); None: this process plays it (GPU records written here)."""

    def bind(self) -> None:
        """Bind without listening: connections are refused while the engine loads."""
        self.server_bind()

    def server_bind(self) -> None:
        if self.address_family != socket.AF_UNIX:
            super().server_bind()
            return
        self.socket.bind(self.server_address)  # http.server's own would read a host and port from the path
        self.server_name, self.server_port = "localhost", 0

    def listen(self) -> None:
        self.server_activate()
        self.engine_memory(self.facts.own_awake_bytes)

    def engine_memory(self, used_bytes: int) -> None:
        """The GPU memory the engine holds now: the engine core's record (the CUDA calls are its)."""
        if self.engine is not None:
            self.engine.memory(used_bytes)
        else:
            write_record(self.facts.nvml_dir, used_bytes)


class RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeVllmHTTPServer
    server_version = "uvicorn"
    sys_version = ""
    disable_nagle_algorithm = True  # asyncio (uvicorn) sets TCP_NODELAY on every connection

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.facts.keep_alive_seconds)  # handle_one_request closes it idle

    def log_message(self, format: str, *args: object) -> None:
        """Access lines are uvicorn's, written after each response (see _access_log)."""

    def _access_log(self, status: int) -> None:
        config = self.server.facts.config
        path = self.path.split("?", 1)[0]
        if config.disable_access_log or path in config.access_log_excluded_paths:
            return
        # uvicorn names no client on a unix socket (its scope's client is None): the line starts " - ".
        peer = self.client_address
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else ""
        phrase = HTTPStatus(status).phrase
        self.server.output.uvicorn(access_message(client, self.command, self.path, status, phrase), stream="stdout")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("date", self.date_time_string())
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:  # nothing to send (an empty write to a closed unix socket fails)
            self.wfile.write(body)
        self._access_log(status)

    def _json(self, status: int, document: object) -> None:
        self._send(status, json.dumps(document).encode())

    def _error(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        self._json(status, {"error": {"message": message, "type": kind, "param": param, "code": status}})

    def _authorized(self) -> bool:
        keys = self.server.facts.config.api_keys
        if not keys or self.command == "OPTIONS" or not self.path.startswith(GUARDED_PREFIXES):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        offered = hashlib.sha256(token.encode()).digest()
        return any(hmac.compare_digest(offered, hashlib.sha256(key.encode()).digest()) for key in keys)

    def _dead(self) -> bool:
        with self.server.state.lock:
            return self.server.state.dead

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        if not self._authorized():
            self._json(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
            return
        path = self.path.split("?", 1)[0]
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "/health"): self._health,
            ("HEAD", "/health"): self._health,
            ("GET", "/ping"): self._health,
            ("POST", "/ping"): self._health,
            ("GET", "/version"): self._version,
            ("GET", "/v1/models"): self._models,
            ("GET", "/metrics"): self._metrics,
            ("POST", "/v1/completions"): lambda: self._generate(chat=False),
            ("POST", "/v1/chat/completions"): lambda: self._generate(chat=True),
        }
        if self.server.facts.lora_runtime_updating:
            routes[("POST", "/v1/load_lora_adapter")] = self._load_lora
            routes[("POST", "/v1/unload_lora_adapter")] = self._unload_lora
        if self.server.facts.dev_mode:
            routes.update(
                {
                    ("POST", "/sleep"): self._sleep,
                    ("POST", "/wake_up"): self._wake_up,
                    ("GET", "/is_sleeping"): self._is_sleeping,
                    ("POST", "/collective_rpc"): self._collective_rpc,
                    ("POST", "/reset_prefix_cache"): lambda: self._send(200, b""),
                }
            )
        if releases.CHECKPOINT and self.server.facts.config.enable_sleep_mode:  # 0.34: no dev mode needed
            for verb, route in (("POST", "prepare"), ("POST", "restore"), ("GET", "status")):
                routes[(verb, f"/checkpoint/{route}")] = functools.partial(self._checkpoint, route)
        handler = routes.get((method, path))
        if handler is not None:
            handler()
        elif any(route_path == path for _, route_path in routes):
            self._json(HTTPStatus.METHOD_NOT_ALLOWED, {"detail": "Method Not Allowed"})
        else:
            self._json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def _version(self) -> None:
        self._json(200, {"version": VLLM_VERSION})

    def _health(self) -> None:
        self._send(HTTPStatus.SERVICE_UNAVAILABLE if self._dead() else HTTPStatus.OK, b"")

    def _metrics(self) -> None:
        text = metrics_text(self.server.facts, self.server.state)
        self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _models(self) -> None:
        facts = self.server.facts
        data = [
            {
                "id": name,
                "object": "model",
                "created": facts.started,
                "owned_by": "vllm",
                "root": facts.config.model,
                "parent": None,
                "max_model_len": facts.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": facts.started,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in facts.config.served_model_names
        ]
        for name, path in facts.lora.names():  # serving.py show_available_models: parent = the base's name
            data.append({**data[0], "id": name, "root": path, "parent": facts.config.served_model_name})
            data[-1]["max_model_len"] = None  # vLLM's adapter cards leave it unset
        self._json(200, {"object": "list", "data": data})

    def _load_lora(self) -> None:
        """POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace"}: text answer on success."""
        request = self._read_json()
        if request is None:
            return
        name, path = request.get("lora_name"), request.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str):
            self._unprocessable("lora_name" if not isinstance(name, str) else "lora_path")
            return
        registry = self.server.facts.lora
        status, message, kind = registry.load(name, path, inplace=request.get("load_inplace") is True)
        if status != 200:
            self._error(status, message, kind)
            return
        self.server.output.log(msg.LORA_LOADED, (name, path))
        self._send(200, message.encode(), "text/plain; charset=utf-8")

    def _unload_lora(self) -> None:
        """POST /v1/unload_lora_adapter {"lora_name"}."""
        request = self._read_json()
        if request is None:
            return
        name = request.get("lora_name")
        if not isinstance(name, str):
            self._unprocessable("lora_name")
            return
        status, message, kind = self.server.facts.lora.unload(name)
        if status != 200:
            self._error(status, message, kind)
            return
        self.server.output.log(msg.LORA_REMOVED, (name,))
        self._send(200, message.encode(), "text/plain; charset=utf-8")

    def _unprocessable(self, field_name: str) -> None:
        """FastAPI's answer to a body that does not validate (pydantic: a required string missing)."""
        detail = [{"type": "missing", "loc": ["body", field_name], "msg": "Field required", "input": None}]
        self._json(HTTPStatus.UNPROCESSABLE_ENTITY, {"detail": detail})

    def _query(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.path.partition("?")[2])

    def _sleep_mode_off(self) -> bool:
        if self.server.facts.config.enable_sleep_mode:
            return False
        self._error(
            HTTPStatus.INTERNAL_SERVER_ERROR,
            "Sleep mode is not enabled: start the server with --enable-sleep-mode.",
            "InternalServerError",
        )
        return True

    def _sleep(self) -> None:
        """POST /sleep?level=1|2: level 1 offloads the weights to CPU RAM, level 2 drops them; both free the KV."""
        if self._sleep_mode_off() or self._checkpoint_refused("sleep"):
            return
        raw = (self._query().get("level") or ["1"])[0]
        if raw not in releases.SLEEP_LEVELS:
            levels = " to ".join((releases.SLEEP_LEVELS[0], releases.SLEEP_LEVELS[-1]))
            self._error(HTTPStatus.BAD_REQUEST, f"level must be {levels}, not {raw!r}", "BadRequestError", "level")
            return
        facts, state, output = self.server.facts, self.server.state, self.server.output
        with state.lock:
            already = bool(state.sleeping_tags)
        level = int(raw)
        if already:
            output.log(msg.ALREADY_SLEEPING)
            self._send(200, releases.sleep_answer(level))
            return
        started = time.monotonic()
        with state.release.operation("sleep"):
            time.sleep(facts.sleep_seconds)
        with state.lock:
            state.sleeping_tags = {"weights", "kv_cache"}
            state.sleep_level = level
            state.weights_stale = False
        output.log(msg.SLEEP_FREED, (facts.sleep_freed_bytes / GIB, facts.asleep_used_bytes / GIB))
        # FAKE_VLLM_SLEEP_KEEPS_MEMORY: the log and /is_sleeping say asleep, NVML says otherwise.
        self.server.engine_memory(facts.own_awake_bytes if facts.sleep_keeps_memory else facts.own_asleep_bytes)
        output.log(msg.FELL_ASLEEP, (time.monotonic() - started,))
        self._send(200, releases.sleep_answer(level))

    def _wake_up(self) -> None:
        """POST /wake_up[?tags=weights|kv_cache ...]: reallocate those pools (all without tags)."""
        if self._sleep_mode_off() or self._checkpoint_refused("wake up"):
            return
        tags = self._query().get("tags") or []
        facts, state, output = self.server.facts, self.server.state, self.server.output
        with state.lock:
            sleeping = set(state.sleeping_tags)
        if not sleeping:
            output.log(msg.NOT_SLEEPING)
            self._send(200, releases.wake_answer(True, tags))
            return
        unknown = [tag for tag in tags if tag not in sleeping]
        if unknown:  # vLLM warns about the first and wakes nothing (a repeated staged wake, H200 2026-12-02)
            output.log(msg.TAG_NOT_SLEEPING, (unknown[0], sleeping))
            self._send(200, releases.wake_answer(False, tags))
            return
        started = time.monotonic()
        with state.release.operation("wake"):
            time.sleep(facts.wake_seconds)
        waking = set(tags) or sleeping
        with state.lock:
            if "weights" in waking and state.sleep_level == 2:
                state.weights_stale = True  # allocated, not loaded: reload_weights fills them
            state.sleeping_tags -= waking
            awake = not state.sleeping_tags
            if awake:
                state.sleep_level = 0
                state.woken = True
        if "weights" in waking or "kv_cache" in waking:
            self.server.engine_memory(facts.own_awake_bytes)
        output.log(msg.WOKE_UP, (time.monotonic() - started, sorted(waking)))
        self._send(200, releases.wake_answer(awake, tags))

    def _checkpoint(self, route: str) -> None:
        """0.34's checkpoint routes; a prepare releases the KV cache (the engine's record drops by it), a restore
        brings it back."""
        facts, state = self.server.facts, self.server.state
        with state.lock:
            asleep = bool(state.sleeping_tags)
        mode = (self._query().get("mode") or ["wait"])[0]
        before = state.release.checkpoint
        code, body = state.release.checkpoint_route(route, asleep=asleep, mode=mode)
        after = state.release.checkpoint
        if before == "running" and after == "prepared":
            self.server.engine_memory(facts.own_awake_bytes - facts.kv_cache_bytes)
        elif before == "prepared" and after == "running":
            self.server.engine_memory(facts.own_awake_bytes)
        self._send(code, body)

    def _checkpoint_refused(self, action: str) -> bool:
        """A prepared engine refuses a sleep or a wake: vLLM's RuntimeError, a 500."""
        refusal = self.server.state.release.checkpoint_refusal(action)
        if refusal is not None:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, refusal, "InternalServerError")
        return refusal is not None

    def _is_sleeping(self) -> None:
        with self.server.state.lock:
            asleep = bool(self.server.state.sleeping_tags)
        # vLLM's is_sleeping: the scheduler paused (a checkpoint prepared) or the memory asleep.
        self._json(200, {"is_sleeping": asleep or self.server.state.release.checkpoint != "running"})

    def _collective_rpc(self) -> None:
        """POST /collective_rpc {"method": ...}: the stand-in knows reload_weights (after a level-2 sleep)."""
        request = self._read_json()
        if request is None:
            return
        method = request.get("method")
        if method != "reload_weights":
            self._error(HTTPStatus.BAD_REQUEST, f"the stand-in has no worker method {method!r}", "BadRequestError")
            return
        time.sleep(self.server.facts.reload_seconds)
        with self.server.state.lock:
            self.server.state.weights_stale = False
        self._json(200, {"results": [None] * self.server.facts.config.tensor_parallel_size})

    def _read_json(self) -> dict[str, object] | None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            document = json.loads(raw or b"null")
        except json.JSONDecodeError as exc:
            self._error(HTTPStatus.BAD_REQUEST, f"JSON decode error: {exc}", "BadRequestError")
            return None
        if not isinstance(document, dict):
            self._error(HTTPStatus.BAD_REQUEST, "The request body must be a JSON object.", "BadRequestError")
            return None
        return document

    def _generate(self, chat: bool) -> None:
        """vLLM's admission after reading the body (0.29+, --max-num-queued-reqs): 503 beyond the limit."""
        request = self._read_json()
        if request is None:
            return
        limit = self.server.facts.config.max_num_queued_reqs if releases.ADMISSION else None
        if not self.server.state.release.admit(limit):
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, releases.QUEUE_FULL_MESSAGE, "Service Unavailable")
            return
        try:
            self._generate_admitted(chat, request)
        finally:
            self.server.state.release.finish()

    def _generate_admitted(self, chat: bool, request: dict[str, object]) -> None:
        facts, state = self.server.facts, self.server.state
        model = request.get("model") or facts.config.served_model_name
        adapter = isinstance(model, str) and facts.lora.has(model)
        if model not in facts.config.served_model_names and not adapter:
            self._error(HTTPStatus.NOT_FOUND, f"The model `{model}` does not exist.", "NotFoundError", "model")
            return
        if self._dead():
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_DEAD_CLIENT_MESSAGE, "InternalServerError")
            return
        with state.lock:
            asleep, stale = bool(state.sleeping_tags), state.weights_stale
        if asleep:
            # Not vLLM's verified behaviour: a supervisor never sends a request to a sleeping server.
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "The engine is sleeping.", "ServiceUnavailableError")
            return
        if self._wait_while_hung():
            return
        self._wait_while_prepared()
        raw_max = request.get("max_tokens", request.get("max_completion_tokens", 16))
        max_tokens = raw_max if isinstance(raw_max, int) and raw_max >= 0 else 16
        engine_ids = self._engine_step(max_tokens)
        if engine_ids is None:
            return
        self._compile_kernels_once()
        prompt_text = json.dumps(request.get("messages") if chat else request.get("prompt", ""))
        prompt_tokens = _approximate_tokens(prompt_text)
        text = "" if stale else completion_text(max_tokens, reverse=adapter)
        with state.lock:
            state.prompt_tokens_total += prompt_tokens
            state.generation_tokens_total += max_tokens
            state.interval_prompt_tokens += prompt_tokens
            state.interval_generation_tokens += max_tokens
            state.requests_total += 1
            state.ttft_counts = [
                c + (b >= STAND_IN_TTFT_SECONDS) for c, b in zip(state.ttft_counts, TTFT_BUCKETS, strict=True)
            ]
            state.ttft_sum += STAND_IN_TTFT_SECONDS
            state.ttft_count += 1
        created = int(time.time())
        # vLLM's _base_request_id: the client's X-Request-Id, else a random one, after the API's prefix
        request_id = ("chatcmpl-" if chat else "cmpl-") + (self.headers.get("X-Request-Id") or uuid.uuid4().hex)
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + max_tokens,
            "completion_tokens": max_tokens,
        }
        if chat:
            choice: dict[str, object] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
        if request.get("return_token_ids") is True:  # vLLM's extra field (0.10.2+): the choice's token ids
            ids = adapter_token_ids(str(model), max_tokens) if adapter else engine_ids
            with state.lock:
                differ = facts.wake_tokens_differ and state.woken
            differ = differ or (facts.tokens_differ_file is not None and os.path.exists(facts.tokens_differ_file))
            choice["token_ids"] = [] if stale else [i + 1 for i in ids] if differ else ids
        response: dict[str, object] = {
            "id": request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
        if request.get("stream") is True:
            options = request.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream(response, chat, text, include_usage)
        else:
            self._json(200, response)

    def _engine_step(self, max_tokens: int) -> list[int] | None:
        """The completion forwarded to the engine core (it blocks while the GPU is locked); None, answered
        with vLLM's EngineDeadError, when the engine core is gone."""
        engine = self.server.engine
        ids = engine.generate(max_tokens) if engine is not None else completion_token_ids(max_tokens)
        if ids is None:
            with self.server.state.lock:
                self.server.state.dead = True
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, ENGINE_DEAD_CLIENT_MESSAGE, "InternalServerError")
        return ids

    def _compile_kernels_once(self) -> None:
        """The first completion compiles the attention kernel (FAKE_VLLM_FIRST_REQUEST_SECONDS), as vLLM 0.26 does."""
        facts, state = self.server.facts, self.server.state
        with state.lock:
            first, state.kernels_compiled = not state.kernels_compiled, True
        if first and facts.first_request_seconds > 0:
            time.sleep(facts.first_request_seconds)
            self.server.output.log(JIT_DURING_INFERENCE, ("kernel_unified_attention",))

    def _wait_while_prepared(self) -> None:
        """A request to an engine prepared for a checkpoint queues (the pause of `/checkpoint/prepare` queues new
        adds) until `/checkpoint/restore` resumes it, or its client goes away."""
        release = self.server.state.release
        while release.checkpoint != "running":
            readable, _, _ = select.select([self.connection], [], [], 0.02)
            if readable and not self.connection.recv(1, socket.MSG_PEEK):
                return

    def _wait_while_hung(self) -> bool:
        """A hung engine: the request waits (and counts as waiting) until its client gives up,
        then is aborted, as vLLM aborts a request whose connection closed. True when it waited."""
        state = self.server.state
        with state.lock:
            if not state.hung:
                return False
            state.waiting += 1
        try:
            while True:
                readable, _, _ = select.select([self.connection], [], [], HUNG_POLL_SECONDS)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    break  # the client closed its end
        except OSError:
            pass
        finally:
            with state.lock:
                state.waiting -= 1
        self.close_connection = True
        return True

    def _stream(self, response: dict[str, object], chat: bool, text: str, include_usage: bool = False) -> None:
        """Server-sent events: the text (in one event, or a token per event with
        FAKE_VLLM_TOKEN_SECONDS), a finishing event, with `stream_options.include_usage` one more
        with no choices and the usage (as vLLM's serving_chat sends it), then [DONE]. A client that goes away
        aborts the request, as vLLM does (counted as finished_reason="abort"). Chunked and kept
        alive as uvicorn sends a streaming response (HTTP/1.0 clients: until the connection closes)."""
        chunked = self.request_version == "HTTP/1.1"
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()

        def send(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)

        delay = self.server.facts.token_seconds
        pieces = _tokens(text) if delay > 0 else [text]
        events = [_chunk(response, chat, piece, None) for piece in pieces]
        events.append(_chunk(response, chat, "", "length"))
        if include_usage:
            events.append({**_chunk(response, chat, "", None), "choices": [], "usage": response["usage"]})
        state = self.server.state
        with state.lock:
            state.running += 1
        try:
            for index, event in enumerate(events):
                if index and delay > 0:
                    time.sleep(delay)
                send(b"data: " + json.dumps(event).encode() + b"\n\n")
            send(b"data: [DONE]\n\n")
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            with state.lock:
                state.aborted_total += 1
            self._access_log(200)
            return
        finally:
            with state.lock:
                state.running -= 1
        self._access_log(200)


def _tokens(text: str) -> list[str]:
    """The filler text as the words it was made of (each one token)."""
    words: list[str] = []
    for index, char in enumerate(text):
        if index == 0 or (char in {" ", "."} and words):
            words.append(char)
        else:
            words[-1] += char
    return words or [""]


def _chunk(response: dict[str, object], chat: bool, piece: str, finish: str | None) -> dict[str, object]:
    choice: dict[str, object]
    if chat:
        delta: dict[str, object] = {"content": piece} if finish else {"role": "assistant", "content": piece}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": piece, "finish_reason": finish}
    chunk = {key: value for key, value in response.items() if key != "usage"}
    chunk.update(object="chat.completion.chunk" if chat else "text_completion", choices=[choice])
    return chunk


class UnixRequestHandler(RequestHandler):
    """The same routes on a unix socket (`--uds`), where TCP_NODELAY means nothing (setting it fails)."""

    disable_nagle_algorithm = False
