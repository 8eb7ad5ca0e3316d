"""Tests for dankserve.gateway.routing: names to deployments, alias rewriting, error shapes."""

from __future__ import annotations

import json

import pytest

from dankserve.gateway.routing import (
    ModelEntry,
    Readiness,
    Route,
    RoutingError,
    loading_comment,
    model_entries,
    models_document,
    retry_after,
    route_body,
    route_table,
)
from dankserve.settings import DeploymentSettings

DEPLOYMENTS = {
    "chat": DeploymentSettings(model="org/chat-8b", served_model_name="chat", aliases=["gpt-4o", "chat"]),
    "embed": DeploymentSettings(model="org/embed"),
    "old": DeploymentSettings(model="org/old", enabled=False, aliases=["legacy"]),
}


def test_entries_are_served_name_then_aliases_once_each_enabled_only() -> None:
    """A served name listed again as an alias appears once; a disabled deployment not at all."""
    assert model_entries(DEPLOYMENTS) == [
        ModelEntry("chat", "chat", "chat"),
        ModelEntry("gpt-4o", "chat", "chat"),
        ModelEntry("org/embed", "embed", "org/embed"),
    ]


def test_models_document_is_openai_list() -> None:
    """/v1/models' document: object list, each a model object rooted at the served name, in vLLM's ModelCard
    shape (owned_by, parent, max_model_len, one permission: issue 39 item 14)."""
    readiness = {"chat": Readiness("ready", 0.0, max_model_len=4096)}
    document = models_document(model_entries(DEPLOYMENTS), created=123, readiness=readiness)
    assert document["object"] == "list"
    card = document["data"][1]
    permission = card.pop("permission")
    assert card == {
        "id": "gpt-4o",
        "object": "model",
        "created": 123,
        "owned_by": "vllm",
        "root": "chat",
        "parent": None,
        "max_model_len": 4096,
        "state": "ready",
        "ready_seconds": 0.0,
    }
    assert len(permission) == 1 and permission[0]["object"] == "model_permission"
    assert permission[0]["id"].startswith("modelperm-") and permission[0]["allow_sampling"] is True
    assert document["data"][2]["max_model_len"] is None  # no readiness known: none told


@pytest.mark.parametrize(
    ("model", "route", "sent_model"),
    [
        ("chat", Route("chat", "chat"), "chat"),
        ("gpt-4o", Route("chat", "chat"), "chat"),
        ("org/embed", Route("embed", "org/embed"), "org/embed"),
    ],
)
def test_route_body(model: str, route: Route, sent_model: str) -> None:
    """The route of each name; the body passed on names the served model."""
    body = json.dumps({"model": model, "messages": [], "stream": True}).encode()
    routed = route_body(body, route_table(DEPLOYMENTS))
    assert routed.route == route
    assert json.loads(routed.body) == {"model": sent_model, "messages": [], "stream": True}
    if model == sent_model:
        assert routed.body is body  # passed on untouched


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        (b'{"model": "legacy"}', 404, "The model `legacy` does not exist."),
        (b'{"model": "nope"}', 404, "The model `nope` does not exist."),
        (b"{}", 400, "names no `model`"),
        (b'{"model": 3}', 400, "names no `model`"),
        (b"[1]", 400, "must be a JSON object"),
        (b"\xff", 400, "not JSON"),
        (b"", 400, "not JSON"),
    ],
)
def test_routing_errors(body: bytes, status: int, text: str) -> None:
    """Unroutable bodies: the status and OpenAI's error document."""
    with pytest.raises(RoutingError) as caught:
        route_body(body, route_table(DEPLOYMENTS))
    assert caught.value.status == status
    error = caught.value.document["error"]
    assert text in error["message"]
    assert error["code"] == status


def test_models_document_carries_each_deployments_state_and_ready_seconds() -> None:
    """Extra fields from the readiness given: every name of a deployment shows its state and ready seconds."""
    readiness = {"chat": Readiness("asleep", 0.9), "embed": Readiness("ready", 0.0)}
    data = models_document(model_entries(DEPLOYMENTS), created=1, readiness=readiness)["data"]
    assert [(e["id"], e["state"], e["ready_seconds"]) for e in data] == [
        ("chat", "asleep", 0.9),
        ("gpt-4o", "asleep", 0.9),
        ("org/embed", "ready", 0.0),
    ]


def test_loading_comments_say_what_the_request_waits_for() -> None:
    """An SSE comment line (a blank line after it), with the predicted seconds when known."""
    assert loading_comment("model-b", "asleep", 0.9) == b": dankserve: waking model-b, about 0.9 s\n\n"
    assert loading_comment("qwen3", "starting", None) == b": dankserve: starting qwen3\n\n"
    assert b"finishes its requests before a swap" in loading_comment("a", "draining", None)
    assert b"next swap its group allows" in loading_comment("b", "asleep", 51.0, held=True)
    # due now, or past due: never a count of zero or below
    for due in (0.0, 0.02, -3.0):
        assert loading_comment("b", "waking", due) == b": dankserve: waking b, any moment now\n\n"


def test_retry_after_is_the_prediction_rounded_up() -> None:
    """At least 1 s; the configured value without a prediction."""
    assert [retry_after(12.3, 5), retry_after(0.2, 5), retry_after(None, 5)] == [13, 1, 5]


def test_adapters_are_names_of_their_base_deployment() -> None:
    """An adapter routes to its base deployment under its own name and is listed with `parent` = the base's name."""
    deployments = {"d": DeploymentSettings(model="org/base", served_model_name="base", adapters={"sql": "org/sql"})}
    table = route_table(deployments)
    assert table["sql"] == Route("d", "sql")
    routed = route_body(b'{"model": "sql", "prompt": "x"}', table)
    assert routed.route.deployment == "d" and routed.body == b'{"model": "sql", "prompt": "x"}'
    listed = models_document(model_entries(deployments), 0)["data"]
    assert [(m["id"], m.get("parent")) for m in listed] == [("base", None), ("sql", "base")]


def test_a_stream_is_asked_for_its_usage_and_the_completion_limit_is_read() -> None:
    """ask_usage: a stream that did not ask gets include_usage (its other stream_options kept); one that asked,
    or no stream, is passed as it came. max_tokens (or its kin) is read for the admission estimate."""
    table = route_table(DEPLOYMENTS)
    body = json.dumps({"model": "chat", "stream": True, "stream_options": {"continuous_usage_stats": True}})
    routed = route_body(body.encode(), table, ask_usage=True)
    assert routed.usage_added and routed.max_tokens is None
    options = json.loads(routed.body)["stream_options"]
    assert options == {"continuous_usage_stats": True, "include_usage": True}
    asked = json.dumps({"model": "chat", "stream": True, "stream_options": {"include_usage": True}}).encode()
    assert route_body(asked, table, ask_usage=True).body == asked
    plain = json.dumps({"model": "chat", "max_completion_tokens": 7}).encode()
    routed = route_body(plain, table, ask_usage=True)
    assert routed.body == plain and not routed.usage_added and routed.max_tokens == 7
    assert not route_body(body.encode(), table).usage_added  # a route without stream_options
