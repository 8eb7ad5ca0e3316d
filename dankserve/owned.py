"""What dankserve owns in a server's command line and environment, and so refuses from the user.

A deployment's `extra_args` and `env` reach vLLM verbatim. A few flags and variables decide
what dankserve promises (the address and key a server is reached by, the GPUs it runs on,
where its caches live, the KV bytes it learned), so setting them there would make `status` and
the plan lie: each has a config key instead, named in the refusal. Secrets never go on a
command line or into an environment table (they would show in `ps`, `podman inspect`, the
plan and the process records): each has a `*_file` key. Pure data and checks; the settings package
turns each problem into a ConfigError (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

SECRET_FLAGS: Mapping[str, str] = {
    "--api-key": "api_key_file",
    "--hf-token": "hf_token_file",
}
"""vLLM flags that carry a secret, and the key that passes it from a file instead."""

OWNED_FLAGS: Mapping[str, str] = {
    "--host": "host",
    "--port": "port",
    "--uds": "host and port",
    "--model": "model",
    "--pipeline-parallel-size": "hosts (a multi-host group)",
    "-pp": "hosts (a multi-host group)",
    "--distributed-executor-backend": "hosts (a multi-host group)",
    "--kv-cache-memory-bytes": "gpu_memory_utilization (dankserve learns the KV bytes from the first boot)",
    "--download-dir": "hf_cache_dir",
    "--numa-bind": "numa_bind",
    "--numa-bind-nodes": "numa_bind",
}
"""Flags dankserve sets from a config key (the value), which extra_args must not override. (Tuning
flags that have a setting, such as `-tp` or `--gpu-memory-utilization`, are taken into that setting
by the planner instead: plan/extra_args.py.)"""

OPAQUE_FLAGS: Mapping[str, str] = {
    "--config": "vLLM reads more flags from that YAML file, where dankserve cannot check them (a --host or "
    "--api-key there would pass every refusal above): put the flags in extra_args, or their settings in the config",
}
"""Flags that would hide other flags from dankserve's checks, and why they are refused."""

SECRET_ENV: Mapping[str, str] = {
    "VLLM_API_KEY": "api_key_file",
    "HF_TOKEN": "hf_token_file",
    "HUGGING_FACE_HUB_TOKEN": "hf_token_file",
}
"""Environment variables that carry a secret, and the key that passes it from a file instead."""

CONTRACT_ENV: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "dankserve assigns the GPUs (set gpus)",
    "NVIDIA_VISIBLE_DEVICES": "dankserve assigns the GPUs (set gpus)",
    "CUDA_DEVICE_ORDER": "dankserve numbers GPUs in PCI order, as NVML does (set gpus)",
    "VLLM_CACHE_ROOT": "dankserve keeps the compile cache per deployment (set cache_dir)",
    "HF_HOME": "dankserve mounts the Hugging Face cache (set hf_cache_dir)",
    "HF_HUB_CACHE": "dankserve mounts the Hugging Face cache (set hf_cache_dir)",
    "HF_TOKEN_PATH": "dankserve passes the token file (set hf_token_file)",
    "VLLM_HOST_IP": "dankserve decides the addresses (set host, or hosts for a group)",
    "VLLM_PORT": "dankserve decides the ports (set port)",
    "VLLM_SERVER_DEV_MODE": "it opens /sleep, /wake_up and /collective_rpc to anyone who reaches the port, "
    "without the key; dankserve turns it on itself for swap group members (sleep mode), on loopback only",
    "PATH": "it decides which programs the server runs (set executable for the process runtime)",
    "LD_PRELOAD": "it loads code into the server before vLLM",
    "LD_LIBRARY_PATH": "it replaces the libraries (CUDA, NCCL) the server loads",
    "LD_AUDIT": "it loads code into the server before vLLM",
    "PYTHONPATH": "it replaces the Python modules the server imports",
    "PYTHONHOME": "it replaces the Python the server runs",
    "PYTHONSTARTUP": "it runs code in the server's Python",
}
"""Environment variables that break dankserve's own contract with the server, and why."""


def flag_name(arg: str) -> str | None:
    """The flag an argument names, in vLLM's spelling (`--max_model_len=8` -> `--max-model-len`), or None."""
    if not arg.startswith("-") or arg == "-" or arg.startswith("---"):
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].replace("_", "-")  # vLLM reads `--a_b` as `--a-b`
    return name


def _owner(name: str, table: Mapping[str, str]) -> str | None:
    """The table's entry for `name`, or for the flag `name` abbreviates (argparse accepts unique prefixes)."""
    if name in table:
        return table[name]
    if name.startswith("--") and len(name) > 3:
        for flag, key in table.items():
            if flag.startswith(name):
                return key
    return None


def extra_args_problems(args: Iterable[str]) -> list[str]:
    """Why each refused argument is refused (empty when every one may pass)."""
    problems = []
    for arg in args:
        name = flag_name(arg)
        if name is None:
            continue
        secret_key = _owner(name, SECRET_FLAGS)
        if secret_key is not None:
            problems.append(
                f"extra_args holds {name}: a secret on the command line shows in ps, podman inspect and the "
                f"plan; put it in a file (mode 0600) and set {secret_key} instead"
            )
            continue
        opaque = OPAQUE_FLAGS.get(name)
        if opaque is not None:
            problems.append(f"extra_args holds {name}: {opaque}")
            continue
        key = _owner(name, OWNED_FLAGS)
        if key is not None:
            problems.append(f"extra_args holds {name}, which dankserve sets itself: set {key} instead")
    return problems


def env_problems(env: Mapping[str, str]) -> list[str]:
    """Why each refused environment variable is refused (empty when every one may pass)."""
    problems = []
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            problems.append(
                f"env name {name!r} is not a variable name: letters, digits and '_', not starting with a digit "
                "(an '=' or a NUL byte cannot be passed to a process)"
            )
        elif name in SECRET_ENV:
            problems.append(
                f"env holds {name}: a secret in the environment shows in podman inspect and the process "
                f"records; put it in a file (mode 0600) and set {SECRET_ENV[name]} instead"
            )
        elif name in CONTRACT_ENV:
            problems.append(f"env holds {name}, which dankserve must control: {CONTRACT_ENV[name]}")
    return problems
