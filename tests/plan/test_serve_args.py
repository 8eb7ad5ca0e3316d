"""Tests for dankserve.plan.serve_args: an argv read as vLLM's argparse reads it, by every reader alike."""

from __future__ import annotations

from dankserve.plan.plan import host_ram_bytes
from dankserve.plan.rules import GIB
from dankserve.plan.serve_args import option_number, option_value, served_name, spelled, split_options
from dankserve.supervisor.learning import MemoryFlags

ARGV = ("org/m", "--max_model_len", "8192", "--served-model-name=a", "--max-model-len=4096", "--served-model-name", "b")


def test_split_keeps_values_with_their_option() -> None:
    """`--x=v`, `--x v`, switches and several values each stay with their option."""
    leading, options = split_options(["pos", "--a=1", "--b", "2", "--c", "--d", "x", "y"])
    assert leading == ["pos"]
    assert [(o.name, o.values) for o in options] == [("--a", ("1",)), ("--b", ("2",)), ("--c", ()), ("--d", ("x", "y"))]


def test_the_last_occurrence_wins_in_either_spelling() -> None:
    """`--x v`, `--x=v` and `--x_y` are one option, and its last occurrence is the value (argparse's rule)."""
    assert spelled("--max_model_len") == "--max-model-len" and spelled("-tp") == "-tp"
    assert option_value(ARGV, "--max-model-len") == "4096"
    assert option_number(ARGV, "--max-model-len") == 4096.0
    assert option_value(ARGV, "--kv-cache-dtype") is None
    assert option_number(("m", "--max-model-len", "auto"), "--max-model-len") is None


def test_every_reader_of_a_plan_argv_agrees() -> None:
    """The memory flags, the served model name and the host RAM all take the last occurrence."""
    assert MemoryFlags.from_argv(ARGV).max_model_len == "4096"
    assert served_name("setting", ARGV, "org/m") == "b"
    assert host_ram_bytes(("m", "--swap-space", "4", "--swap-space=8"), 2) == 16 * GIB
