"""Which deployment answers a request, and the gateway's answers in OpenAI's shape (pure).

A deployment answers to its served name (``served_model_name``, else ``model``) and to each
of its ``aliases``; a request naming an alias is passed on with the served name, since vLLM
checks the `model` field against the names it serves. Each of its LoRA ``adapters`` is a name of
its own that the same server serves (vLLM lists it with `parent` = the base model): passed on as
it is, to the base deployment.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dankserve.settings import DeploymentSettings

ROUTED_BY_MODEL = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/messages",
        "/v1/score",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/score",
        "/pooling",
        "/classify",
        "/tokenize",
        "/detokenize",
    }
)
"""POST routes of vLLM's OpenAI server whose JSON body names the model."""

GENERATING = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"})
"""Routes whose answer is generated text (charged a completion at admission, tokens.estimate)."""
USAGE_ON_REQUEST = frozenset({"/v1/chat/completions", "/v1/completions"})
"""Routes whose streams carry usage only when asked (`stream_options.include_usage`): the gateway asks."""
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
"""Where a request sets its completion's limit (chat, completions, responses and messages)."""

DEV_ROUTES = frozenset({"/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/reset_prefix_cache"})
"""vLLM's dev-mode routes: they change the server's state and are never passed on."""


@dataclass(frozen=True)
class Route:
    """Where a model name leads: the deployment and the name its server knows the model by."""

    deployment: str
    served_name: str


@dataclass(frozen=True)
class ModelEntry:
    """One row of /v1/models."""

    id: str
    deployment: str
    served_name: str
    parent: str | None = None
    """An adapter's base model (its deployment's served name); None for the base model and its aliases."""


def served_name(dep: DeploymentSettings) -> str:
    return dep.served_model_name or dep.model


def model_entries(deployments: Mapping[str, DeploymentSettings]) -> list[ModelEntry]:
    """Every name an enabled deployment answers to, served name first, then aliases and adapters, in config order."""
    entries: list[ModelEntry] = []
    for name, dep in deployments.items():
        if not dep.enabled:
            continue
        served = served_name(dep)
        for model in dict.fromkeys([served, *dep.aliases]):
            entries.append(ModelEntry(model, name, served))
        for adapter in dep.adapters:
            entries.append(ModelEntry(adapter, name, adapter, parent=served))
    return entries


def route_table(deployments: Mapping[str, DeploymentSettings]) -> dict[str, Route]:
    """Model name to route (names are unique across deployments: the settings refuse clashes)."""
    return {e.id: Route(e.deployment, e.served_name) for e in model_entries(deployments)}


@dataclass(frozen=True)
class Readiness:
    """A deployment's state and predicted seconds until ready, as /v1/models shows them."""

    state: str
    ready_seconds: float | None
    max_model_len: int | None = None
    """The server's context length as its boot log told (None: not booted yet, or not told)."""


def models_document(
    entries: list[ModelEntry], created: int, readiness: Mapping[str, Readiness] | None = None
) -> dict[str, Any]:
    """The /v1/models answer in vLLM's ModelCard shape (vllm/entrypoints/openai/protocol.py: `owned_by` "vllm",
    `root`, `parent`, `max_model_len`, one `permission`; an adapter's card has `parent` = its base and no
    `max_model_len`), each with its deployment's `state` and `ready_seconds` (extra fields: OpenAI clients keep
    or ignore them)."""
    data = []
    for e in entries:
        ready = (readiness or {}).get(e.deployment)
        entry: dict[str, Any] = {
            "id": e.id,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": e.served_name,
            "parent": e.parent,
            "max_model_len": ready.max_model_len if ready is not None and e.parent is None else None,
            "permission": [_permission(e.id, created)],
        }
        if ready is not None:
            entry["state"] = ready.state
            entry["ready_seconds"] = ready.ready_seconds
        data.append(entry)
    return {"object": "list", "data": data}


def _permission(model: str, created: int) -> dict[str, Any]:
    """vLLM's ModelPermission with its defaults; its id stable per model and gateway start (vLLM draws one per
    answer: clients only show it)."""
    digest = hashlib.sha256(f"{created}:{model}".encode()).hexdigest()[:32]
    return {
        "id": f"modelperm-{digest}",
        "object": "model_permission",
        "created": created,
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


def loading_comment(model: str, state: str | None, ready_in: float | None, held: bool = False) -> bytes:
    """The SSE comment a streamed request gets while it waits (clients skip lines that begin with ':')."""
    if held:
        doing = f"waiting for the next swap its group allows, then waking {model}"
    elif state in ("asleep", "waking"):
        doing = f"waking {model}"
    elif state == "draining":
        doing = f"{model} finishes its requests before a swap; waiting for its next turn"
    else:
        doing = f"starting {model}"
    if ready_in is None:
        about = ""
    elif ready_in < 0.05:  # due now (past its prediction): never "about 0.0 s", never below zero
        about = ", any moment now"
    else:
        about = f", about {ready_in:.1f} s"
    return f": dankserve: {doing}{about}\n\n".encode()


def retry_after(seconds: float | None, default: int) -> int:
    """A 503's Retry-After: the predicted seconds until ready, rounded up (at least 1); `default` without one."""
    if seconds is None:
        return default
    return max(1, math.ceil(seconds))


def error_document(status: int, message: str, kind: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape (as vLLM writes it)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class Routed:
    """A request body read for routing: the route and the bytes to pass on."""

    route: Route
    body: bytes
    streamed: bool = False
    """The body asks for a stream (`"stream": true`): the answer is SSE."""
    model: str = ""
    """The model name the request sent (what key scopes and usage go by)."""
    max_tokens: int | None = None
    """The completion's limit the request sets (LIMIT_FIELDS), for the tokens charged at admission."""
    usage_added: bool = False
    """The gateway asked the server for the stream's usage on the client's behalf: the client gets no usage event."""


class RoutingError(Exception):
    """The request cannot be routed; carries the HTTP status and OpenAI error document."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.document = error_document(status, message, kind, param)


def unknown_model(model: str) -> RoutingError:
    """The one answer for a model that does not exist and for one outside the key's scope (as /v1/models hides
    it): a key holder cannot tell which hidden names exist (vLLM's own words for an unknown model)."""
    return RoutingError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


NESTED_TOO_DEEPLY = "the request body nests arrays or objects too deeply to be read"


def route_body(body: bytes, table: Mapping[str, Route], *, ask_usage: bool = False) -> Routed:
    """Find the deployment a JSON body's `model` names; rewrite an alias to the served name. `ask_usage`
    (a route of USAGE_ON_REQUEST): a stream is asked for its usage (`stream_options.include_usage`)."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RoutingError(400, f"the request body is not JSON: {exc}", "BadRequestError") from None
    except RecursionError:
        raise RoutingError(400, NESTED_TOO_DEEPLY, "BadRequestError") from None
    if not isinstance(document, dict):
        raise RoutingError(400, "the request body must be a JSON object", "BadRequestError")
    model = document.get("model")
    if not isinstance(model, str) or not model:
        raise RoutingError(400, "the request names no `model`; GET /v1/models lists them", "BadRequestError", "model")
    route = table.get(model)
    if route is None:
        raise unknown_model(model)
    streamed = document.get("stream") is True
    limits = [v for v in (document.get(f) for f in LIMIT_FIELDS) if isinstance(v, int) and not isinstance(v, bool)]
    max_tokens = max(0, min(limits)) if limits else None
    options = document.get("stream_options")
    usage_added = ask_usage and streamed and not (isinstance(options, dict) and options.get("include_usage") is True)
    if model == route.served_name and not usage_added:
        return Routed(route, body, streamed, model, max_tokens)
    document["model"] = route.served_name
    if usage_added:
        document["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    try:
        return Routed(route, json.dumps(document).encode(), streamed, model, max_tokens, usage_added)
    except RecursionError:
        raise RoutingError(400, NESTED_TOO_DEEPLY, "BadRequestError") from None
