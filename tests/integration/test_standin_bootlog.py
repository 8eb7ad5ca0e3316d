"""Cross-check: the stand-in vLLM's real output, read by dankserve's boot-log reader.

Each scenario runs `python3 containers/fake-vllm/vllm.py serve ...` as a plain process (tiny
boot time, a free loopback port, its own VLLM_CACHE_ROOT), takes its combined stdout+stderr as
a log follower would, and checks that `read_boot_facts` and `BootLogReader.feed` report what
the stand-in did. Expected values are read from the stand-in's own lines with independent
regexes, or computed with its memory model, never from the reader. The scenarios run
concurrently (module fixture) to keep the suite short on small machines.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dankserve.bootlog import (
    BootFacts,
    BootLogReader,
    BootPhase,
    FailureClass,
    FailureDetected,
    PhaseChanged,
    StatsUpdated,
    read_boot_facts,
)
from tests.harness.wait import wait_until

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "containers" / "fake-vllm"
PROGRAM = STANDIN / "vllm.py"
MODEL = "/models/tiny-llama"
BOOT_SECONDS = "0.3"
WAIT_SECONDS = 20.0
GIB = 1 << 30
BOOT_PHASES = [BootPhase.LOADING, BootPhase.COMPILING, BootPhase.PROFILING, BootPhase.CAPTURING, BootPhase.READY]

sys.path.insert(0, str(STANDIN))
from fake_vllm.knobs import parse_knobs  # noqa: E402
from fake_vllm.memory import MemoryInputs, plan_memory  # noqa: E402


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def until_text(text: str, count: int = 1) -> Callable[[str], bool]:
    return lambda log: log.count(text) >= count


@dataclass(frozen=True)
class Scenario:
    """One stand-in run: its flags and knobs, and when to stop it (None: it exits by itself)."""

    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    stop_when: Callable[[str], bool] | None = None
    cache: str = ""  # runs naming the same cache share one VLLM_CACHE_ROOT, in table order


@dataclass(frozen=True)
class Run:
    """What one stand-in process wrote (stdout and stderr as one stream) and how it ended."""

    log: str
    returncode: int


READY = until_text("Application startup complete.")

SCENARIOS: dict[str, Scenario] = {
    "cold": Scenario(stop_when=READY, cache="shared"),
    "warm": Scenario(stop_when=READY, cache="shared"),
    "given_bytes": Scenario(args=("--kv-cache-memory-bytes", "20000000000"), stop_when=READY),
    "tp2": Scenario(args=("-tp", "2"), stop_when=READY),
    "stats": Scenario(
        env={
            "FAKE_VLLM_STATS_INTERVAL_SECONDS": "0.1",
            "FAKE_VLLM_KV_USAGE": "42",
            "FAKE_VLLM_PREEMPTIONS_PER_INTERVAL": "3",
        },
        stop_when=until_text("Preemptions: 3, ", 2),
    ),
    "oom_load": Scenario(env={"FAKE_VLLM_FAIL": "oom_load"}),
    "no_kv_memory": Scenario(env={"FAKE_VLLM_FAIL": "no_kv_memory"}),
    "max_len_forced": Scenario(args=("--max-model-len", "4096"), env={"FAKE_VLLM_FAIL": "max_len_too_large"}),
    "max_len_memory": Scenario(env={"FAKE_VLLM_GPU_MEMORY_BYTES": str(5 * GIB)}),
    "engine_dead": Scenario(
        env={
            "FAKE_VLLM_FAIL": "engine_dead",
            "FAKE_VLLM_FAIL_AFTER_SECONDS": "0.2",
            "FAKE_VLLM_WATCHDOG_SECONDS": "0.3",
        }
    ),
    "model_not_found": Scenario(env={"FAKE_VLLM_FAIL": "model_not_found"}),
    "unknown_flag": Scenario(args=("--swap-space", "16")),
    "bad_kv_dtype": Scenario(args=("--kv-cache-dtype", "q8_0")),
}


def base_env(cache_root: Path, extra: Mapping[str, str]) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FAKE_VLLM_", "VLLM_"))}
    env.update(
        NO_COLOR="1",
        VLLM_CACHE_ROOT=str(cache_root),
        FAKE_VLLM_BOOT_SECONDS=BOOT_SECONDS,
        FAKE_VLLM_DEV_DIR=str(cache_root / "no-dev"),
    )
    env.update(extra)
    return env


def run_standin(directory: Path, cache_root: Path, scenario: Scenario) -> Run:
    """Start the stand-in, stop it with SIGTERM once `stop_when` holds (or let it exit), return its log."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / "combined.log"
    argv = [sys.executable, str(PROGRAM), "serve", MODEL, "--host", "127.0.0.1", "--port", str(free_port())]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*argv, *scenario.args],
            env=base_env(cache_root, scenario.env),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        stop_when = scenario.stop_when
        if stop_when is not None:

            def settled() -> str | None:
                if process.poll() is not None:
                    return "exited"
                return "stop" if stop_when(log_path.read_bytes().decode(errors="replace")) else None

            if wait_until(settled, WAIT_SECONDS, 0.02, what="the line to stop at, or the stand-in's exit") == "stop":
                process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=WAIT_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return Run(log_path.read_bytes().decode(errors="replace"), returncode)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Run]]:
    """Every scenario's run; scenarios sharing a compile cache run one after another, the rest concurrently."""
    root = tmp_path_factory.mktemp("standin")
    chains: dict[str, list[str]] = {}
    for name, scenario in SCENARIOS.items():
        chains.setdefault(scenario.cache or name, []).append(name)

    def run_chain(cache: str, names: list[str]) -> dict[str, Run]:
        return {name: run_standin(root / name, root / f"cache-{cache}", SCENARIOS[name]) for name in names}

    results: dict[str, Run] = {}
    with ThreadPoolExecutor(max_workers=len(chains)) as pool:
        for chain in pool.map(lambda item: run_chain(*item), chains.items()):
            results.update(chain)
    yield results


def lines_of(log: str) -> list[str]:
    """The log as a follower gets it: split on newlines only (progress bars keep their \\r)."""
    return log.split("\n")


def facts_of(run: Run) -> BootFacts:
    """read_boot_facts over the \\n-split lines, after checking that a \\r split reads the same."""
    facts = read_boot_facts(lines_of(run.log))
    assert read_boot_facts(re.split(r"[\r\n]", run.log)) == facts
    return facts


def events_of(run: Run) -> list[object]:
    reader = BootLogReader()
    events: list[object] = []
    for line in lines_of(run.log):
        events += reader.feed(line + "\n")
    assert reader.facts == read_boot_facts(lines_of(run.log))
    return events


def phases(events: list[object]) -> list[BootPhase]:
    seen: list[BootPhase] = []
    for event in events:
        if isinstance(event, PhaseChanged) and (not seen or seen[-1] is not event.phase):
            seen.append(event.phase)
    return seen


def weights_percentages(events: list[object]) -> list[int | None]:
    return [e.weights_percent for e in events if isinstance(e, PhaseChanged) and e.phase is BootPhase.LOADING]


def first_int(pattern: str, log: str) -> int:
    found = re.search(pattern, log)
    assert found is not None, f"{pattern!r} not in the stand-in's log:\n{log}"
    return int(found.group(1).replace(",", ""))


def first_float(pattern: str, log: str) -> float:
    found = re.search(pattern, log)
    assert found is not None, f"{pattern!r} not in the stand-in's log:\n{log}"
    return float(found.group(1))


def test_cold_boot_facts_and_phase_events(runs: dict[str, Run]) -> None:
    """A cold boot: compile miss, the suggested --kv-cache-memory int, the Available GiB, phases in order, ready."""
    run = runs["cold"]
    assert run.returncode == 0
    facts = facts_of(run)
    assert facts.vllm_version == "0.33.0"
    assert facts.compile_cache_hit is False
    assert facts.kv_cache_memory_bytes == first_int(
        r"Replace gpu_memory_utilization config with `--kv-cache-memory=(\d+)`", run.log
    )
    assert facts.kv_cache_memory_bytes_source == "suggested"
    assert facts.kv_cache_gib == first_float(r"Available KV cache memory: ([\d.]+) GiB", run.log)
    assert facts.gpu_kv_cache_tokens == first_int(r"GPU KV cache size: ([\d,]+) tokens", run.log)
    assert facts.max_concurrency == first_float(r"tokens per request: ([\d.]+)x", run.log)
    assert facts.max_model_len == 131072
    assert facts.compile_seconds == first_float(r"torch\.compile took ([\d.]+) s in total", run.log)
    assert facts.model_load_seconds == first_float(
        r"Model loading took [\d.]+ GiB memory and ([\d.]+) seconds", run.log
    )
    assert (facts.ready, facts.failure, facts.phase) == (True, None, BootPhase.READY)
    events = events_of(run)
    assert phases(events) == BOOT_PHASES
    assert weights_percentages(events) == [0, 50, 100]
    assert not [e for e in events if isinstance(e, FailureDetected)]


def test_second_boot_with_the_same_cache_hits(runs: dict[str, Run]) -> None:
    """A second boot on the same VLLM_CACHE_ROOT loads the compiled graphs: compile_cache_hit True."""
    run = runs["warm"]
    facts = facts_of(run)
    assert "Directly load the compiled graph(s)" in run.log
    assert (facts.compile_cache_hit, facts.ready) == (True, True)
    assert facts.kv_cache_memory_bytes == first_int(r"`--kv-cache-memory=(\d+)`", run.log)
    assert phases(events_of(run)) == BOOT_PHASES


def test_given_kv_bytes_skip_profiling(runs: dict[str, Run]) -> None:
    """With --kv-cache-memory-bytes N the facts carry N as given, no Available GiB, and the boot still gets ready."""
    run = runs["given_bytes"]
    facts = facts_of(run)
    assert "skipped memory profiling" in run.log
    assert "Available KV cache memory" not in run.log
    assert facts.kv_cache_memory_bytes == 20000000000
    assert facts.kv_cache_memory_bytes_source == "given"
    assert facts.profiled is False
    assert facts.kv_cache_gib is None
    assert facts.gpu_kv_cache_tokens == first_int(r"GPU KV cache size: ([\d,]+) tokens", run.log)
    assert facts.ready is True
    assert phases(events_of(run)) == BOOT_PHASES


def test_tensor_parallel_ranks(runs: dict[str, Run]) -> None:
    """With TP=2 each Worker_TP rank logs its own suggestion; the facts take the smallest, per-rank compile once."""
    run = runs["tp2"]
    facts = facts_of(run)
    suggestions = [
        int(value) for value in re.findall(r"^\(Worker_TP\d pid=\d+\) .*?`--kv-cache-memory=(\d+)`", run.log, re.M)
    ]
    assert len(suggestions) == 2
    assert len(set(suggestions)) == 2  # ranks differ, as on real multi-GPU boots
    assert facts.kv_cache_memory_bytes == min(suggestions)
    assert facts.kv_cache_gib == first_float(r"Available KV cache memory: ([\d.]+) GiB", run.log)
    assert facts.compile_seconds == first_float(r"torch\.compile took ([\d.]+) s in total", run.log)
    assert (facts.compile_cache_hit, facts.ready) == (False, True)
    assert phases(events_of(run)) == BOOT_PHASES


def test_stats_lines_with_preemptions(runs: dict[str, Run]) -> None:
    """Stats lines after ready give the KV usage as a fraction and the interval's preemptions, as StatsUpdated."""
    run = runs["stats"]
    facts = facts_of(run)
    assert (facts.ready, facts.kv_cache_usage_perc, facts.preemptions) == (True, 0.42, 3)
    stats = [e for e in events_of(run) if isinstance(e, StatsUpdated)]
    assert len(stats) >= 2
    assert all(e == StatsUpdated(kv_cache_usage_perc=0.42, preemptions=3) for e in stats)


def memory_estimate(env: Mapping[str, str]) -> tuple[int, int]:
    """The stand-in's own memory model for a default `serve MODEL` boot: (estimated max len, max len)."""
    knobs = parse_knobs(env)
    plan = plan_memory(
        MemoryInputs(
            total_bytes=knobs.gpu_memory_bytes,
            used_by_others_bytes=knobs.gpu_used_bytes,
            model_bytes=knobs.model_bytes,
            kv_bytes_per_token=knobs.kv_bytes_per_token,
            model_max_len=knobs.model_max_len,
            tensor_parallel_size=1,
            gpu_memory_utilization=0.92,
            max_model_len=None,
            kv_cache_memory_bytes=None,
            kv_cache_dtype="auto",
            max_num_batched_tokens=8192,
            enforce_eager=False,
            activation_jitter_bytes=0,
            forced=None,
        )
    )
    assert plan.outcome == "max_len_too_large"
    return plan.estimated_max_model_len, plan.max_model_len


FAILURES: list[tuple[str, FailureClass, str, int]] = [
    ("oom_load", FailureClass.OOM_LOAD, "Failed to load model - not enough GPU memory.", 1),
    ("no_kv_memory", FailureClass.NO_KV_MEMORY, "ValueError: No available memory for the cache blocks.", 1),
    ("max_len_forced", FailureClass.MAX_LEN_TOO_LARGE, "ValueError: To serve at least one request", 1),
    ("max_len_memory", FailureClass.MAX_LEN_TOO_LARGE, "ValueError: To serve at least one request", 1),
    ("model_not_found", FailureClass.MODEL_NOT_FOUND, "huggingface_hub.errors.HFValidationError: Repo id must", 1),
    ("unknown_flag", FailureClass.BAD_ARGUMENT, "vllm: error: unrecognized arguments: --swap-space 16", 2),
    ("bad_kv_dtype", FailureClass.BAD_ARGUMENT, "Invalid kv_cache_dtype: 'q8_0'. Valid values are: ['auto', ", 1),
]


@pytest.mark.parametrize(("name", "failure", "message", "code"), FAILURES, ids=[f[0] for f in FAILURES])
def test_failed_boots_are_classified(
    runs: dict[str, Run], name: str, failure: FailureClass, message: str, code: int
) -> None:
    """Each way the stand-in fails a boot is read as its failure class with vLLM's root-cause message, not ready."""
    run = runs[name]
    assert run.returncode == code
    facts = facts_of(run)
    assert (facts.failure, facts.ready) == (failure, False)
    assert facts.failure_message is not None
    assert facts.failure_message.startswith(message), facts.failure_message
    detected = [e for e in events_of(run) if isinstance(e, FailureDetected)]
    assert detected[-1] == FailureDetected(failure, facts.failure_message, facts.estimated_max_model_len)


def test_max_len_estimates_match_the_stand_in(runs: dict[str, Run]) -> None:
    """The estimated maximum model length read from the log is the one the stand-in's memory model computed."""
    forced = runs["max_len_forced"]
    assert facts_of(forced).estimated_max_model_len == first_int(
        r"estimated maximum model length is (\d+)\.", forced.log
    )
    memory = runs["max_len_memory"]
    estimated, max_len = memory_estimate({"FAKE_VLLM_GPU_MEMORY_BYTES": str(5 * GIB)})
    assert 0 < estimated < max_len
    facts = facts_of(memory)
    assert facts.estimated_max_model_len == estimated
    assert facts.kv_cache_gib == first_float(r"Available KV cache memory: ([\d.]+) GiB", memory.log)
    assert f"max seq len ({max_len})" in (facts.failure_message or "")


def test_engine_death_after_ready(runs: dict[str, Run]) -> None:
    """An engine that dies while serving: ready stays True, the failure is engine_dead, and the process exits 0."""
    run = runs["engine_dead"]
    assert run.returncode == 0  # as real vLLM (vllm issue 48966)
    facts = facts_of(run)
    assert (facts.ready, facts.failure) == (True, FailureClass.ENGINE_DEAD)
    assert facts.failure_message == "EngineCore encountered a fatal error."
    events = events_of(run)
    assert phases(events) == BOOT_PHASES
    ready_at = events.index(PhaseChanged(BootPhase.READY))
    failures = [index for index, e in enumerate(events) if isinstance(e, FailureDetected)]
    assert failures
    assert min(failures) > ready_at
