"""Predicted boot and wake times from a deployment's history (pure)."""

from __future__ import annotations

from dankserve.state import KEPT, timings_from_json, timings_json
from dankserve.supervisor.observe.prediction import (
    Predicted,
    predict,
    remaining,
    remembered,
    slower_than_predicted,
    timing_kind,
)


def test_no_history_predicts_nothing() -> None:
    """Without timings every prediction is None (status shows none, the gateway falls back to its constant)."""
    assert predict({}) == Predicted()
    assert predict({}).to_json() == {
        "cold_seconds": None,
        "warm_seconds": None,
        "wake_seconds": None,
        "restore_seconds": None,
    }


def test_restores_are_predicted_apart_from_boots() -> None:
    """A snapshot's restore (issue 41) has its own history: it never pulls a boot's prediction down."""
    got = predict({"restore": (1.4, 1.5, 1.6), "warm": (20.0,)})
    assert got.restore == 1.5 and got.of("restore") == 1.5 and got.boot() == 20.0
    assert timing_kind("restore") == "restore"


def test_a_prediction_is_the_median_of_the_latest_five_of_its_kind() -> None:
    """One odd boot moves the median little; older timings than the window do not count."""
    timings = {"warm": (100.0, 100.0, 10.0, 12.0, 11.0, 90.0, 13.0), "cold": (40.0,), "wake": (0.8, 1.0, 0.9)}
    got = predict(timings)
    assert got.warm == 12.0 and got.cold == 40.0 and got.wake == 0.9 and got.sleep is None


def test_a_boot_is_predicted_warm_once_it_has_booted_warm() -> None:
    """Before its kind is known a boot counts as warm when warm history exists, else cold."""
    assert Predicted(cold=40.0).boot() == 40.0
    assert Predicted(cold=40.0, warm=12.0).boot() == 12.0


def test_boot_kinds_map_onto_cold_warm_and_wake() -> None:
    """Learned-bytes and launcher boots are warm boots for the prediction."""
    assert [timing_kind(k) for k in ("cold", "warm", "learned_bytes", "launcher", "wake")] == [
        "cold",
        "warm",
        "warm",
        "warm",
        "wake",
    ]


def test_only_the_latest_timings_are_kept() -> None:
    """Each kind keeps at most KEPT timings, the oldest dropped first."""
    timings: dict[str, tuple[float, ...]] = {}
    for seconds in range(KEPT + 3):
        timings = remembered(timings, "wake", float(seconds))
    assert timings["wake"] == tuple(float(s) for s in range(3, KEPT + 3))


def test_more_than_twice_the_prediction_is_slower_than_predicted() -> None:
    """Twice is still within; none without a prediction."""
    assert slower_than_predicted(2.1, 1.0) and not slower_than_predicted(2.0, 1.0)
    assert not slower_than_predicted(1000.0, None)


def test_what_remains_of_a_predicted_wait() -> None:
    """The prediction less what passed; past it, a tenth of it (due any moment); unknown stays unknown."""
    assert remaining(10.0, 4.0) == 6.0
    assert remaining(10.0, 12.0) == 1.0
    assert remaining(None, 1.0) is None


def test_timings_survive_state_json_and_bad_values_are_dropped() -> None:
    """Round trip through the JSON form; unknown kinds, booleans, negatives and non-lists are dropped."""
    timings = {"cold": (41.2,), "wake": (0.9, 1.1)}
    assert timings_from_json(timings_json(timings)) == timings
    assert timings_from_json({"cold": [1, True, -3, "x", 2.5], "mystery": [1.0], "wake": 3}) == {"cold": (1.0, 2.5)}
    assert timings_from_json(None) == {}
