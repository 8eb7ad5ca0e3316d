"""Tests for dankserve.host.gpu_processes: the stand-in's per-process records read back by pid, hostile
records, and what cannot be read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from dankserve.host.gpu_processes import RECORD_BYTES, held_bytes, process_tree, stand_in_dir
from tests.harness.wait import wait_until

STANDIN = Path(__file__).resolve().parents[2] / "containers" / "fake-vllm"
sys.path.insert(0, str(STANDIN))
from fake_vllm.knobs import parse_knobs  # noqa: E402
from fake_vllm.nvml_record import remove_record, write_record  # noqa: E402


def test_a_record_the_stand_in_writes_is_read_for_its_pid(tmp_path: Path) -> None:
    """This process's record, written as the stand-in writes it, is found through /proc's pid namespace."""
    write_record(str(tmp_path), 123 << 20)
    assert held_bytes([os.getpid()], ["GPU-0", "GPU-1"], tmp_path) == {"GPU-0": 123 << 20, "GPU-1": 123 << 20}
    remove_record(str(tmp_path))
    assert held_bytes([os.getpid()], ["GPU-0"], tmp_path) is None, "no record: unreadable, not zero"


def test_records_of_other_processes_and_hostile_files_are_ignored(tmp_path: Path) -> None:
    """Another pid's record, a huge file, a file that is not JSON and negative bytes change nothing."""
    namespace = os.readlink("/proc/self/ns/pid")
    (tmp_path / "other.json").write_text(json.dumps({"pid": 1, "pid_namespace": "pid:[1]", "used_bytes": 5}))
    (tmp_path / "big.json").write_text(" " * (RECORD_BYTES + 10) + "{}")
    (tmp_path / "bad.json").write_text("{not json")
    mine = {"pid": os.getpid(), "pid_namespace": namespace, "used_bytes": -7}
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    assert held_bytes([os.getpid()], ["GPU-0"], tmp_path) == {"GPU-0": 0}


def test_nothing_to_ask_is_unreadable(tmp_path: Path) -> None:
    """No pids (the workload is gone) or no GPUs: None."""
    assert held_bytes([], ["GPU-0"], tmp_path) is None
    assert held_bytes([os.getpid()], [], tmp_path) is None


def test_the_records_live_beside_the_recorded_host_and_a_tree_holds_its_root(tmp_path: Path) -> None:
    """A run from host.json reads host.json.processes/; a real host (no file) reads NVML; a pid's tree has it."""
    assert stand_in_dir(tmp_path / "host.json") == tmp_path / "host.json.processes"
    assert stand_in_dir(None) is None
    assert process_tree(os.getpid())[0] == os.getpid()
    assert process_tree(None) == []


def test_a_tree_holds_every_descendant_as_psutil_finds_them() -> None:
    """/proc's children files give the same tree as psutil's scan of every process (grandchildren too)."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    try:
        wait_until(
            lambda: len(psutil.Process(shell.pid).children(recursive=True)) >= 2, 10, what="the shell's two sleeps"
        )
        expected = [os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))]
        assert sorted(process_tree(os.getpid())) == sorted(expected) and len(expected) >= 4
        assert process_tree(2**22 + 1) == [2**22 + 1]  # no such process: itself, as psutil's answer was
    finally:
        for child in psutil.Process(shell.pid).children(recursive=True):
            child.kill()
        shell.kill()
        shell.wait()


def test_the_stand_in_reads_its_swap_failure_knobs() -> None:
    """FAKE_VLLM_SLEEP_KEEPS_MEMORY, FAKE_VLLM_WAKE_TOKENS_DIFFER and FAKE_VLLM_NVML_DIR."""
    knobs = parse_knobs(
        {"FAKE_VLLM_SLEEP_KEEPS_MEMORY": "1", "FAKE_VLLM_WAKE_TOKENS_DIFFER": "yes", "FAKE_VLLM_NVML_DIR": "/x"}
    )
    assert knobs.sleep_keeps_memory and knobs.wake_tokens_differ and knobs.nvml_dir == "/x"
    assert not parse_knobs({}).sleep_keeps_memory and parse_knobs({}).nvml_dir is None
