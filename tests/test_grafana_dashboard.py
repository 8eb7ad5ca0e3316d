"""docs/grafana/dankserve.json: every query names metrics the daemon exports, and the issue's panels exist."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dankserve.supervisor.observe.metrics import EXPORTED
from dankserve.supervisor.observe.serving import RELAYED

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "dankserve.json"
METRIC = re.compile(r"\b(?:dankserve_[a-z_]+|vllm:[a-z_:]+)")
RELAYED_SAMPLES = {name + suffix for name in RELAYED for suffix in ("", "_total", "_bucket", "_sum", "_count")}


def queries(document: dict[str, Any]) -> list[str]:
    found = [target["expr"] for panel in document["panels"] for target in panel.get("targets", [])]
    for variable in document["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(query["query"])
    return found


def test_every_query_names_only_exported_metrics() -> None:
    """Each query names at least one metric, and every metric it names is exported by the daemon."""
    document = json.loads(DASHBOARD.read_text())
    for expr in queries(document):
        names = set(METRIC.findall(expr))
        assert names, expr
        unknown = names - EXPORTED - RELAYED_SAMPLES
        assert not unknown, f"{expr}: {unknown}"


def test_the_issues_panels_are_there() -> None:
    """State, boots, restart causes, boot times by kind, GPU memory, KV-cache usage, preemptions, the swap groups'
    sleep state and checks, and the gateway's requests and tokens have panels."""
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    for wanted in ("State", "Boots by kind", "Restarts by cause", "GPU memory", "KV-cache usage", "Preemptions"):
        assert wanted in titles
    assert any(title.startswith("Boot time by kind") for title in titles)
    for wanted in ("Sleep state", "Swap check failures", "Gateway requests by code", "Gateway tokens by key"):
        assert wanted in titles  # issue 39 (low): the gateway's and the swap groups' panels


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is missing")
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses every panel query (Grafana's variables filled in) as a recording rule."""
    document = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in document["panels"] for target in panel.get("targets", [])]
    filled = [
        expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$deployment", ".*") for expr in exprs
    ]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"q{i}", "expr": e} for i, e in enumerate(filled)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    done = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_sleep_mode_and_admission_panels_read_relayed_metrics() -> None:
    """vLLM 0.32+'s sleep-mode durations, operations in flight and admission rejections (issue 42) have panels,
    and the daemon relays each family they read."""
    document = json.loads(DASHBOARD.read_text())
    by_title = {panel["title"]: panel for panel in document["panels"]}
    wanted = {
        "Sleep and wake time (p50 / p95)": "vllm:sleep_mode_operation_duration_seconds_bucket",
        "Sleep-mode operations": "vllm:sleep_mode_operations_in_flight",
        "Admission rejections": "vllm:admission_rejections_total",
    }
    for title, metric in wanted.items():
        assert title in by_title
        assert any(metric in target["expr"] for target in by_title[title]["targets"])
    for family in (
        "vllm:sleep_mode_operation_duration_seconds",
        "vllm:sleep_mode_operations_in_flight",
        "vllm:admission_rejections",
    ):
        assert family in RELAYED
