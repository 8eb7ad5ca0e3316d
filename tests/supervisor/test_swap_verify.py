"""Tests for dankserve.supervisor.fleet.swap_verify: the verifier's answers over fake readings (a real StateBook),
and the canary answer's parsing as an attacker would send it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dankserve.backend_address import TcpAddress
from dankserve.supervisor import machine as m
from dankserve.supervisor.fleet.swap_verify import SwapTarget, SwapVerifier, _token_ids
from dankserve.supervisor.observe.swap_history import SwapCheck, SwapHistory, swap_failure
from dankserve.supervisor.records import StateBook

GIB = 1 << 30


def target() -> SwapTarget:
    return SwapTarget("a", "m", "ma", TcpAddress("127.0.0.1", 1), None, "0.26.0", "kv1-x", ("GPU-0",), lambda: [1], 0)


def verifier(tmp_path: Path, held: dict[str, int] | None, answers: list[tuple[int, ...] | str]) -> SwapVerifier:
    state_dir = tmp_path / "state"
    state_dir.mkdir(mode=0o700)
    os.chmod(state_dir, 0o700)
    return SwapVerifier(StateBook(state_dir), lambda address, k, n: answers.pop(0), lambda pids, uuids: held)


def test_a_first_sleep_takes_the_fingerprint_and_a_freed_sleep_passes(tmp_path: Path) -> None:
    """The canary before the first sleep is kept; NVML within the tolerance: the sleep's own answer."""
    check = verifier(tmp_path, {"GPU-0": 200 << 20}, [(1, 2, 3)])
    assert check.sleep(target(), lambda: m.FellAsleep(0.2)) == m.FellAsleep(0.2)
    assert check._state.deployment("a").canaries == {"kv1-x": (1, 2, 3)}


def test_a_sleep_that_keeps_its_memory_answers_sleep_kept_memory(tmp_path: Path) -> None:
    """20 GiB held asleep: SleepKeptMemory with the bytes."""
    event = verifier(tmp_path, {"GPU-0": 20 * GIB}, [(1,)]).sleep(target(), lambda: m.FellAsleep(0.2))
    assert isinstance(event, m.SleepKeptMemory) and event.held_bytes == 20 * GIB


def test_a_failed_sleep_is_passed_on_unchecked(tmp_path: Path) -> None:
    """The sleep's own failure is the answer."""
    event = verifier(tmp_path, {"GPU-0": 20 * GIB}, [(1,)]).sleep(target(), lambda: m.SleepFailed("HTTP 500"))
    assert event == m.SleepFailed("HTTP 500")


@pytest.mark.parametrize(("answer", "ok"), [((1, 2, 3), True), ((1, 2, 4), False), ("HTTP 503", False)])
def test_a_wake_is_checked_against_the_fingerprint(tmp_path: Path, answer: tuple[int, ...] | str, ok: bool) -> None:
    """The same ids: WokeUp (its seconds with the canary's); others or none: WokeWrong."""
    check = verifier(tmp_path, None, [(1, 2, 3), answer])
    check.sleep(target(), lambda: m.FellAsleep(0.2))
    event = check.wake(target(), lambda: m.WokeUp(0.3))
    assert isinstance(event, m.WokeUp if ok else m.WokeWrong)
    if isinstance(event, m.WokeUp):
        assert event.seconds >= 0.3


def test_a_wake_without_fingerprint_is_not_checked(tmp_path: Path) -> None:
    """No fingerprint for the configuration: the wake's own answer, no canary sent."""
    answers: list[tuple[int, ...] | str] = []
    assert verifier(tmp_path, None, answers).wake(target(), lambda: m.WokeUp(0.3)) == m.WokeUp(0.3)


def test_marking_a_level_unsafe_is_kept_once_per_level(tmp_path: Path) -> None:
    """Two marks of level 1 keep the latest; stop is never marked."""
    check = verifier(tmp_path, None, [])
    for reason in ("first", "second"):
        check.mark_unsafe("a", "m", "0.26.0", "1", reason)
    check.mark_unsafe("a", "m", "0.26.0", "stop", "x")
    assert [(u.level, u.reason) for u in check._state.deployment("a").unsafe_sleep] == [("1", "second")]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"choices": [{"token_ids": [5, 6, 7], "text": "x"}]}, (5, 6, 7)),
        ({"choices": [{"token_ids": list(range(100))}]}, tuple(range(8))),
        ({"choices": [{"token_ids": [1, "2"], "text": "ab"}]}, (97, 98)),  # not ints: the text stands in
        ({"choices": [{"token_ids": [True]}]}, "the answer has neither token_ids nor text"),
        ({"choices": []}, "the answer is not a completion"),
        ([1, 2], "the answer is not a completion"),
    ],
)
def test_the_canary_answer_is_read_defensively(body: object, expected: tuple[int, ...] | str) -> None:
    """Only a list of ints counts as ids, cut at the canary's length; anything else is named."""
    assert _token_ids(json.dumps(body).encode()) == expected


def test_each_check_is_noted_with_its_verdict(tmp_path: Path) -> None:
    """The checks a sleep and a wake were given (the swap history's): NVML's reading, the canary's."""
    check = verifier(tmp_path, {"GPU-0": 200 << 20}, [(1, 2, 3), (1, 2, 4)])
    noted: list[SwapCheck] = []
    check.sleep(target(), lambda: m.FellAsleep(0.2), noted)
    check.wake(target(), lambda: m.WokeUp(0.3), noted)
    assert [(c.check, c.verdict) for c in noted] == [("memory", "passed"), ("canary", "failed")]
    assert noted[0].held_bytes == 200 << 20 and "other tokens" in noted[1].detail
    unread: list[SwapCheck] = []
    (tmp_path / "x").mkdir()
    verifier(tmp_path / "x", None, []).wake(target(), lambda: m.WokeUp(0.3), unread)
    assert [(c.check, c.verdict) for c in unread] == [("canary", "not checked")]


def test_the_swap_history_is_bounded_newest_first_with_its_checks() -> None:
    history = SwapHistory(size=3)
    memory = SwapCheck("memory", "passed", "fine", 1)
    history.checked("a", "sleep", [memory], failure=None, level="1", group="g", at=1.0)
    history.ended("a", "sleep", "1", 0.5, group="g", at=2.0)
    history.checked("b", "wake", [], failure=swap_failure(m.WakeFailed("HTTP 500")), level="1", group="g", at=3.0)
    for at in (4.0, 5.0):
        history.ended("b", "wake", "stop", 9.0, group="g", at=at)  # woken by booting: no checks
    entries = history.newest_first()
    assert [e["at"] for e in entries] == [5.0, 4.0, 3.0]
    assert entries[2]["failure"] == "HTTP 500" and not entries[2]["ok"] and entries[0]["checks"] == []
    history.ended("a", "sleep", "1", 0.5, group="g", at=6.0)
    assert history.newest_first()[0]["checks"] == []  # a's checks went with its first sleep
