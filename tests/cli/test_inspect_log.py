"""Tests for dankserve.cli.inspect_log: the `dankserve inspect-log` command as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "bootlog" / "fixtures"


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "dankserve", "inspect-log", *args], input=stdin, capture_output=True, check=False
    )


def test_json_of_a_failed_boot_exits_zero() -> None:
    """A log of a failed boot is reported as JSON with exit 0 (the failure is a fact)."""
    done = run(str(FIXTURES / "fail_max_len_too_large.log"), "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["failure"] == "max_len_too_large"
    assert facts["estimated_max_model_len"] == 34480
    assert next(iter(facts)) == "vllm_version"


def test_stdin_and_text_listing() -> None:
    """`-` reads stdin, and the text form lists each fact as key and value."""
    done = run("-", stdin=(FIXTURES / "v033_cold.log").read_bytes())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    # one KV line (issue 39: two sizes that differ read as a contradiction): the bytes to pin, then what
    # profiling found, each named
    kv = [line for line in lines if "GiB" in line]
    assert len(kv) == 1 and kv[0].split()[:3] == ["kv_cache", "123.43", "GiB"], kv
    assert "(132530194268 bytes, as --kv-cache-memory-bytes pins it); profiling found " in kv[0]
    assert not [line for line in lines if line.startswith(("kv_cache_gib", "kv_cache_memory_bytes"))]
    assert any(line.split() == ["ready", "yes"] for line in lines)


def test_unreadable_file_is_invalid_input(tmp_path: Path) -> None:
    """A missing file exits 2 with a message naming it and a fix, no traceback."""
    missing = tmp_path / "nope.log"
    done = run(str(missing))
    assert done.returncode == 2
    assert str(missing) in done.stderr.decode()
    assert "fix:" in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def test_a_file_that_is_not_a_vllm_log_exits_2_naming_it(tmp_path: Path) -> None:
    """A file holding no vLLM boot line (a host name, an empty file, stdin of other text) is exit 2 naming it,
    never facts of an implicit boot."""
    other = tmp_path / "hostname"
    other.write_text("gpu-host-1\n")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    for path in (other, empty):
        done = run(str(path))
        assert done.returncode == 2, done.stdout
        assert f"{path} holds no vLLM boot" in done.stderr.decode() and b"boots_in_log" not in done.stdout
    done = run("-", "--json", stdin=b"just some text\n")
    assert done.returncode == 2 and b"standard input holds no vLLM boot" in done.stderr and done.stdout == b""
