"""Tests for dankserve.supervisor.lifecycle."""

import pytest

from dankserve.supervisor.lifecycle import Phase, advance_boot_phase, all_settled, status_line


@pytest.mark.parametrize(
    ("current", "reported", "expected"),
    [
        (Phase.STARTING, Phase.LOADING, Phase.LOADING),
        (Phase.LOADING, Phase.COMPILING, Phase.COMPILING),
        (Phase.COMPILING, Phase.LOADING, Phase.COMPILING),
        (Phase.CAPTURING, Phase.PROFILING, Phase.CAPTURING),
        (Phase.PROFILING, Phase.READY, Phase.READY),
        (Phase.FAILED, Phase.LOADING, Phase.FAILED),
        (Phase.PULLING, Phase.LOADING, Phase.PULLING),
    ],
)
def test_boot_phases_only_move_forward(current: Phase, reported: Phase, expected: Phase) -> None:
    """A boot-log event moves the phase forward, never back, and never out of a non-boot phase."""
    assert advance_boot_phase(current, reported) is expected


def test_settled_means_ready_failed_or_stopped() -> None:
    """systemd's READY=1 waits until every deployment is ready, failed or stopped."""
    assert all_settled({"a": Phase.READY, "b": Phase.FAILED, "c": Phase.STOPPED})
    assert not all_settled({"a": Phase.READY, "b": Phase.LOADING})
    assert all_settled({})


def test_status_line_shows_weights_percentage_while_loading() -> None:
    """The STATUS= text lists deployments by name with the loading percentage."""
    line = status_line({"chat": Phase.LOADING, "embed": Phase.READY}, {"chat": 40, "embed": None})
    assert line.text == "chat: loading 40%, embed: ready"
    assert status_line({}, {}).text == "no deployments configured"
