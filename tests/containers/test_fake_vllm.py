"""Tests for the stand-in vLLM (containers/fake-vllm), run as a plain process and once in Podman."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import pytest

from tests.harness.wait import hold_for, wait_until

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "containers" / "fake-vllm" / "vllm.py"
BUILD_SCRIPT = REPO / "containers" / "build-image.sh"
MODEL = "/models/tiny-llama"
BOOT_SECONDS = "0.3"
WAIT_SECONDS = 15.0
PREFIX = r"\((?:APIServer|EngineCore) pid=\d+\) (?:INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] "


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def base_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("FAKE_VLLM_", "VLLM_"))}
    env.update(
        NO_COLOR="1",
        VLLM_DISABLE_LOG_LOGO="1",
        VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"),
        FAKE_VLLM_BOOT_SECONDS=BOOT_SECONDS,
        FAKE_VLLM_DEV_DIR=str(tmp_path / "no-dev"),
    )
    env.update(extra)
    return env


def run_to_exit(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), *args],
        check=False,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=WAIT_SECONDS,
    )


@dataclass
class Served:
    """A stand-in process started in the background; its output goes to files."""

    process: subprocess.Popen[bytes]
    stdout_path: Path
    stderr_path: Path
    port: int

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_bytes().decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_bytes().decode(errors="replace")

    def wait_for(self, text: str, stream: str = "stdout", timeout: float = WAIT_SECONDS) -> str:

        def seen() -> str | None:
            output = self.stdout if stream == "stdout" else self.stderr
            if text in output:
                return output
            assert self.process.poll() is None, f"{text!r} not seen on {stream}:\n{self.stdout}\n{self.stderr}"
            return None

        return wait_until(seen, timeout, 0.02, what=lambda: f"{text!r} on {stream}:\n{self.stdout}\n{self.stderr}")

    def wait_ready(self) -> None:
        self.wait_for("Application startup complete.", stream="stderr")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=WAIT_SECONDS)


class StartServer(Protocol):
    def __call__(self, *args: str, env: Mapping[str, str] | None = None, model: str = MODEL) -> Served: ...


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[StartServer]:
    """Starts stand-in servers on free loopback ports and kills whatever is still running afterwards."""
    started: list[Served] = []

    def start(*args: str, env: Mapping[str, str] | None = None, model: str = MODEL) -> Served:
        port = free_port()
        index = len(started)
        stdout_path, stderr_path = tmp_path / f"stdout-{index}.log", tmp_path / f"stderr-{index}.log"
        with stdout_path.open("wb") as stdout, stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, str(PROGRAM), "serve", model, "--host", "127.0.0.1", "--port", str(port), *args],
                env=dict(env if env is not None else base_env(tmp_path)),
                stdout=stdout,
                stderr=stderr,
            )
        served = Served(process, stdout_path, stderr_path, port)
        started.append(served)
        return served

    yield start
    for served in started:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait()


def http(url: str, method: str = "GET", body: object = None, token: str | None = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def lines_in_order(text: str, patterns: Sequence[str]) -> None:
    position = 0
    for pattern in patterns:
        match = re.compile(pattern, re.MULTILINE).search(text, position)
        assert match is not None, f"{pattern!r} not found after offset {position} in:\n{text[position:]}"
        position = match.end()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--swap-space", "16"], "vllm: error: unrecognized arguments: --swap-space 16"),
        (["--dtype", "q8_0"], "vllm serve: error: argument --dtype: invalid choice: 'q8_0'"),
        (["--max-model-len", "lots"], "argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'"),
    ],
)
def test_argv_vllm_lacks_is_rejected_like_argparse(tmp_path: Path, args: list[str], expected: str) -> None:
    """Flags or values vLLM 0.33 does not accept end with argparse's usage and error lines and exit 2."""
    result = run_to_exit(["serve", MODEL, *args], base_env(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith("usage: vllm")
    assert expected in result.stderr


KV_DTYPE_ERROR = (
    "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
    "cache_dtype\n"
    "  Value error, Invalid kv_cache_dtype: {value!r}. Valid values are: ['auto', 'float16', 'bfloat16', 'fp8', "
    "'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla', 'nvfp4_ds_mla', 'turboquant_k8v4', 'turboquant_4bit_nc', "
    "'turboquant_k3v4_nc', 'turboquant_3bit_nc', 'octave_k3v4', 'octave_k3v3', 'octave_k3v3_compact', "
    "'ultraquant_4bit', 'int4_per_token_head', 'int8_per_token_head', 'fp8_per_token_head', 'nvfp4', "
    "'nvfp4_4over6'] [type=value_error, input_value={shown}, input_type=str]\n"
    "    For further information visit https://errors.pydantic.dev/2.12/v/value_error\n"
)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("q8_0", "'q8_0'"), ("FP8", "'FP8'"), ("x" * 60, "'" + "x" * 24 + "..." + "x" * 23 + "'")],
)
def test_kv_cache_dtype_outside_cachedtype_fails_in_cache_config(tmp_path: Path, value: str, shown: str) -> None:
    """A --kv-cache-dtype outside 0.33's CacheDType passes argparse and fails in CacheConfig's validator, exit 1."""
    result = run_to_exit(["serve", MODEL, "--kv-cache-dtype", value, "--port", str(free_port())], base_env(tmp_path))
    assert result.returncode == 1
    assert not result.stderr.startswith("usage:")
    lines_in_order(
        result.stdout,
        [
            rf"^{PREFIX}non-default args: .*'kv_cache_dtype': {re.escape(repr(value))}",
            rf"^{PREFIX}Resolved architecture: LlamaForCausalLM$",
            rf"^{PREFIX}Using max model len 131072$",
        ],
    )
    assert "Chunked prefill" not in result.stdout
    assert "Initializing a V1 LLM engine" not in result.stdout
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert "in create_engine_config\n    cache_config = CacheConfig(\n" in result.stderr
    assert result.stderr.endswith(KV_DTYPE_ERROR.format(value=value, shown=shown))


@pytest.mark.parametrize("value", ["auto", "fp8", "int8_per_token_head", "nvfp4_4over6"])
def test_cachedtype_values_pass_cache_config(tmp_path: Path, value: str) -> None:
    """Values of 0.33's CacheDType (first, middle, last) get past CacheConfig to the scheduler config."""
    env = base_env(tmp_path, FAKE_VLLM_FAIL="oom_load")
    result = run_to_exit(["serve", MODEL, "--kv-cache-dtype", value, "--port", str(free_port())], env)
    assert result.returncode == 1
    assert "Chunked prefill is enabled with max_num_batched_tokens=8192." in result.stdout
    assert "CacheConfig" not in result.stderr


def test_flexible_argv_forms_are_accepted_like_vllm(tmp_path: Path) -> None:
    """Underscores, human-readable sizes, flag prefixes and `--model X` parse as FlexibleArgumentParser does."""
    args = ["serve", "--model", MODEL, "--max_model_len", "4k", "--kv-cache-memory", "20G", "--port", str(free_port())]
    result = run_to_exit(args, base_env(tmp_path, FAKE_VLLM_FAIL="model_not_found"))
    assert result.returncode == 1
    assert re.search(
        r"^\(MainProcess pid=\d+\) WARNING .*With `vllm serve`, you should provide the model as a", result.stdout, re.M
    )
    assert f"non-default args: {{'model_tag': '{MODEL}'" in result.stdout
    assert "'max_model_len': 4000, 'kv_cache_memory_bytes': 21474836480}" in result.stdout


def test_version_and_full_help(tmp_path: Path) -> None:
    """`vllm --version` prints 0.33.0 and `vllm serve --help=all` lists the catalogue's flags."""
    version = run_to_exit(["--version"], base_env(tmp_path))
    assert (version.returncode, version.stdout.strip()) == (0, "0.33.0")
    helped = run_to_exit(["serve", "--help=all"], base_env(tmp_path))
    assert helped.returncode == 0
    assert "--kv-cache-memory-bytes" in helped.stdout
    assert "usage: vllm serve [model_tag] [options]" in helped.stdout


def test_cold_boot_prints_vllm_lines_in_order_then_stops_on_sigterm(serve: StartServer, tmp_path: Path) -> None:
    """A cold boot prints 0.33's lines in order, serves, and SIGTERM stops it with the shutdown lines, exit 0."""
    served = serve()
    served.wait_ready()
    assert http(served.url("/health")) == (200, b"")
    assert served.stop() == 0
    stdout, stderr = served.stdout, served.stderr
    lines_in_order(
        stdout,
        [
            r"^FAKE-VLLM stand-in: GPU device nodes visible",
            rf"^\(APIServer pid=\d+\) INFO \d\d-\d\d \d\d:\d\d:\d\d \[startup\.py:38\] "
            rf"vLLM server version 0\.33\.0, serving model {MODEL}$",
            rf"^{PREFIX}non-default args: \{{'model_tag': '{MODEL}'",
            rf"^\(EngineCore pid=\d+\) INFO .*\[gpu_model_runner\.py:\d+\] Starting to load model {MODEL}\.\.\.$",
            rf"^{PREFIX}Loading weights took \d+\.\d\d seconds$",
            rf"^{PREFIX}Model loading took [\d.]+ GiB memory and \d+\.\d{{6}} seconds$",
            rf"^{PREFIX}Using cache directory: {re.escape(str(tmp_path))}/vllm-cache/torch_compile_cache/\w+/",
            rf"^{PREFIX}Compiling a graph for compile range \(1, 8192\) takes \d+\.\d\d s$",
            rf"^{PREFIX}torch\.compile took \d+\.\d\d s in total$",
            rf"^{PREFIX}Available KV cache memory: [\d.]+ GiB$",
            rf"^{PREFIX}GPU KV cache size: [\d,]+ tokens, Maximum concurrency for 131,072 tokens per request: "
            r"[\d.]+x$",
            rf"^{PREFIX}Graph capturing finished in \d+ secs, took [\d.]+ GiB$",
            rf"^{PREFIX}Free memory on device \([\d.]+/[\d.]+ GiB\) on startup\. .*Replace gpu_memory_utilization "
            r"config with `--kv-cache-memory=\d+` \([\d.]+ GiB\) to fit into requested memory, "
            r"or `--kv-cache-memory=\d+` \([\d.]+ GiB\) to fully utilize gpu memory\.",
            rf"^{PREFIX}init engine \(profile, create kv cache, warmup model\) took \d+\.\d\d s "
            r"\(compilation: \d+\.\d\d s\)$",
            rf"^{PREFIX}Starting vLLM server on http://127\.0\.0\.1:{served.port}$",
            rf"^{PREFIX}\[shutdown\] API server: shutdown triggered$",
        ],
    )
    assert "\x1b[" not in stdout
    lines_in_order(
        stderr,
        [
            r"\rLoading safetensors checkpoint shards:  50% Completed \| 1/2 \[",
            r"^INFO:     Application startup complete\.$",
            r"^INFO:     Shutting down$",
        ],
    )


def suggested_bytes(stdout: str) -> int:
    match = re.search(r"Replace gpu_memory_utilization config with `--kv-cache-memory=(\d+)`", stdout)
    assert match is not None, stdout
    return int(match.group(1))


def test_second_boot_hits_the_compile_cache_and_uses_learned_bytes(serve: StartServer, tmp_path: Path) -> None:
    """A boot with the same VLLM_CACHE_ROOT loads the compiled graphs, and the learned bytes skip profiling."""
    first = serve()
    first.wait_ready()
    assert first.stop() == 0
    learned = suggested_bytes(first.stdout)
    assert list((tmp_path / "vllm-cache" / "torch_compile_cache" / "torch_aot_compile").glob("*/rank_0_0/model"))

    second = serve("--kv-cache-memory-bytes", str(learned))
    second.wait_ready()
    assert second.stop() == 0
    stdout = second.stdout
    lines_in_order(
        stdout,
        [
            rf"^{PREFIX}Directly load the compiled graph\(s\) for compile range \(1, 8192\) from the cache, "
            r"took \d+\.\d{3} s$",
            rf"^{PREFIX}Directly load AOT compilation from path {re.escape(str(tmp_path))}/vllm-cache/",
            rf"^{PREFIX}torch\.compile took \d+\.\d\d s in total$",
            rf"^{PREFIX}Initial free memory [\d.]+ GiB, reserved [\d.]+ GiB memory for KV Cache as specified by "
            r"kv_cache_memory_bytes config and skipped memory profiling\.",
            rf"^{PREFIX}init engine",
        ],
    )
    assert "Compiling a graph" not in stdout
    assert "Available KV cache memory" not in stdout
    assert "Free memory on device" not in stdout


def test_suggestion_is_deterministic_without_jitter_and_varies_with_it(serve: StartServer, tmp_path: Path) -> None:
    """Identical boots suggest the same bytes; FAKE_VLLM_KV_JITTER_BYTES moves the suggestion between boots."""
    values = []
    for jitter in ("0", "0", "60000000", "60000000"):
        served = serve(env=base_env(tmp_path, FAKE_VLLM_KV_JITTER_BYTES=jitter))
        served.wait_ready()
        assert served.stop() == 0
        values.append(suggested_bytes(served.stdout))
    assert values[0] == values[1]
    assert values[2] != values[3]


def test_tensor_parallel_ranks_log_their_own_lines(serve: StartServer, tmp_path: Path) -> None:
    """With -tp 2 worker lines come from Worker_TP0/1, each rank with its own cache directory and suggestion."""
    served = serve("-tp", "2")
    served.wait_ready()
    assert served.stop() == 0
    stdout = served.stdout
    for rank in (0, 1):
        assert re.search(
            rf"^\(Worker_TP{rank} pid=\d+\) INFO .*Using cache directory: .*/rank_{rank}_0/backbone ", stdout, re.M
        )
        assert re.search(rf"^\(Worker_TP{rank} pid=\d+\) INFO .*--kv-cache-memory=\d+", stdout, re.M)
    assert len(re.findall(r"Available KV cache memory", stdout)) == 1
    assert re.search(r"^\(EngineCore pid=\d+\) INFO .*\[core\.py:405\] init engine", stdout, re.M)


FAILURES = [
    (
        {"FAKE_VLLM_FAIL": "oom_load"},
        [],
        [
            r"\[gpu_model_runner\.py:\d+\] Failed to load model - not enough GPU memory\.",
            r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate",
        ],
    ),
    (
        {"FAKE_VLLM_MODEL_BYTES": str(160 << 30)},
        [],
        [r"Failed to load model - not enough GPU memory\."],
    ),
    (
        {"FAKE_VLLM_FAIL": "no_kv_memory"},
        [],
        [r"Available KV cache memory: -[\d.]+ GiB", r"ValueError: No available memory for the cache blocks\."],
    ),
    (
        {"FAKE_VLLM_FAIL": "max_len_too_large"},
        ["--max-model-len", "4096"],
        [
            r"ValueError: To serve at least one request with the model's max seq len \(4096\), .*"
            r"the estimated maximum model length is \d+\."
        ],
    ),
    (
        {"FAKE_VLLM_MODEL_BYTES": str(126 << 30)},
        [],
        [r"max seq len \(131072\), .*the estimated maximum model length is \d+\."],
    ),
    (
        {"FAKE_VLLM_GPU_USED_BYTES": str(12 << 30)},
        ["--kv-cache-memory-bytes", "126G", "--gpu-memory-utilization", "0.9"],
        [
            r"skipped memory profiling",
            r"GPU KV cache size: ",
            r"torch\.OutOfMemoryError: CUDA out of memory\. Tried to allocate 126\.00 GiB\.",
        ],
    ),
    (
        {"FAKE_VLLM_GPU_USED_BYTES": str(40 << 30)},
        [],
        [
            r"ValueError: Free memory on device cuda:0 \([\d.]+/[\d.]+ GiB\) on startup is less than desired GPU "
            r"memory utilization \(0\.92, [\d.]+ GiB\)"
        ],
    ),
]


@pytest.mark.parametrize(("env", "args", "patterns"), FAILURES)
def test_engine_startup_failures_print_vllm_errors_and_exit_1(
    tmp_path: Path, env: dict[str, str], args: list[str], patterns: list[str]
) -> None:
    """Each engine startup failure prints vLLM's own error, then the API server's RuntimeError, and exits 1."""
    result = run_to_exit(["serve", MODEL, "--port", str(free_port()), *args], base_env(tmp_path, **env))
    assert result.returncode == 1
    lines_in_order(result.stdout + result.stderr, [*patterns])
    assert result.stderr.rstrip().endswith(
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"
    )
    assert "Application startup complete." not in result.stderr


@pytest.mark.parametrize(
    ("env", "model", "cause", "final"),
    [
        (
            {"FAKE_VLLM_FAIL": "model_not_found"},
            MODEL,
            "huggingface_hub.errors.HFValidationError: Repo id must be in the form",
            f"OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{MODEL}'. "
            "Use `repo_type` argument if needed.",
        ),
        (
            {"FAKE_VLLM_REQUIRE_MODEL": "1"},
            "./absent",
            "huggingface_hub.errors.HFValidationError: Repo id must use alphanumeric chars",
            "OSError: Repo id must use alphanumeric chars, '-', '_' or '.'. The name cannot start or end with '-' "
            "or '.' and the maximum length is 96: './absent'.",
        ),
        (
            {"FAKE_VLLM_REQUIRE_MODEL": "1"},
            "org/absent-model",
            "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error.",
            "OSError: org/absent-model is not a local folder and is not a valid model identifier listed on "
            "'https://huggingface.co/models'\nIf this is a private repository, make sure to pass a token having "
            "permission to this repo either by logging in with `hf auth login` or by passing `token=<your_token>`",
        ),
        (
            {"FAKE_VLLM_FAIL": "model_gated"},
            "org/gated-model",
            "huggingface_hub.errors.GatedRepoError: 401 Client Error.",
            "Access to model org/gated-model is restricted. You must have access to it and be authenticated to "
            "access it. Please log in.",
        ),
    ],
)
def test_missing_model_fails_in_transformers_config_read(
    tmp_path: Path, env: dict[str, str], model: str, cause: str, final: str
) -> None:
    """A missing path, unknown or gated repo fails where 0.33 first reads the config: transformers' OSError, exit 1."""
    env = base_env(tmp_path, HF_HOME=str(tmp_path / "hf"), **env)
    result = run_to_exit(["serve", model, "--port", str(free_port())], env)
    assert result.returncode == 1
    lines_in_order(
        result.stderr,
        [
            re.escape(cause),
            r"^The above exception was the direct cause of the following exception:$",
            r"in maybe_override_with_speculators\n    config_dict, _ = PreTrainedConfig\.get_config_dict\(",
        ],
    )
    assert result.stderr.rstrip("\n").endswith(final)
    assert "Resolved architecture" not in result.stdout


def test_local_dir_without_config_fails_in_model_config(tmp_path: Path) -> None:
    """A local directory without config.json passes transformers and fails in ModelConfig (pydantic), exit 1."""
    model = tmp_path / "model"
    model.mkdir()
    result = run_to_exit(
        ["serve", str(model), "--port", str(free_port())], base_env(tmp_path, FAKE_VLLM_REQUIRE_MODEL="1")
    )
    assert result.returncode == 1
    lines_in_order(
        result.stderr,
        [
            r"^pydantic_core\._pydantic_core\.ValidationError: 1 validation error for ModelConfig$",
            rf"^  Value error, Invalid repository ID or local directory specified: '{re.escape(str(model))}'\.$",
            r"^ \[type=value_error, input_value=ArgsKwargs",
        ],
    )
    assert "Resolved architecture" not in result.stdout


def test_model_present_in_the_hub_cache_boots(tmp_path: Path, serve: StartServer) -> None:
    """With FAKE_VLLM_REQUIRE_MODEL=1 a repo id with a snapshot in HF_HOME's hub cache loads normally."""
    (tmp_path / "hf" / "hub" / "models--org--present" / "snapshots" / "abc").mkdir(parents=True)
    env = base_env(tmp_path, HF_HOME=str(tmp_path / "hf"), FAKE_VLLM_REQUIRE_MODEL="1", FAKE_VLLM_FAIL="hang")
    served = serve(env=env, model="org/present")
    served.wait_for("Starting to load model org/present...")


def test_engine_death_turns_health_503_and_exits_0(serve: StartServer, tmp_path: Path) -> None:
    """After ready, a dead engine makes /health 503, logs EngineDeadError, and the server exits 0 (vllm #48966)."""
    env = base_env(
        tmp_path, FAKE_VLLM_FAIL="engine_dead", FAKE_VLLM_FAIL_AFTER_SECONDS="0.3", FAKE_VLLM_WATCHDOG_SECONDS="0.8"
    )
    served = serve(env=env)
    served.wait_ready()
    assert http(served.url("/health"))[0] == 200
    served.wait_for("AsyncLLM output_handler failed.")
    assert http(served.url("/health"))[0] == 503
    assert http(served.url("/ping"))[0] == 503
    assert served.process.wait(timeout=WAIT_SECONDS) == 0
    lines_in_order(
        served.stdout,
        [
            r"^\(EngineCore pid=\d+\) ERROR .*\[core\.py:\d+\] EngineCore encountered a fatal error\.",
            rf"^{PREFIX}\[shutdown\] MPClient: engine core exited unexpectedly; starting cleanup$",
            r"vllm\.v1\.engine\.exceptions\.EngineDeadError: EngineCore encountered an issue\.",
        ],
    )
    assert "INFO:     Application shutdown complete." in served.stderr


def test_hang_never_listens_and_sigterm_interrupts(serve: StartServer, tmp_path: Path) -> None:
    """A hung boot never accepts connections; SIGTERM then ends it like vLLM's _interrupt_init (KeyboardInterrupt)."""
    served = serve(env=base_env(tmp_path, FAKE_VLLM_FAIL="hang"))
    served.wait_for("Model loading took")
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", served.port), timeout=2):
        pass
    assert served.stop() in (-signal.SIGINT, 130)
    assert served.stderr.rstrip().endswith("KeyboardInterrupt: terminated")


def test_engine_hang_keeps_health_200_while_completions_wait(serve: StartServer, tmp_path: Path) -> None:
    """A hung engine keeps /health 200; a completion waits (counted in vllm:num_requests_waiting) until its client
    gives up, then is aborted; the token counters stop."""
    env = base_env(tmp_path, FAKE_VLLM_FAIL="engine_hung", FAKE_VLLM_FAIL_AFTER_SECONDS="0.2")
    served = serve(env=env)
    served.wait_ready()
    # the hang shows nowhere (as in vLLM: no line, /health 200), so the time past it is the only sign
    hold_for(0.5, "past the engine's silent hang 0.2 s after ready")
    assert http(served.url("/health"))[0] == 200
    request = urllib.request.Request(
        served.url("/v1/completions"),
        data=json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1}).encode(),
        headers={"content-type": "application/json"},
    )
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        urllib.request.urlopen(request, timeout=1.0)
    metrics = http(served.url("/metrics"))[1].decode()
    assert 'vllm:generation_tokens_total{engine="0",model_name="/models/tiny-llama"} 0.0' in metrics

    def aborted() -> bool:
        metrics = http(served.url("/metrics"))[1].decode()
        return "vllm:num_requests_waiting{" not in metrics or bool(
            re.search(r"^vllm:num_requests_waiting\{.*\} 0\.0$", metrics, re.M)
        )

    wait_until(aborted, WAIT_SECONDS, 0.1, what="the abandoned request to be aborted")
    assert http(served.url("/health"))[0] == 200
    assert served.stop() == 0


def test_crash_after_seconds_exits_with_the_configured_code(serve: StartServer, tmp_path: Path) -> None:
    """FAKE_VLLM_CRASH_AFTER_SECONDS ends the process with FAKE_VLLM_CRASH_EXIT_CODE."""
    env = base_env(tmp_path, FAKE_VLLM_CRASH_AFTER_SECONDS="0.2", FAKE_VLLM_CRASH_EXIT_CODE="3")
    served = serve(env=env)
    assert served.process.wait(timeout=WAIT_SECONDS) == 3


def test_shutdown_seconds_keep_the_process_alive_with_its_port_closed(serve: StartServer, tmp_path: Path) -> None:
    """FAKE_VLLM_SHUTDOWN_SECONDS: after SIGTERM the port closes at once, the process ignores a second SIGTERM
    and exits 0 once the teardown is over."""
    served = serve(env=base_env(tmp_path, FAKE_VLLM_SHUTDOWN_SECONDS="1.5"))
    served.wait_ready()
    served.process.send_signal(signal.SIGTERM)
    served.wait_for("Waiting for application shutdown.", stream="stderr")
    with pytest.raises(urllib.error.URLError):
        http(served.url("/health"))
    served.process.send_signal(signal.SIGTERM)  # ignored: not -15
    assert served.process.wait(timeout=WAIT_SECONDS) == 0
    assert "Application shutdown complete." in served.stderr


def test_trace_file_records_each_line_with_both_clocks(serve: StartServer, tmp_path: Path) -> None:
    """FAKE_VLLM_TRACE_FILE gets `monotonic wall stream line` for every record, in the order written."""
    trace = tmp_path / "trace.log"
    served = serve(env=base_env(tmp_path, FAKE_VLLM_TRACE_FILE=str(trace)))
    served.wait_ready()
    assert served.stop() == 0
    entries = [line.split(" ", 3) for line in trace.read_text().splitlines()]
    assert all(len(entry) == 4 for entry in entries)
    monotonic = [float(entry[0]) for entry in entries]
    assert monotonic == sorted(monotonic)
    assert all(abs(float(entry[1]) - time.time()) < 60 for entry in entries)
    texts = [(entry[2], entry[3]) for entry in entries]
    assert ("stderr", "INFO:     Application startup complete.") in texts
    assert any(stream == "stdout" and "Starting vLLM server on" in text for stream, text in texts)
    assert any(
        stream == "stderr" and text.startswith("Loading safetensors checkpoint shards: 100%") for stream, text in texts
    )


def test_unwritable_trace_file_is_a_knob_error(tmp_path: Path) -> None:
    """A trace file that cannot be opened stops the stand-in with exit 2, naming the variable."""
    result = run_to_exit(["serve", MODEL], base_env(tmp_path, FAKE_VLLM_TRACE_FILE=str(tmp_path / "no" / "trace")))
    assert result.returncode == 2
    assert "FAKE_VLLM_TRACE_FILE=" in result.stderr


def test_endpoints_api_key_and_stats(serve: StartServer, tmp_path: Path) -> None:
    """Endpoints answer like vLLM's (token ids on request); /v1 needs the VLLM_API_KEY token; stats report load."""
    env = base_env(
        tmp_path,
        VLLM_API_KEY="sekret",
        FAKE_VLLM_STATS_INTERVAL_SECONDS="0.2",
        FAKE_VLLM_KV_USAGE="42",
        FAKE_VLLM_PREEMPTIONS_PER_INTERVAL="2",
    )
    served = serve("--served-model-name", "tiny", env=env)
    served.wait_ready()
    assert http(served.url("/version")) == (200, b'{"version": "0.33.0"}')
    assert http(served.url("/v1/models")) == (401, b'{"error": "Unauthorized"}')
    status, body = http(served.url("/v1/models"), token="sekret")
    assert status == 200
    assert [model["id"] for model in json.loads(body)["data"]] == ["tiny"]
    status, body = http(
        served.url("/v1/completions"), "POST", {"model": "tiny", "prompt": "hi", "max_tokens": 3}, token="sekret"
    )
    assert status == 200
    assert json.loads(body)["usage"]["completion_tokens"] == 3
    assert "token_ids" not in json.loads(body)["choices"][0]
    status, body = http(
        served.url("/v1/completions"),
        "POST",
        {"model": "tiny", "prompt": "hi", "max_tokens": 3, "return_token_ids": True},
        token="sekret",
    )
    assert json.loads(body)["choices"][0]["token_ids"] == [100, 101, 102]
    status, body = http(
        served.url("/v1/chat/completions"),
        "POST",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        token="sekret",
    )
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["role"] == "assistant"
    assert http(served.url("/v1/completions"), "POST", {"model": "other", "prompt": "x"}, token="sekret")[0] == 404
    served.wait_for("Preemptions: 2, GPU KV cache usage: 42.0%")
    status, body = http(served.url("/metrics"))
    metrics = body.decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_count",
    ):
        assert re.search(rf"^{re.escape(name)}\{{.*\}} [\d.e+]+$", metrics, re.MULTILINE), name
    assert "sekret" not in served.stdout
    assert served.stop() == 0


def test_gpu_listing_honours_cuda_visible_devices(tmp_path: Path) -> None:
    """The stand-in's own first line lists the /dev/nvidia* nodes, filtered by CUDA_VISIBLE_DEVICES."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).touch()
    env = base_env(tmp_path, FAKE_VLLM_DEV_DIR=str(dev), CUDA_VISIBLE_DEVICES="1", FAKE_VLLM_FAIL="model_not_found")
    result = run_to_exit(["serve", MODEL, "--port", str(free_port())], env)
    first = result.stdout.splitlines()[0]
    assert first == (
        f"FAKE-VLLM stand-in: GPU device nodes visible (CUDA_VISIBLE_DEVICES '1'): "
        f"{dev}/nvidia-uvm, {dev}/nvidia1, {dev}/nvidiactl"
    )


@pytest.mark.parametrize(
    ("colour_env", "coloured"),
    [({"FORCE_COLOR": "1"}, True), ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, False), ({}, False)],
)
def test_colour_only_with_force_color_and_never_with_no_color(
    tmp_path: Path, colour_env: dict[str, str], coloured: bool
) -> None:
    """ANSI colours appear with FORCE_COLOR (no TTY here), never with NO_COLOR, as vllm/logger.py decides."""
    env = base_env(tmp_path, FAKE_VLLM_FAIL="model_not_found")
    del env["NO_COLOR"]
    env.update(colour_env)
    result = run_to_exit(["serve", MODEL, "--port", str(free_port())], env)
    assert ("\x1b[0;36m(APIServer pid=" in result.stdout) is coloured
    assert ("\x1b[" in result.stdout) is coloured


def test_no_visible_gpu_fails_like_vllm_when_required(tmp_path: Path) -> None:
    """With FAKE_VLLM_REQUIRE_GPU=1 and no GPU node, vLLM's `Failed to infer device type` ends the boot."""
    result = run_to_exit(["serve", MODEL, "--port", str(free_port())], base_env(tmp_path, FAKE_VLLM_REQUIRE_GPU="1"))
    assert result.returncode == 1
    assert "RuntimeError: Failed to infer device type" in result.stderr


def sleep_server(serve: StartServer, tmp_path: Path, *args: str) -> Served:
    env = base_env(tmp_path, VLLM_SERVER_DEV_MODE="1", FAKE_VLLM_SLEEP_SECONDS="0.05", FAKE_VLLM_WAKE_SECONDS="0.05")
    served = serve(*args, env=env | {"FAKE_VLLM_RELOAD_SECONDS": "0.05"})
    served.wait_ready()
    return served


def completion(served: Served) -> tuple[int, str]:
    status, body = http(served.url("/v1/completions"), "POST", {"model": MODEL, "prompt": "x", "max_tokens": 3})
    return status, json.loads(body)["choices"][0]["text"] if status == 200 else body.decode()


def test_dev_routes_exist_only_in_dev_mode(serve: StartServer, tmp_path: Path) -> None:
    """Without VLLM_SERVER_DEV_MODE=1 the sleep and RPC routes are 404, as in vLLM."""
    served = serve("--enable-sleep-mode", env=base_env(tmp_path))
    served.wait_ready()
    for method, path in [
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("GET", "/is_sleeping"),
        ("POST", "/collective_rpc"),
    ]:
        assert http(served.url(path), method)[0] == 404


def test_sleep_needs_sleep_mode(serve: StartServer, tmp_path: Path) -> None:
    """Dev mode without --enable-sleep-mode: /sleep is an error and the server stays awake."""
    served = sleep_server(serve, tmp_path)
    status, body = http(served.url("/sleep?level=1"), "POST")
    assert status == 500 and b"--enable-sleep-mode" in body
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": False}


def test_level_1_sleep_and_wake(serve: StartServer, tmp_path: Path) -> None:
    """Level 1: asleep (completions refused), the memory freed and the timings logged; one wake serves again."""
    served = sleep_server(serve, tmp_path, "--enable-sleep-mode")
    assert http(served.url("/sleep?level=1"), "POST")[0] == 200
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": True}
    assert completion(served)[0] == 503
    out = served.wait_for("seconds to fall asleep.")
    freed = re.search(r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use\.", out)
    assert freed is not None and float(freed.group(1)) > 1 and float(freed.group(2)) < float(freed.group(1))
    assert http(served.url("/wake_up"), "POST")[0] == 200
    served.wait_for("seconds to wake up tags ['kv_cache', 'weights'].")
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": False}
    assert completion(served) == (200, "The stand-in vLLM")


def test_level_2_staged_wake_needs_reload_weights(serve: StartServer, tmp_path: Path) -> None:
    """Level 2: waking the weights alone leaves garbage until reload_weights; then the KV cache; then it serves."""
    served = sleep_server(serve, tmp_path, "--enable-sleep-mode")
    assert http(served.url("/sleep?level=2"), "POST")[0] == 200
    assert http(served.url("/wake_up?tags=weights"), "POST")[0] == 200
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": True}  # the KV cache still sleeps
    assert http(served.url("/wake_up?tags=kv_cache"), "POST")[0] == 200
    assert completion(served) == (200, "")  # weights allocated, never loaded
    assert http(served.url("/sleep?level=2"), "POST")[0] == 200
    assert http(served.url("/wake_up?tags=weights"), "POST")[0] == 200
    status, body = http(served.url("/collective_rpc"), "POST", {"method": "reload_weights"})
    assert status == 200 and json.loads(body) == {"results": [None]}
    assert http(served.url("/wake_up?tags=kv_cache"), "POST")[0] == 200
    assert http(served.url("/reset_prefix_cache"), "POST")[0] == 200
    assert completion(served) == (200, "The stand-in vLLM")
    assert http(served.url("/sleep?level=3"), "POST")[0] == 400


def test_each_sleep_mode_call_sent_twice_does_nothing_the_second_time(serve: StartServer, tmp_path: Path) -> None:
    """As real vLLM 0.26 on the H200 (bench/real_vllm/sleep_repeat.py): every repeat answers 200, warns like vLLM
    and changes nothing; the server then serves as before."""
    served = sleep_server(serve, tmp_path, "--enable-sleep-mode")
    for path in ("/wake_up", "/sleep?level=2", "/sleep?level=2", "/wake_up?tags=weights", "/wake_up?tags=weights"):
        assert http(served.url(path), "POST")[0] == 200
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": True}
    for _ in range(2):
        assert http(served.url("/collective_rpc"), "POST", {"method": "reload_weights"})[0] == 200
        assert http(served.url("/wake_up?tags=kv_cache"), "POST")[0] == 200
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": False}
    assert completion(served) == (200, "The stand-in vLLM")
    lines_in_order(
        served.stdout,
        [
            r"WARNING .*\[abstract\.py:\d+\] Executor is not sleeping\.$",
            r"WARNING .*\[abstract\.py:\d+\] Executor is already sleeping\.$",
            r"WARNING .*\[abstract\.py:\d+\] Tag weights is not in sleeping tags \{'kv_cache'\}$",
            r"WARNING .*\[abstract\.py:\d+\] Executor is not sleeping\.$",
        ],
    )


def podman_usable() -> bool:
    return shutil.which("podman") is not None and shutil.which("mmdebstrap") is not None and os.geteuid() == 0


@pytest.mark.podman
@pytest.mark.skipif(not podman_usable(), reason="needs podman, mmdebstrap and root")
def test_image_entrypoint_serves_and_lists_device_nodes(tmp_path: Path) -> None:
    """The image runs `vllm serve`, has `sh` for the key wrapper, sees a --device /dev/nvidia0, and serves."""
    env = dict(os.environ)
    if not env.get("CONTAINERS_CONF"):
        conf = tmp_path / "containers.conf"
        conf.write_text(
            '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]\n[engine]\nruntime = "runc"\n'
        )
        env["CONTAINERS_CONF"] = str(conf)
    subprocess.run(["bash", str(BUILD_SCRIPT)], env=env, check=True, timeout=600)
    wrapped = subprocess.run(
        [
            *env.get("PODMAN", "podman").split(),
            "run",
            "--rm",
            "--entrypoint",
            "sh",
            "localhost/fake-vllm:latest",
            "-c",
            "VLLM_API_KEY=$(cat /etc/hostname) exec vllm --version",
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrapped.stdout.strip() == "0.33.0"
    node = tmp_path / "nvidia0"
    subprocess.run(["mknod", str(node), "c", "195", "0"], check=True)
    podman = env.get("PODMAN", "podman").split()
    name = f"fake-vllm-test-{os.getpid()}"
    port = free_port()
    try:
        subprocess.run(
            [
                *podman,
                "run",
                "-d",
                "--name",
                name,
                "--device",
                f"{node}:/dev/nvidia0",
                "-p",
                f"127.0.0.1:{port}:8000",
                "-e",
                f"FAKE_VLLM_BOOT_SECONDS={BOOT_SECONDS}",
                "-e",
                "VLLM_DISABLE_LOG_LOGO=1",
                "localhost/fake-vllm:latest",
                MODEL,
                "--max-model-len",
                "4096",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )

        def healthy() -> bool:
            try:
                return http(f"http://127.0.0.1:{port}/health")[0] == 200
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(healthy, WAIT_SECONDS, 0.1, what="/health to answer 200")
        logs = subprocess.run([*podman, "logs", name], check=False, env=env, capture_output=True, text=True, timeout=30)
        assert "FAKE-VLLM stand-in: GPU device nodes visible (CUDA_VISIBLE_DEVICES unset): /dev/nvidia0" in logs.stdout
        assert "(APIServer pid=1) INFO" in logs.stdout
        subprocess.run([*podman, "stop", "-t", "10", name], env=env, check=True, capture_output=True, timeout=30)
        state = subprocess.run(
            [*podman, "inspect", "--format", "{{.State.ExitCode}}", name],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert state.stdout.strip() == "0"
    finally:
        subprocess.run([*podman, "rm", "-f", name], check=False, env=env, capture_output=True, timeout=60)


def test_uds_serves_on_the_unix_socket_instead_of_the_port(serve: StartServer, tmp_path: Path) -> None:
    """`--uds PATH` (vLLM 0.26+): the server binds that socket, ignores host and port, names it `unix:PATH`;
    a file already at PATH fails the bind as vLLM's does (it never removes one)."""
    import http.client
    import socket as socket_module

    path = tmp_path / "vllm.sock"
    served = serve("--uds", str(path))
    served.wait_ready()
    assert f"Starting vLLM server on unix:{path}" in served.stdout
    with pytest.raises(OSError):
        socket_module.create_connection(("127.0.0.1", served.port), timeout=2).close()
    sock = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    sock.connect(str(path))
    conn = http.client.HTTPConnection("localhost")
    conn.sock = sock
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()
    assert ' - "GET /health HTTP/1.1" 200 OK' in served.wait_for('"GET /health')
    assert served.stop() == 0
    again = serve("--uds", str(path))  # the socket file is still there: vLLM does not remove it
    assert again.process.wait(timeout=WAIT_SECONDS) == 1
    assert "OSError: [Errno 98] Address already in use" in again.stderr


# --- releases (issue 42): FAKE_VLLM_VERSION picks what the HTTP boundary speaks -------------------------------


def release_server(serve: StartServer, tmp_path: Path, version: str, *args: str, **knobs: str) -> Served:
    env = base_env(
        tmp_path,
        VLLM_SERVER_DEV_MODE="1",
        FAKE_VLLM_VERSION=version,
        FAKE_VLLM_SLEEP_SECONDS="0.05",
        FAKE_VLLM_WAKE_SECONDS="0.05",
        **knobs,
    )
    served = serve("--enable-sleep-mode", *args, env=env)
    served.wait_ready()
    return served


def test_0_34_sleep_answers_json_and_counts_the_operations(serve: StartServer, tmp_path: Path) -> None:
    """0.34: /sleep and /wake_up answer JSON, level 0 exists, and the sleep-mode metrics count each operation."""
    served = release_server(serve, tmp_path, "0.34.0")
    assert json.loads(http(served.url("/version"))[1]) == {"version": "0.34.0"}
    status, body = http(served.url("/sleep?level=2"), "POST")
    assert status == 200 and json.loads(body) == {"status": "sleeping", "level": 2}
    status, body = http(served.url("/wake_up?tags=weights"), "POST")
    assert json.loads(body) == {"status": "sleeping", "tags": ["weights"]}  # the KV cache still sleeps
    http(served.url("/collective_rpc"), "POST", {"method": "reload_weights"})
    assert json.loads(http(served.url("/wake_up?tags=kv_cache"), "POST")[1]) == {
        "status": "awake",
        "tags": ["kv_cache"],
    }
    assert http(served.url("/sleep?level=3"), "POST")[0] == 400
    metrics = http(served.url("/metrics"))[1].decode()
    assert 'vllm:sleep_mode_operation_duration_seconds_count{operation="sleep"} 1.0' in metrics
    assert 'vllm:sleep_mode_operation_duration_seconds_count{operation="wake"} 2.0' in metrics
    assert 'vllm:sleep_mode_operations_in_flight{operation="wake"} 0.0' in metrics
    assert 'reason="max_num_queued_reqs"} 0.0' in metrics


def test_0_26_sleep_answers_stay_empty(serve: StartServer, tmp_path: Path) -> None:
    """0.26-0.31 answer an empty 200 and have no sleep-mode metrics, no checkpoint routes, no level 0."""
    served = release_server(serve, tmp_path, "0.26.0")
    assert http(served.url("/sleep?level=1"), "POST") == (200, b"")
    assert http(served.url("/wake_up"), "POST") == (200, b"")
    assert http(served.url("/sleep?level=0"), "POST")[0] == 400
    assert "sleep_mode_operation" not in http(served.url("/metrics"))[1].decode()
    assert http(served.url("/checkpoint/status"))[0] == 404


def test_0_34_checkpoint_routes(serve: StartServer, tmp_path: Path) -> None:
    """0.34 with --enable-sleep-mode: status 503 until prepared, 200 once prepared; restore serves again."""
    served = release_server(serve, tmp_path, "0.34.0")
    status, body = http(served.url("/checkpoint/status"))
    assert status == 503 and json.loads(body) == {"state": "running"}
    assert json.loads(http(served.url("/checkpoint/prepare"), "POST")[1]) == {"state": "prepared"}
    assert http(served.url("/checkpoint/status"))[0] == 200
    assert json.loads(http(served.url("/checkpoint/restore"), "POST")[1]) == {"state": "running"}
    assert http(served.url("/checkpoint/status"))[0] == 503


def test_full_engine_queue_answers_503_and_counts_the_rejection(serve: StartServer, tmp_path: Path) -> None:
    """--max-num-queued-reqs 1: a second request while one streams is refused with vLLM's 503."""
    served = release_server(serve, tmp_path, "0.34.0", "--max-num-queued-reqs", "1", FAKE_VLLM_TOKEN_SECONDS="0.3")
    request = urllib.request.Request(
        served.url("/v1/completions"),
        data=json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 5, "stream": True}).encode(),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as streaming:
        streaming.readline()  # admitted and answering
        status, body = http(served.url("/v1/completions"), "POST", {"model": MODEL, "prompt": "x", "max_tokens": 1})
        streaming.read()
    assert status == 503
    error = json.loads(body)["error"]
    assert error["code"] == 503 and error["type"] == "Service Unavailable" and "busy" in error["message"]
    refused_again = 0  # the stream's slot is freed just after its last bytes: a request then may still be refused

    def room() -> bool:
        nonlocal refused_again
        code = completion(served)[0]
        refused_again += code == 503
        return code == 200

    wait_until(room, 5, 0.05, what="room again once the stream ended")
    metrics = http(served.url("/metrics"))[1].decode()
    assert f'reason="max_num_queued_reqs"}} {1.0 + refused_again}' in metrics


@pytest.mark.parametrize("version", ["0.26.0", "0.33.0", "0.34.0"])
@pytest.mark.parametrize("level", ["1", "2"])
def test_dankserve_sleep_edge_reads_each_release_answer(
    serve: StartServer, tmp_path: Path, version: str, level: Literal["1", "2"]
) -> None:
    """supervisor/probes/sleep_mode.py against the stand-in of each release: the empty and the JSON answers both
    work."""
    from dankserve.backend_address import TcpAddress
    from dankserve.supervisor import machine as m
    from dankserve.supervisor.probes.sleep_mode import sleep_server as put_to_sleep
    from dankserve.supervisor.probes.sleep_mode import wake_server

    served = release_server(serve, tmp_path, version, FAKE_VLLM_RELOAD_SECONDS="0.05")
    address = TcpAddress("127.0.0.1", served.port)
    assert isinstance(put_to_sleep(address, None, level), m.FellAsleep)
    assert isinstance(wake_server(address, None, level), m.WokeUp)
    assert completion(served)[0] == 200


@pytest.mark.parametrize(
    ("body", "route", "level", "awake", "problem"),
    [
        (b"", "/sleep", 1, None, None),
        (b'{"status": "sleeping", "level": 1}', "/sleep", 1, None, None),
        (b'{"status": "sleeping", "level": 0}', "/sleep", 1, None, "answered level 0"),
        (b'{"status": "awake"}', "/sleep", 2, None, "not 'sleeping'"),
        (b'{"status": "sleeping", "tags": null}', "/wake_up", None, True, "not 'awake'"),
        (b'{"status": "sleeping", "tags": ["weights"]}', "/wake_up", None, False, None),
        (b"[1, 2]", "/wake_up", None, True, None),
        (b"not json", "/sleep", 1, None, None),
        (b'{"status": "' + b"x" * 5000 + b'"}', "/sleep", 1, None, None),
    ],
)
def test_sleep_answer_contradictions(
    body: bytes, route: str, level: int | None, awake: bool | None, problem: str | None
) -> None:
    """An answer that contradicts the call fails it; an empty, foreign or oversized body says nothing."""
    from dankserve.supervisor.probes.sleep_mode import sleep_answer_problem

    found = sleep_answer_problem(body, route=route, level=level, awake=awake)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_0_34_checkpoint_routes_answer_as_vllms_engine(serve: StartServer, tmp_path: Path) -> None:
    """As vLLM 0.34's api_router.py and core.py: an asleep engine refuses prepare (400, the error said); a
    prepared one releases its KV cache (the weights stay), refuses /sleep and /wake_up, says it sleeps, and
    queues a completion until /checkpoint/restore serves it; repeats are no-ops; a bad mode is a 422."""
    records = tmp_path / "nvml"
    records.mkdir()
    served = release_server(serve, tmp_path, "0.34.0", FAKE_VLLM_NVML_DIR=str(records))

    def used() -> int:
        (record,) = records.glob("*.json")
        return int(json.loads(record.read_text())["used_bytes"])

    awake = used()
    assert http(served.url("/sleep?level=1"), "POST")[0] == 200
    status, body = http(served.url("/checkpoint/prepare"), "POST")
    assert status == 400
    assert json.loads(body) == {"state": "running", "error": "Preparing for a checkpoint requires an awake engine"}
    http(served.url("/wake_up"), "POST")
    assert http(served.url("/checkpoint/prepare?mode=later"), "POST")[0] == 422

    assert json.loads(http(served.url("/checkpoint/prepare?mode=wait"), "POST")[1]) == {"state": "prepared"}
    assert http(served.url("/checkpoint/prepare"), "POST")[0] == 200  # a no-op
    assert 0 < used() < awake, "the KV cache released, the weights kept"
    assert json.loads(http(served.url("/is_sleeping"))[1]) == {"is_sleeping": True}
    status, body = http(served.url("/sleep?level=2"), "POST")
    assert status == 500 and b"Cannot sleep while the checkpoint state is prepared" in body
    assert http(served.url("/wake_up"), "POST")[0] == 500

    answers: list[int] = []
    waiting = threading.Thread(
        target=lambda: answers.append(
            http(served.url("/v1/completions"), "POST", {"model": MODEL, "prompt": "x", "max_tokens": 2})[0]
        )
    )
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive() and not answers, "queued while prepared"
    assert json.loads(http(served.url("/checkpoint/restore"), "POST")[1]) == {"state": "running"}
    waiting.join(10)
    assert answers == [200]
    assert used() == awake
    assert json.loads(http(served.url("/checkpoint/restore"), "POST")[1]) == {"state": "running"}  # a no-op


def test_dankserve_checkpoint_edge_against_the_0_34_stand_in(serve: StartServer, tmp_path: Path) -> None:
    """supervisor/probes/checkpoint_routes.py against 0.34: an asleep server's refusal is said with vLLM's error;
    awake it is prepared (and says so), then served again; a release without the routes is a problem, not a
    crash."""
    from dankserve.backend_address import TcpAddress
    from dankserve.supervisor.probes import checkpoint_routes

    served = release_server(serve, tmp_path, "0.34.0")
    address = TcpAddress("127.0.0.1", served.port)
    http(served.url("/sleep?level=1"), "POST")
    problem = checkpoint_routes.prepare(address, None)
    assert problem is not None and "HTTP 400" in problem and "requires an awake engine" in problem
    assert checkpoint_routes.restore(address, None) is None  # running: a no-op
    http(served.url("/wake_up"), "POST")
    assert checkpoint_routes.prepare(address, None) is None
    assert checkpoint_routes.prepared(address, None)
    assert checkpoint_routes.restore(address, None) is None
    assert not checkpoint_routes.prepared(address, None)
    assert completion(served)[0] == 200

    older = TcpAddress("127.0.0.1", release_server(serve, tmp_path, "0.33.0").port)
    problem = checkpoint_routes.prepare(older, None)
    assert problem is not None and "HTTP 404" in problem
    assert not checkpoint_routes.prepared(older, None)
