"""Tests for dankserve.bootlog.reader: fixture logs of every era, live events, robustness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dankserve.bootlog import (
    BootLogReader,
    BootPhase,
    BootStarted,
    FailureClass,
    FailureDetected,
    PhaseChanged,
    StatsUpdated,
    read_boot_facts,
)
from dankserve.bootlog.patterns import ALL_PATTERNS
from dankserve.bootlog.reader import parse_human_int

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> list[str]:
    """A fixture log's lines, \\r kept."""
    return (FIXTURES / name).read_bytes().decode("utf-8").split("\n")


COLD: dict[str, Any] = {
    "vllm_version": "0.33.0",
    "kv_cache_memory_bytes": 132530194268,
    "kv_cache_gib": 121.67,
    "gpu_kv_cache_tokens": 3986816,
    "max_concurrency": 973.34,
    "compile_cache_hit": False,
    "compile_seconds": 17.6,
    "model_load_seconds": 2.012345,
    "ready": True,
    "failure": None,
    "failure_message": None,
    "estimated_max_model_len": None,
    "preemptions": None,
    "kv_cache_usage_perc": 0.0,
}
LEARNED = {
    **COLD,
    "kv_cache_gib": None,
    "gpu_kv_cache_tokens": 4044800,
    "max_concurrency": 987.5,
    "compile_cache_hit": True,
    "compile_seconds": 2.55,
}
NOT_STARTED = {key: None for key in COLD} | {"ready": False}

FIXTURE_FACTS: list[tuple[str, dict[str, Any]]] = [
    ("v033_cold.log", COLD),
    ("v033_ansi_tty.log", COLD),
    ("v033_journald.log", COLD),
    (
        "v033_warm_cache_hit.log",
        {**COLD, "kv_cache_memory_bytes": 132470186412, "compile_cache_hit": True, "compile_seconds": 2.55},
    ),
    ("v033_learned_bytes.log", LEARNED),
    ("v033_cri_partial.log", LEARNED),
    ("two_boots_last_ready.log", LEARNED),
    (
        "v033_tp2_per_rank.log",
        {
            **COLD,
            "kv_cache_memory_bytes": 64734805606,
            "kv_cache_gib": 59.87,
            "gpu_kv_cache_tokens": 2242048,
            "max_concurrency": 68.42,
            "compile_seconds": 18.45,
            "model_load_seconds": 4.110922,
        },
    ),
    (
        "v026_two_line_kv.log",
        {
            **COLD,
            "vllm_version": "0.26.0",
            "kv_cache_memory_bytes": 129513467289,
            "kv_cache_gib": 119.02,
            "gpu_kv_cache_tokens": 3900000,
            "max_concurrency": 952.15,
            "model_load_seconds": 2.018842,
            "kv_cache_usage_perc": None,
        },
    ),
    (
        "v085_v1_early.log",
        {
            **COLD,
            "vllm_version": "0.8.5",
            "kv_cache_memory_bytes": None,
            "kv_cache_gib": 54.62,
            "gpu_kv_cache_tokens": 447088,
            "max_concurrency": 13.64,
            "compile_seconds": 18.91,
            "model_load_seconds": 13.204526,
            "kv_cache_usage_perc": None,
        },
    ),
    (
        "v0_engine.log",
        {
            **COLD,
            "vllm_version": "0.6.4.post1",
            "kv_cache_memory_bytes": None,
            "kv_cache_gib": 2.18,
            "gpu_kv_cache_tokens": 715 * 16,
            "max_concurrency": 5.59,
            "compile_cache_hit": None,
            "compile_seconds": None,
            "model_load_seconds": None,
            "preemptions": 1,
            "kv_cache_usage_perc": 0.881,
        },
    ),
]


@pytest.mark.parametrize(("name", "expected"), FIXTURE_FACTS, ids=[name for name, _ in FIXTURE_FACTS])
def test_fixture_facts(name: str, expected: dict[str, Any]) -> None:
    """Each fixture log of each era and shape yields exactly its boot's facts."""
    assert read_boot_facts(fixture(name)).to_json() == expected


FAILURES: list[tuple[str, FailureClass, str]] = [
    ("fail_oom_load.log", FailureClass.OOM_LOAD, "Failed to load model - not enough GPU memory."),
    ("fail_no_kv_memory.log", FailureClass.NO_KV_MEMORY, "ValueError: No available memory for the cache blocks."),
    ("fail_max_len_too_large.log", FailureClass.MAX_LEN_TOO_LARGE, "ValueError: To serve at least one request"),
    ("fail_bad_argument.log", FailureClass.BAD_ARGUMENT, "vllm serve: error: unrecognized arguments: --swap-space 4"),
    ("fail_model_not_found.log", FailureClass.MODEL_NOT_FOUND, "Invalid repository ID or local directory specified"),
    (
        "fail_model_path_missing.log",
        FailureClass.MODEL_NOT_FOUND,
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/models/Llama-3.2-1B-Instruct'.",
    ),
    ("fail_bad_kv_dtype.log", FailureClass.BAD_ARGUMENT, "Invalid kv_cache_dtype: 'q8_0'. Valid values are: ['auto', "),
    ("fail_model_gated.log", FailureClass.MODEL_NOT_FOUND, "huggingface_hub.errors.GatedRepoError: 401"),
    ("fail_engine_dead.log", FailureClass.ENGINE_DEAD, "EngineCore encountered a fatal error."),
    ("fail_other.log", FailureClass.OTHER, "PermissionError: [Errno 13] Permission denied"),
]


@pytest.mark.parametrize(("name", "failure", "message"), FAILURES, ids=[name for name, _, _ in FAILURES])
def test_failure_fixtures(name: str, failure: FailureClass, message: str) -> None:
    """Each failure fixture is classified, with vLLM's own root-cause message, not its wrappers'."""
    facts = read_boot_facts(fixture(name))
    assert facts.failure is failure
    assert facts.failure_message is not None
    assert facts.failure_message.startswith(message)


@pytest.mark.parametrize(
    ("location", "detail", "message"),
    [
        (
            "block_size",
            "  Value error, Block size must be a power of 2 [type=value_error, input_value=7, input_type=int]",
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig: block_size: "
            "Block size must be a power of 2",
        ),
        (
            "cache_dtype",
            "  Value error, Invalid kv_cache_dtype: 'int3'. Valid values are: ['auto'] [type=value_error, "
            "input_value='int3', input_type=str]",
            "Invalid kv_cache_dtype: 'int3'. Valid values are: ['auto']",
        ),
    ],
)
def test_pydantic_field_error_reads_location_and_detail(location: str, detail: str, message: str) -> None:
    """A pydantic field error (header, the field on its own line, the detail) gives bad_argument with the detail."""
    facts = read_boot_facts(
        [
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line 2307, in x',
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            location,
            detail,
            "    For further information visit https://errors.pydantic.dev/2.12/v/value_error",
        ]
    )
    assert (facts.failure, facts.failure_message) == (FailureClass.BAD_ARGUMENT, message)


def test_max_len_error_gives_the_estimate() -> None:
    """vLLM's estimated maximum model length is read from its max-length error."""
    assert read_boot_facts(fixture("fail_max_len_too_large.log")).estimated_max_model_len == 34480


def test_engine_death_after_ready_keeps_ready() -> None:
    """A boot that became ready and then lost its engine is ready with failure engine_dead."""
    facts = read_boot_facts(fixture("fail_engine_dead.log"))
    assert facts.ready
    assert facts.failure is FailureClass.ENGINE_DEAD


def test_cold_boot_events_in_order() -> None:
    """Fed live, a cold boot emits its phases in order, then stats."""
    reader = BootLogReader()
    events = [event for line in fixture("v033_cold.log") for event in reader.feed(line + "\n")]
    phases = [(e.phase, e.weights_percent) for e in events if isinstance(e, PhaseChanged)]
    assert phases == [
        (BootPhase.LOADING, 0),
        (BootPhase.LOADING, 100),
        (BootPhase.COMPILING, None),
        (BootPhase.PROFILING, None),
        (BootPhase.CAPTURING, None),
        (BootPhase.READY, None),
    ]
    assert [e for e in events if isinstance(e, StatsUpdated)] == [StatsUpdated(0.001, None), StatsUpdated(0.0, None)]
    assert not any(isinstance(e, (FailureDetected, BootStarted)) for e in events)


def test_weights_percentage_events() -> None:
    """Each new weights percentage while loading is an event (the daemon shows it)."""
    reader = BootLogReader()
    events = [event for line in fixture("v033_tp2_per_rank.log") for event in reader.feed(line)]
    percents = [e.weights_percent for e in events if isinstance(e, PhaseChanged) and e.phase is BootPhase.LOADING]
    assert percents == [0, 25, 50, 75, 100]


def test_second_boot_starts_fresh() -> None:
    """A restarted server's banner in the same stream starts a new boot and drops the old failure."""
    reader = BootLogReader()
    events = [event for line in fixture("two_boots_last_ready.log") for event in reader.feed(line)]
    kinds = [type(e) for e in events]
    assert kinds.index(FailureDetected) < kinds.index(BootStarted)
    assert reader.boots == 2
    assert reader.facts.failure is None and reader.facts.ready


def test_failure_rank_keeps_root_cause() -> None:
    """A generic engine failure reported first is replaced by the specific cause that follows it."""
    reader = BootLogReader()
    events = [event for line in fixture("fail_no_kv_memory.log") for event in reader.feed(line)]
    detected = [e.failure for e in events if isinstance(e, FailureDetected)]
    assert detected == [FailureClass.ENGINE_DEAD, FailureClass.NO_KV_MEMORY]


def test_learned_boot_is_not_profiled() -> None:
    """A boot given --kv-cache-memory-bytes reports the given bytes and no profiling."""
    facts = read_boot_facts(fixture("v033_learned_bytes.log"))
    assert facts.kv_cache_memory_bytes_source == "given"
    assert not facts.profiled
    assert read_boot_facts(fixture("v033_cold.log")).profiled


LINE_CASES: list[tuple[str, list[str], dict[str, Any]]] = [
    (
        "bare file name, no process prefix",
        ["INFO 01-30 03:18:12 gpu_worker.py:298] Available KV cache memory: 55.15 GiB"],
        {"kv_cache_gib": 55.15},
    ),
    (
        "compose wrapper",
        [
            "vllm-1  | (EngineCore_DP0 pid=100) INFO 11-20 10:10:45 [gpu_worker.py:360] "
            "Available KV cache memory: 0.79 GiB"
        ],
        {"kv_cache_gib": 0.79},
    ),
    (
        "podman timestamps",
        ["2026-11-29T18:00:00.123456789+00:00 (APIServer pid=1) INFO:     Application startup complete."],
        {"ready": True},
    ),
    (
        "journald around an argparse error",
        ["Nov 29 18:00:00 gpu1 conmon[77]: vllm serve: error: argument --kv-cache-dtype: invalid choice: 'q8_0'"],
        {
            "failure": "bad_argument",
            "failure_message": "vllm serve: error: argument --kv-cache-dtype: invalid choice: 'q8_0'",
        },
    ),
    (
        "free memory below the requested share is an OOM at load",
        [
            "ValueError: Free memory on device cuda:0 (40.12/139.81 GiB) on startup is less than desired GPU memory "
            "utilization (0.92, 128.63 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes."
        ],
        {"failure": "oom_load"},
    ),
    (
        "V0 max length error names the capacity",
        [
            "ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
            "stored in KV cache (93760). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`."
        ],
        {"failure": "max_len_too_large", "estimated_max_model_len": 93760},
    ),
    (
        "TP not dividing the heads is a bad argument",
        [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig",
            "  Value error, Total number of attention heads (32) must be divisible by tensor parallel size (3). "
            "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]",
        ],
        {
            "failure": "bad_argument",
            "failure_message": "Total number of attention heads (32) must be divisible by tensor parallel size (3).",
        },
    ),
    (
        "an unknown validation error keeps its detail",
        [
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            "  Value error, block_size must be a power of two [type=value_error, input_value=7]",
        ],
        {
            "failure": "bad_argument",
            "failure_message": "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig: "
            "block_size must be a power of two",
        },
    ),
    (
        "OOM while serving kills the engine",
        [
            "(APIServer pid=1) INFO:     Application startup complete.",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ],
        {"ready": True, "failure": "engine_dead"},
    ),
    (
        "an old torch OOM as RuntimeError before ready",
        ["RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"],
        {"failure": "oom_load"},
    ),
    (
        "an exception the server survived is forgotten at ready",
        ["KeyError: 'rope_scaling'", "(APIServer pid=1) INFO:     Application startup complete."],
        {"ready": True, "failure": None},
    ),
    (
        "SIGTERM's KeyboardInterrupt is no failure",
        ["KeyboardInterrupt: terminated"],
        {"failure": None},
    ),
    (
        "given bytes on an echoed command line, human-readable",
        ["+ exec vllm serve m --max-model-len 4096 --kv-cache-memory-bytes 20G"],
        {"kv_cache_memory_bytes": 20 * 2**30},
    ),
    (
        "given bytes in an args Namespace",
        ["INFO 03-14 09:12:30 [api_server.py:1044] args: Namespace(model_tag='m', kv_cache_memory_bytes=21474836480)"],
        {"kv_cache_memory_bytes": 21474836480},
    ),
    (
        "suggestion wins over given bytes",
        [
            "+ exec vllm serve m --kv-cache-memory-bytes=1000",
            "(EngineCore pid=3) INFO 11-29 18:00:48 [gpu_worker.py:1065] Free memory on device (1/2 GiB) on startup. "
            "Replace gpu_memory_utilization config with `--kv-cache-memory=2000` (0.00 GiB) to fit into requested "
            "memory, or `--kv-cache-memory=3000` (0.00 GiB) to fully utilize gpu memory.",
        ],
        {"kv_cache_memory_bytes": 2000},
    ),
    (
        "preemptions: V1 per interval, zero after a stats line without them",
        [
            "(APIServer pid=1) INFO 11-29 18:01:00 [loggers.py:336] Engine 000: Avg prompt throughput: 5.7 tokens/s, "
            "Avg generation throughput: 1.5 tokens/s, Running: 9 reqs, Waiting: 3 reqs, Preemptions: 4, GPU KV cache "
            "usage: 99.2%, Prefix cache hit rate: 0.0%",
            "(APIServer pid=1) INFO 11-29 18:01:10 [loggers.py:336] Engine 000: Avg prompt throughput: 5.7 tokens/s, "
            "Avg generation throughput: 1.5 tokens/s, Running: 2 reqs, Waiting: 0 reqs, GPU KV cache usage: 40.0%, "
            "Prefix cache hit rate: 0.0%",
        ],
        {"preemptions": 0, "kv_cache_usage_perc": 0.4},
    ),
    (
        "encoder and language-model compile times add up",
        [
            "(EngineCore pid=3) INFO 11-29 18:00:31 [monitor.py:62] [language_model] torch.compile took 10.50 s "
            "in total",
            "(EngineCore pid=3) INFO 11-29 18:00:35 [monitor.py:62] [encoder] torch.compile took 4.25 s in total",
        ],
        {"compile_seconds": 14.75},
    ),
    (
        "a partial compile-cache hit is a miss",
        [
            "(EngineCore pid=3) INFO 11-29 18:00:16 [backends.py:311] Directly load the compiled graph(s) for compile "
            "range (1, 8192) from the cache, took 0.717 s",
            "(EngineCore pid=3) INFO 11-29 18:00:30 [backends.py:418] Compiling a graph for compile range "
            "(8193, 16384) takes 12.93 s",
        ],
        {"compile_cache_hit": False},
    ),
]


@pytest.mark.parametrize(("_name", "lines", "expected"), LINE_CASES, ids=[case[0] for case in LINE_CASES])
def test_line_shapes(_name: str, lines: list[str], expected: dict[str, Any]) -> None:
    """Lines of each shape and wording give the listed facts."""
    facts = read_boot_facts(lines).to_json()
    assert {key: facts[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [("21474836480", 21474836480), ("20G", 20 * 2**30), ("20g", 20 * 10**9), ("1.5k", 1500), ("x1", None)],
)
def test_parse_human_int(text: str, value: int | None) -> None:
    """Byte counts read as vLLM's human_readable_int reads them."""
    assert parse_human_int(text) == value


def test_empty_stream_has_no_facts() -> None:
    """An empty log gives empty facts (exit 0 in inspect-log), not an error."""
    assert read_boot_facts([]).to_json() == NOT_STARTED


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=20))
def test_arbitrary_text_never_raises(lines: list[str]) -> None:
    """Any text at all is read without an exception."""
    reader = BootLogReader()
    for line in lines:
        reader.feed(line)
    assert reader.facts is not None


_KNOWN = [pattern.sample for pattern in ALL_PATTERNS] + fixture("fail_model_not_found.log")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_KNOWN), st.integers(min_value=0, max_value=400), st.text(max_size=12)), max_size=30
    )
)
def test_mangled_known_lines_never_raise(mangled: list[tuple[str, int, str]]) -> None:
    """Real lines cut and spliced at any point are read without an exception."""
    reader = BootLogReader()
    for line, cut, noise in mangled:
        reader.feed(line[:cut] + noise + line[cut:])
    reader.facts.to_json()
