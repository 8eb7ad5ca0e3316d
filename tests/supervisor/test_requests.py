"""Tests for dankserve.supervisor.control.requests: the control requests' verb table (the daemon behind it faked at
its `Answering` seam; tests/cli and tests/supervisor drive the real one)."""

from __future__ import annotations

from typing import Any, Literal

from dankserve.settings import DeploymentSettings, Settings
from dankserve.supervisor.control.requests import VERBS, answer
from dankserve.supervisor.reloading import ReloadOutcome


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

    def restart(self, name: str) -> None:
        self.asked.append(("restart", name))

    def swap_and_wait(self, verb: Literal["sleep", "wake"], name: str) -> dict[str, Any]:
        self.asked.append((verb, name))
        return {"ok": True}

    @property
    def upgrades(self) -> Recording:
        return self

    def start(self, name: str, image: str | None, pull: str = "missing", *, if_newer: bool = False) -> str | None:
        self.asked.append(("upgrade", f"{name} {image} {pull}"))
        return None if name == "chat" else "no"

    def rollback(self, name: str) -> str | None:
        self.asked.append(("rollback", name))
        return "deployment 'chat' has no switched upgrade to roll back"


def test_every_verb_the_cli_sends_is_in_the_table() -> None:
    """status, reload, settings, up, down, restart, sleep, wake, upgrade and rollback each have their answer;
    another verb is refused."""
    expected = {"status", "reload", "settings", "up", "down", "restart", "sleep", "wake", "upgrade", "rollback"}
    assert set(VERBS) == expected
    assert answer(Recording(), {"command": "bogus"}) == {"ok": False, "error": "unknown command 'bogus'"}


def test_a_deployment_verb_names_a_configured_deployment() -> None:
    """up, down, sleep and wake reach the daemon for a configured deployment only; an unknown one is said."""
    daemon = Recording()
    for verb in ("up", "down", "restart", "sleep", "wake"):
        assert answer(daemon, {"command": verb, "deployment": "chat"})["ok"]
        refused = answer(daemon, {"command": verb, "deployment": "nope"})
        assert refused == {"ok": False, "error": "unknown deployment 'nope' (configured: chat)"}
    verbs = ("up", "down", "restart", "sleep", "wake")
    assert daemon.asked == [(verb, "chat") for verb in verbs]
    assert answer(daemon, {"command": "reload"})["ok"] is False


def test_upgrade_and_rollback_reach_the_daemon_and_refuse_bad_input() -> None:
    """An image that is no string or a pull policy not known is refused before the daemon; its refusal is said."""
    daemon = Recording()
    assert answer(daemon, {"command": "upgrade", "deployment": "chat", "image": "img:new"}) == {"ok": True}
    assert daemon.asked == [("upgrade", "chat img:new missing")]
    assert not answer(daemon, {"command": "upgrade", "deployment": "chat", "image": 7})["ok"]
    assert not answer(daemon, {"command": "upgrade", "deployment": "chat", "image": " "})["ok"]
    assert not answer(daemon, {"command": "upgrade", "deployment": "chat", "pull": "sometimes"})["ok"]
    assert not answer(daemon, {"command": "upgrade", "deployment": "nope"})["ok"]
    refused = answer(daemon, {"command": "rollback", "deployment": "chat"})
    assert refused == {"ok": False, "error": "deployment 'chat' has no switched upgrade to roll back"}
