"""Tests for dankserve.supervisor.requests: the control requests' verb table (the daemon behind it faked at
its `Answering` seam; tests/cli and tests/supervisor drive the real one)."""

from __future__ import annotations

from typing import Any, Literal

from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor.reloading import ReloadOutcome
from dankserve.supervisor.requests import VERBS, answer


class Recording:
    """Answers as a daemon would and records what it was asked."""

    def __init__(self) -> None:
        self.settings = Settings(deployments={"chat": DeploymentSettings(model="org/m")})
        self.asked: list[tuple[str, str]] = []

    def status(self) -> dict[str, Any]:
        return {"deployments": []}

    def reload_and_wait(self, timeout: float) -> ReloadOutcome | None:
        return None

    def take_down(self, name: str) -> None:
        self.asked.append(("down", name))

    def bring_up(self, name: str) -> None:
        self.asked.append(("up", name))

    def swap_and_wait(self, verb: Literal["sleep", "wake"], name: str) -> dict[str, Any]:
        self.asked.append((verb, name))
        return {"ok": True}


def test_every_verb_the_cli_sends_is_in_the_table() -> None:
    """status, reload, settings, up, down, sleep and wake each have their answer; another verb is refused."""
    assert set(VERBS) == {"status", "reload", "settings", "up", "down", "sleep", "wake"}
    assert answer(Recording(), {"command": "bogus"}) == {"ok": False, "error": "unknown command 'bogus'"}


def test_a_deployment_verb_names_a_configured_deployment() -> None:
    """up, down, sleep and wake reach the daemon for a configured deployment only; an unknown one is said."""
    daemon = Recording()
    for verb in ("up", "down", "sleep", "wake"):
        assert answer(daemon, {"command": verb, "deployment": "chat"})["ok"]
        refused = answer(daemon, {"command": verb, "deployment": "nope"})
        assert refused == {"ok": False, "error": "unknown deployment 'nope' (configured: chat)"}
    assert daemon.asked == [("up", "chat"), ("down", "chat"), ("sleep", "chat"), ("wake", "chat")]
    assert answer(daemon, {"command": "reload"})["ok"] is False
