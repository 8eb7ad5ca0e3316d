"""The capture and restore sequences (dankserve/snapshot/sequence.py): the order of steps, and what each
failure undoes (pure)."""

from __future__ import annotations

import pytest

from dankserve.snapshot.sequence import Step, canary_problem, capture_steps, on_failure, restore_steps


def _names(steps: tuple[Step, ...]) -> list[str]:
    return [s.name if s.pid is None else f"{s.name}:{s.pid}" for s in steps]


def test_capture_locks_all_then_checkpoints_all_then_dumps_which_ends_the_tree() -> None:
    """The restore's steps follow the dump (capture.capture restores the tree at once from the image)."""
    assert _names(capture_steps([7, 9])) == [
        "reference",
        "sleep",
        "gpu_lock:7",
        "gpu_lock:9",
        "gpu_checkpoint:7",
        "gpu_checkpoint:9",
        "room",
        "quiet",
        "criu_dump",
    ]


def test_restore_runs_criu_then_the_gpu_then_wakes_and_checks_the_canary() -> None:
    assert _names(restore_steps([9])) == ["criu_restore", "gpu_restore:9", "gpu_unlock:9", "wake", "canary"]
    assert _names(restore_steps([])) == ["criu_restore", "wake", "canary"], "no GPU process: CRIU alone"


def _until(steps: tuple[Step, ...], name: str) -> tuple[list[Step], Step]:
    index = _names(steps).index(name)
    return list(steps[:index]), steps[index]


@pytest.mark.parametrize(
    ("failed", "undo"),
    [
        ("reference", []),
        ("sleep", []),
        ("room", ["gpu_restore:7", "gpu_restore:9", "gpu_unlock:7", "gpu_unlock:9", "wake"]),
        ("quiet", ["gpu_restore:7", "gpu_restore:9", "gpu_unlock:7", "gpu_unlock:9", "wake"]),
        ("gpu_lock:9", ["gpu_unlock:7", "wake"]),
        ("gpu_checkpoint:7", ["gpu_unlock:7", "gpu_unlock:9", "wake"]),
        ("gpu_checkpoint:9", ["gpu_restore:7", "gpu_unlock:7", "gpu_unlock:9", "wake"]),
        ("criu_dump", ["gpu_restore:7", "gpu_restore:9", "gpu_unlock:7", "gpu_unlock:9", "wake"]),
    ],
)
def test_a_failed_capture_step_undoes_what_was_done_so_the_server_serves_again(failed: str, undo: list[str]) -> None:
    done, step = _until(capture_steps([7, 9]), failed)
    failure = on_failure("capture", done, step, "it broke")
    assert _names(failure.undo) == undo
    assert failure.message.startswith(f"capture failed at {step.name}") and failure.message.endswith("it broke")


def test_a_failed_restore_kills_what_criu_made_and_nothing_before() -> None:
    steps = restore_steps([9])
    assert on_failure("restore", [], steps[0], "bad size").undo == ()
    done, step = _until(steps, "canary")
    assert _names(on_failure("restore", done, step, "ids differ").undo) == ["kill_tree"]
    assert "(pid 9)" in on_failure("restore", [steps[0]], steps[1], "x").message


def test_the_canary_must_return_the_captured_ids() -> None:
    assert canary_problem([1, 2, 3], (1, 2, 3)) is None
    assert "at token 1" in (canary_problem([1, 2, 3], [1, 5, 3]) or "")
    assert "at token 2" in (canary_problem([1, 2, 3], [1, 2]) or "")
