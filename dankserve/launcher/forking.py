"""Pure: may a server be forked from the pre-imported vLLM, or does it need a plain boot?

Each rule below is vLLM 0.26.0's own reason to use `spawn` (read from its source), or a reason of
ours where a fork from the pre-imported interpreter would not be the boot vLLM would make:

- `vllm/utils/system_utils.py::_maybe_force_spawn` forces spawn when the process is in a Ray
  actor (`is_in_ray_actor`), when `--numa-bind` is in argv ("NUMA binding uses executable
  hijacking which requires spawn"), when CUDA (or XPU) is already initialised, and on WSL ("NVML
  is not compatible with fork"); it leaves an explicit `VLLM_WORKER_MULTIPROC_METHOD=spawn` alone.
- `vllm/platforms/cpu.py` sets spawn for the CPU platform and `vllm/platforms/xpu.py` for XPU
  (`--device cpu|xpu`); dankserve plans CUDA only, but a hand-written argv could ask.
- `vllm/entrypoints/serve/utils/api_utils.py::cli_env_setup` (the `vllm` CLI) sets spawn only
  when the variable is unset: the launcher sets `fork`, so the engine core is forked from the
  API server instead of importing torch and vLLM again (FACTS: 17-19 s on the H200).
- Ours: a Ray executor (`--distributed-executor-backend ray`: Ray's workers start their own
  interpreters and the driver connects to a cluster we must not inherit half-open), an import
  that failed (the plain boot shows vLLM's own error), Python threads started by the import (a
  fork copies the interpreter's locks they may hold: logging's, the import lock), and an
  environment that differs from the import's in variables vLLM or Python read at import time
  (`IMPORT_TIME_ENV`): the forked server would run with the old values.

Native threads do not prevent a fork. On the H200 (2026-12-01) importing vLLM 0.26.0's CLI left
47 of them and no Python thread: three pools of 15 (one per core but one: numpy's OpenBLAS
workers, whose `pthread_atfork` handler stops them before a fork, and the OpenMP/BLAS pools of
the libraries vLLM's API server imports), jemalloc's background thread (atfork-safe) and the CUDA
driver's helper thread that loading libcuda and NVML starts (no context: `torch.cuda` is not
initialised). That is the state vLLM's own fork of its engine core starts from whenever
`VLLM_WORKER_MULTIPROC_METHOD=fork` (the API server has imported the same modules), and the
default of vLLM's `LLM` class; repeated forked boots there are the proof (docs/launcher.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

METHOD_VAR = "VLLM_WORKER_MULTIPROC_METHOD"

IMPORT_TIME_ENV_PREFIXES = ("PYTHON", "LD_", "VLLM_LOGGING_")
IMPORT_TIME_ENV = frozenset(
    {
        # vllm/logger.py configures the root logger at import (_configure_vllm_root_logger()).
        "VLLM_CONFIGURE_LOGGING",
        "NO_COLOR",
        # vllm/utils/system_utils.py: set_process_title's default prefix is evaluated at import.
        "VLLM_PROCESS_NAME_PREFIX",
        # Plugins and the platform are resolved once per interpreter.
        "VLLM_PLUGINS",
        "VLLM_TARGET_DEVICE",
    }
)


@dataclass(frozen=True)
class Zygote:
    """What the pre-importing process reported after its import."""

    imported: bool
    error: str | None = None
    threads: tuple[str, ...] = ()
    """Names of every thread of the importing process (its main thread included), native ones too."""
    python_threads: tuple[str, ...] = ()
    """Threads Python's `threading` started during the import (the main thread excluded)."""
    cuda_initialized: bool = False
    wsl: bool = False
    env: Mapping[str, str] | None = None
    """The environment the import ran under."""


@dataclass(frozen=True)
class Decision:
    fork: bool
    reason: str


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def import_time_differences(before: Mapping[str, str], after: Mapping[str, str]) -> list[str]:
    """The variables read at import time whose values differ between the import's env and a server's."""
    keys = {k for k in (*before, *after) if k in IMPORT_TIME_ENV or k.startswith(IMPORT_TIME_ENV_PREFIXES)}
    return sorted(k for k in keys if before.get(k) != after.get(k))


def decide(argv: Sequence[str], env: Mapping[str, str], zygote: Zygote) -> Decision:
    """Fork from the pre-imported vLLM, or boot plainly (and why)."""
    if env.get(METHOD_VAR) == "spawn":
        return Decision(False, f"{METHOD_VAR}=spawn is set: vLLM keeps spawn")
    if "RAY_ADDRESS" in env:
        return Decision(False, "RAY_ADDRESS is set (a Ray actor): vLLM forces spawn")
    backend = _flag_value(argv, "--distributed-executor-backend")
    if backend == "ray":
        return Decision(False, "--distributed-executor-backend ray: Ray workers start their own interpreters")
    if any(a == "--numa-bind" or a.startswith("--numa-bind=") for a in argv):
        return Decision(False, "--numa-bind: vLLM forces spawn (NUMA binding hijacks the executable)")
    device = _flag_value(argv, "--device")
    if device in ("cpu", "xpu"):
        return Decision(False, f"--device {device}: vLLM's {device} platform forces spawn")
    if zygote.wsl:
        return Decision(False, "WSL: vLLM forces spawn (NVML is not compatible with fork)")
    if not zygote.imported:
        return Decision(False, f"the pre-import failed ({zygote.error or 'unknown error'}): a plain boot shows why")
    if zygote.cuda_initialized:
        return Decision(False, "CUDA was initialised by the import: vLLM forces spawn")
    if zygote.python_threads:
        names = ", ".join(zygote.python_threads)
        return Decision(False, f"the import started Python threads ({names}): a fork could deadlock on their locks")
    changed = import_time_differences(zygote.env or {}, env)
    if changed:
        return Decision(False, f"variables read at import differ from the pre-import's: {', '.join(changed)}")
    native = len(zygote.threads) - 1
    if native > 0:
        return Decision(True, f"forked from the pre-imported vLLM ({native} native threads, no Python thread)")
    return Decision(True, "forked from the pre-imported vLLM")


def inherited_env(launcher_env: Mapping[str, str], spec_env_var: str) -> dict[str, str]:
    """What every server inherits from the launcher's own environment: all but the deployment's variables,
    named in `spec_env_var` (`*`: none is inherited), which each start request gives anew."""
    names = launcher_env.get(spec_env_var, "")
    if names.strip() == "*":
        return {}
    dropped = {name.strip() for name in names.split(",")} | {spec_env_var}
    return {k: v for k, v in launcher_env.items() if k not in dropped}


def server_env(env: Mapping[str, str], decision: Decision) -> dict[str, str]:
    """The server's environment: a forked server's engine core is forked too, unless the env says otherwise."""
    out = dict(env)
    if decision.fork:
        out.setdefault(METHOD_VAR, "fork")
    return out
