"""Executes a boot plan and then serves: sleeps, output, sockets, signals, timers (the shell)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from . import failures as fail
from . import messages as msg
from .boot_plan import Action, Event, Exit, Hang, Log, Raw, Ready, Sleep, Uvicorn
from .knobs import Knobs
from .nvml_record import remove_record
from .output import Output
from .serve_config import ServeConfig
from .server import EngineState, FakeVllmHTTPServer
from .stats import IntervalStats, engine_is_idle, stats_message

# Simulated traffic when FAKE_VLLM_KV_USAGE or FAKE_VLLM_PREEMPTIONS_PER_INTERVAL asks for load.
SIMULATED_PROMPT_TOKENS_PER_SECOND = 1200.0
SIMULATED_GENERATION_TOKENS_PER_SECOND = 300.0
SIMULATED_RUNNING_REQUESTS = 4


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived; raised in the main thread by the signal handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass(frozen=True)
class ServeContext:
    """What the runner needs besides the plan."""

    config: ServeConfig
    knobs: Knobs
    output: Output
    server: FakeVllmHTTPServer
    state: EngineState
    time_scale: float
    write_compile_artifacts: Callable[[], None]
    keep_alive_on_engine_death: bool


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def install_signal_handlers() -> None:
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)


def exit_like_keyboard_interrupt() -> int:
    """CPython's exit after an unhandled KeyboardInterrupt: die by SIGINT, else (as PID 1) 130."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
    return 130


class Runner:
    def __init__(self, context: ServeContext) -> None:
        self.context = context
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def run(self, plan: list[Event]) -> int:
        """Run the boot; return the process exit code."""
        output = self.context.output
        try:
            for event in plan:
                code = self._execute(event)
                if code is not None:
                    return code
            return 0
        except Interrupted as interrupted:
            # Before uvicorn runs, vLLM's _interrupt_init turns SIGTERM into KeyboardInterrupt.
            final = fail.keyboard_interrupt_traceback()
            if interrupted.signum == signal.SIGINT:
                final = final.replace("KeyboardInterrupt: terminated", "KeyboardInterrupt")
            output.write("stderr", final + "\n")
            self.context.server.server_close()
            return exit_like_keyboard_interrupt()

    def _execute(self, event: Event) -> int | None:
        output = self.context.output
        if isinstance(event, Sleep):
            time.sleep(event.seconds * self.context.time_scale)
        elif isinstance(event, Log):
            output.log(event.message, event.args, event.rank, event.suffix)
        elif isinstance(event, Raw):
            output.write(event.stream, event.text)
        elif isinstance(event, Uvicorn):
            output.uvicorn(event.message)
        elif isinstance(event, Action):
            return self._act(event)
        elif isinstance(event, Ready):
            return self._serve()
        elif isinstance(event, Hang):
            while True:
                time.sleep(3600)
        elif isinstance(event, Exit):
            self.context.server.server_close()
            return event.code
        return None

    def _act(self, action: Action) -> int | None:
        server = self.context.server
        if action.name == "bind":
            try:
                server.bind()
            except OSError:
                self.context.output.write("stderr", fail.address_in_use_traceback() + "\n")
                return 1
        elif action.name == "write_compile_artifacts":
            self.context.write_compile_artifacts()
        elif action.name == "listen":
            server.listen()
            self._start(lambda: server.serve_forever(poll_interval=0.05), "http")
        return None

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _serve(self) -> int:
        """Serve until a signal, or until the engine dies and the watchdog stops the server."""
        knobs, output = self.context.knobs, self.context.output
        try:
            self._start(self._stats_loop, "stats")
            if knobs.fail == "engine_dead":
                self._start(self._engine_death, "engine-death")
            if knobs.fail == "engine_hung":
                self._start(self._engine_hang, "engine-hang")
            while not self._stop.wait(0.25):
                pass
        except Interrupted:
            self._graceful_shutdown()
            return 0
        # The engine died: uvicorn is told to exit by vLLM's watchdog; the process exits 0 (vllm issue 48966).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._stop_http()
        output.uvicorn("Shutting down")
        output.uvicorn("Waiting for application shutdown.")
        output.uvicorn("Application shutdown complete.")
        output.uvicorn(f"Finished server process [{output.api_pid}]")
        return 0

    def _stop_http(self) -> None:
        server = self.context.server
        server.shutdown()
        server.server_close()

    def _graceful_shutdown(self) -> None:
        """vllm/entrypoints/launchers/launcher.py serve_http's handle_shutdown, then uvicorn's own lines."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        output = self.context.output
        self._stop.set()
        output.log(msg.SHUTDOWN_TRIGGERED)
        output.log(msg.STOPPING_ENGINE_CLIENT, ("abort", 0))
        output.log(msg.ENGINE_EXITING_BUSY_LOOP)
        output.log(msg.ENGINE_CLIENT_STOPPED)
        output.log(msg.SIGNALLING_HTTP_SHUTDOWN)
        self._stop_http()
        output.log(msg.SHUTTING_DOWN_HTTP)
        output.uvicorn("Shutting down")
        output.uvicorn("Waiting for application shutdown.")
        # The lifespan's end shuts the engine client down: the process lives on with its port closed.
        time.sleep(self.context.knobs.shutdown_seconds)
        engine = self.context.server.engine  # the engine core's teardown frees its memory
        if engine is not None:
            engine.stop()
        else:
            remove_record(self.context.knobs.nvml_dir)
        output.uvicorn("Application shutdown complete.")
        output.uvicorn(f"Finished server process [{output.api_pid}]")

    def _engine_death(self) -> None:
        context = self.context
        if self._stop.wait(context.knobs.fail_after_seconds):
            return
        with context.state.lock:
            context.state.dead = True
        output = context.output
        output.log(msg.ENGINE_FATAL_ERROR, suffix="\n" + fail.engine_fatal_traceback())
        output.log(msg.ENGINE_CORE_EXITED)
        output.log(msg.OUTPUT_HANDLER_FAILED, suffix="\n" + fail.engine_dead_traceback())
        if context.keep_alive_on_engine_death:
            return
        if self._stop.wait(context.knobs.watchdog_seconds):
            return
        self._stop.set()

    def _engine_hang(self) -> None:
        """The engine stops making progress without dying: nothing is logged, /health stays 200,
        the token counters stop and new requests wait for ever (vllm issue 49237)."""
        context = self.context
        if self._stop.wait(context.knobs.fail_after_seconds):
            return
        with context.state.lock:
            context.state.hung = True

    def _stats_interval(self) -> float:
        configured = self.context.knobs.stats_interval_seconds
        if configured is not None and configured > 0:
            return configured
        return max(1.0, 10.0 * self.context.time_scale)

    def _stats_loop(self) -> None:
        context = self.context
        knobs, state = context.knobs, context.state
        interval = self._stats_interval()
        simulated = knobs.kv_usage_percent > 0 or knobs.preemptions_per_interval > 0
        last_prompt = last_generation = 0.0
        last_time = time.monotonic()
        while not self._stop.wait(interval):
            now = time.monotonic()
            elapsed = max(now - last_time, 1e-6)
            last_time = now
            with state.lock:
                if state.dead:
                    return
                if state.hung:  # a hung engine's stats logger is silent too
                    continue
                if simulated:
                    state.interval_prompt_tokens += int(SIMULATED_PROMPT_TOKENS_PER_SECOND * elapsed)
                    state.interval_generation_tokens += int(SIMULATED_GENERATION_TOKENS_PER_SECOND * elapsed)
                    state.interval_preemptions += knobs.preemptions_per_interval
                    state.preemptions_total += knobs.preemptions_per_interval
                    state.running = SIMULATED_RUNNING_REQUESTS
                    state.kv_usage = knobs.kv_usage_percent / 100.0
                prompt = state.interval_prompt_tokens / elapsed
                generation = state.interval_generation_tokens / elapsed
                preemptions, running, usage = state.interval_preemptions, state.running, state.kv_usage
                seen_requests = state.requests_total > 0 or simulated
                state.interval_prompt_tokens = state.interval_generation_tokens = state.interval_preemptions = 0
            idle = engine_is_idle(prompt, generation, last_prompt, last_generation)
            last_prompt, last_generation = prompt, generation
            if idle or context.config.disable_log_stats:
                continue
            stats = IntervalStats(
                prompt_throughput=prompt,
                generation_throughput=generation,
                running=running,
                waiting=0,
                preemptions=preemptions,
                kv_usage_percent=usage * 100.0,
                prefix_cache_hit_rate=0.0 if context.config.enable_prefix_caching and seen_requests else None,
            )
            context.output.log(msg.STATS, (stats_message(stats),))
