"""The upgrade's pure checks: flags gone from a release, KV capacity, decode throughput, greedy ids."""

from __future__ import annotations

from dankserve.supervisor.upgrade import Limits, Measurement, flags_gone, judge

OLD = Measurement(kv_cache_tokens=100_000, decode_tokens_per_second=50.0, greedy_ids=(1, 2, 3))


def test_flags_gone_names_planned_options_the_release_lacks_once_in_order() -> None:
    """Options (with or without `=value`) missing from the accepted set are named once; values are not options."""
    argv = ["--model", "m", "--old-flag=1", "--max-model-len", "4096", "--old-flag", "2", "--gone"]
    assert flags_gone(argv, {"--model", "--max-model-len"}) == ("--old-flag", "--gone")


def test_flags_gone_is_empty_when_every_option_is_accepted() -> None:
    """A plan the release accepts has nothing gone."""
    assert flags_gone(["--model", "m", "--"], {"--model"}) == ()


def test_an_equal_server_switches_and_reports_equal_greedy_ids() -> None:
    """Same KV and speed: switch, greedy ids reported equal."""
    verdict = judge(OLD, OLD, Limits())
    assert verdict.switch and verdict.report["greedy_ids_equal"] is True


def test_kv_shrunk_beyond_the_limit_rolls_back_naming_the_figures() -> None:
    """A 10 % smaller KV cache under a 5 % limit is a regression, the message names both sizes."""
    verdict = judge(OLD, Measurement(90_000, 50.0, (1, 2, 3)), Limits())
    assert not verdict.switch
    assert verdict.reasons == ("KV cache shrank 10.0 % (100000 -> 90000 tokens; the limit is 5 %)",)


def test_kv_shrunk_within_the_limit_switches() -> None:
    """4 % smaller under a 5 % limit passes."""
    assert judge(OLD, Measurement(96_000, 50.0, (1, 2, 3)), Limits()).switch


def test_slower_decode_beyond_the_limit_rolls_back() -> None:
    """20 % slower under a 10 % limit is a regression; a raised limit lets it pass."""
    slow = Measurement(100_000, 40.0, (1, 2, 3))
    assert not judge(OLD, slow, Limits()).switch
    assert judge(OLD, slow, Limits(decode_slowdown_percent=25)).switch


def test_different_greedy_ids_are_reported_not_judged() -> None:
    """A changed token at a tie is no regression: reported with its index."""
    verdict = judge(OLD, Measurement(100_000, 50.0, (1, 2, 4)), Limits())
    assert verdict.switch and verdict.report["greedy_ids_first_difference"] == 2


def test_a_figure_the_new_server_cannot_give_is_a_regression() -> None:
    """The old server had a KV size and a speed; the new one none: both are named."""
    verdict = judge(OLD, Measurement(None, None), Limits())
    assert not verdict.switch and len(verdict.reasons) == 2


def test_a_figure_the_old_server_never_had_is_not_held_against_the_new() -> None:
    """Nothing to compare with: switch."""
    assert judge(Measurement(None, None), Measurement(None, 1.0), Limits()).switch
