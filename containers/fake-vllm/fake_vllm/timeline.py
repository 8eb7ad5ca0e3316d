"""Nominal phase durations of one boot, from the real H200 measurements in FACTS.md (pure).

Measured with vLLM on one H200 (1.1 B-parameter Llama-shaped model, --max-model-len 4096):
cold 116.2 s to /health 200 (init engine 46.5 s, torch.compile 17.6 s miss), compile cache kept
80.0 s (init 28.9 s, compile 2.6 s hit), cache kept + --kv-cache-memory-bytes 52.8 s (init
7.6 s, compile 2.5 s hit, graph capture 3 s instead of 8 s). About 40 s of every boot is process
start and imports (about 20 s before the first log line); weights load in 0.4 s (2.0 s with
model setup). The durations are logged as these nominal (H200) values; the stand-in sleeps
them multiplied by a time scale.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseDurations:
    """Seconds each boot phase takes on the H200 the figures were measured on."""

    before_first_log: float  # interpreter start and imports
    api_server_setup: float  # config resolution until the engine process starts
    engine_start: float  # engine process start, imports, device init
    weights_load: float  # `Loading weights took`
    model_setup: float  # the rest of `Model loading took`
    unattributed: float  # the part of a boot outside init engine that the figures do not split
    torch_compile: float  # `torch.compile took`
    memory_profiling: float
    kv_cache_allocation: float
    warmup: float
    graph_capture: float  # `Graph capturing finished in`
    server_start: float  # init engine to `Application startup complete.`

    @property
    def init_engine(self) -> float:
        """`init engine (profile, create kv cache, warmup model) took`."""
        return self.torch_compile + self.memory_profiling + self.kv_cache_allocation + self.warmup + self.graph_capture

    @property
    def total(self) -> float:
        return (
            self.before_first_log
            + self.api_server_setup
            + self.engine_start
            + self.weights_load
            + self.model_setup
            + self.unattributed
            + self.init_engine
            + self.server_start
        )


def phase_durations(compile_cache_hit: bool, kv_bytes_given: bool, enforce_eager: bool) -> PhaseDurations:
    """The nominal durations of a boot: cold 116.2 s, cache hit 80.0 s, hit with learned bytes 52.8 s."""
    if enforce_eager:
        torch_compile, graph_capture = 0.0, 0.0
    elif compile_cache_hit:
        torch_compile, graph_capture = (2.5 if kv_bytes_given else 2.6), (3.0 if kv_bytes_given else 8.0)
    else:
        torch_compile, graph_capture = 17.6, (3.0 if kv_bytes_given else 8.0)
    if kv_bytes_given:
        # No memory profiling, no CUDA-graph memory profiling: init engine 7.6 s with a cache hit.
        profiling, allocation, warmup = 0.6, 0.5, 1.0
    else:
        profiling, allocation = 9.0, 0.9
        warmup = 11.0 if not compile_cache_hit else 8.4
    # Outside init engine: 116.2 - 46.5 = 69.7 s cold, 80.0 - 28.9 = 51.1 s warm, 52.8 - 7.6 = 45.2 s.
    unattributed = 25.7 if not compile_cache_hit else 7.1
    if kv_bytes_given:
        unattributed = max(0.0, unattributed - 5.9)
    return PhaseDurations(
        before_first_log=20.0,
        api_server_setup=4.0,
        engine_start=16.0,
        weights_load=0.4,
        model_setup=1.6,
        unattributed=unattributed,
        torch_compile=torch_compile,
        memory_profiling=profiling,
        kv_cache_allocation=allocation,
        warmup=warmup,
        graph_capture=graph_capture,
        server_start=2.0,
    )
