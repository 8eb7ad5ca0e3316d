"""LoRA adapters on real vLLM (issue 31): a random adapter served by name, one loaded at runtime, greedy ids compared.

Builds two random LoRA adapters for the test model with peft (rank 16 and 8 on every linear
module of the decoder, `init_lora_weights=False` so that B is not zero: the adapter changes the
output), reads them as dankserve does (`hub.adapters.adapter_facts`) and plans the LoRA flags with
dankserve's rules (`plan.lora`), boots `vllm serve MODEL --enable-lora ... --lora-modules
a1=DIR` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, then:

1. greedy token ids (`ignore_eos`, `return_token_ids`) of the base model and of `a1` (loaded at boot),
2. `a2` loaded at runtime through dankserve's own edge (`supervisor.worker.adapters.apply`: POST
   /v1/load_lora_adapter), its ids, and `a1` unloaded (POST /v1/unload_lora_adapter; then 404),
3. /v1/models: each adapter listed with `parent` = the base model,
4. GPU memory in use (NVML) with the adapters' slots, beside the planner's estimate of the slots.

Verdict: every adapter's ids differ from the base's and from each other's, and a repeat of a
request gives the same ids (greedy is deterministic).

  python3 bench/real_vllm/lora.py [--out DIR] [--adapters DIR]

On the GPU machine (bench/real_vllm/on_gpu.sh, process runtime): `on_gpu.sh proc1` (carry .vl1
.dev), then `on_gpu.sh proc2 "python3 bench/real_vllm/lora.py"` (carry .vl2; about 3 min: the
model build, two adapter builds, one boot); `on_gpu.sh jobs` follows it if the call ends first.

Environment: LORA_MODEL (default /tmp/tinyllama, make_tiny_llama.py's model), LORA_VLLM (the
command before `serve`; default this Python's `-m vllm.entrypoints.cli.main`). Rehearsal without a
GPU: `LORA_VLLM="python3 containers/fake-vllm/vllm.py" LORA_FAKE=1 python3 bench/real_vllm/lora.py
--out /tmp/lora-rehearsal` (LORA_FAKE writes the adapters' config only, no peft, and a tiny
config.json for the model when LORA_MODEL has none). Prints a table and writes OUT/lora.json and
OUT/lora-vllm.log.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.real_vllm import proof, sleep_repeat

MODEL = os.environ.get("LORA_MODEL", "/tmp/tinyllama")
COMMAND = shlex.split(os.environ.get("LORA_VLLM", "")) or [sys.executable, "-m", "vllm.entrypoints.cli.main"]
FAKE = os.environ.get("LORA_FAKE") == "1"
PROMPTS = ("The capital of France is", "def fibonacci(n):")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY_CONFIG = {  # make_tiny_llama.py's shape, for a rehearsal without the model
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def build_adapter(out: Path, rank: int, seed: int) -> Path:
    """A random PEFT LoRA adapter of the model (peft on the GPU machine; LORA_FAKE: its config only)."""
    if FAKE:
        out.mkdir(parents=True, exist_ok=True)
        config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(TARGETS)}
        (out / "adapter_config.json").write_text(json.dumps(config))
        (out / "adapter_model.safetensors").write_bytes(b"\0" * 1024)
        return out
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), init_lora_weights=False)
    model = get_peft_model(base, config)
    model.save_pretrained(out)
    return out


def ensure_model_config() -> None:
    """A rehearsal's model directory: the planner's rules read config.json's sizes."""
    path = Path(MODEL)
    if FAKE and not (path / "config.json").exists():
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text(json.dumps(TINY_CONFIG))


def planned_flags(dirs: dict[str, Path]) -> tuple[list[str], dict[str, Any]]:
    """dankserve's LoRA flags for the adapters known at boot, and the planner's memory estimate."""
    from dankserve.hub.adapters import adapter_facts
    from dankserve.plan.lora import flag_choices, lora_sizing
    from dankserve.plan.models import parse_config
    from dankserve.settings import DeploymentSettings

    dep = DeploymentSettings(model=MODEL, runtime="process", adapters={name: str(path) for name, path in dirs.items()})
    facts = adapter_facts(Path("/nonexistent-hf-cache"), "lora", dep)
    model = parse_config(MODEL, json.loads((Path(MODEL) / "config.json").read_text()))
    sizing = lora_sizing(facts, model)
    argv: list[str] = []
    for flag, value, _ in flag_choices(facts, sizing):
        argv += [flag] if value is None else [flag, *value] if isinstance(value, tuple) else [flag, value]
    return argv, {"slot_bytes": sizing.slot_bytes, "slot_reason": sizing.slot_reason, "host_bytes": sizing.host_bytes}


def boot(port: int, lora_argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    argv = [*COMMAND, "serve", MODEL, "--gpu-memory-utilization", "0.5", "--max-model-len", "4096"]
    argv += ["--attention-backend", "TRITON_ATTN", "--host", "127.0.0.1", "--port", str(port), *lora_argv]
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    return sleep_repeat.serve(argv, env, port, log_path)


def token_ids(client: httpx.Client, model: str) -> tuple[int, list[list[int]]]:
    """Greedy completions of PROMPTS by `model`, 16 tokens each: the status and their ids."""
    out = []
    for prompt in PROMPTS:
        reply = client.post("/v1/completions", json=proof.greedy_request(model, prompt, 16), timeout=120)
        if reply.status_code != 200:
            return reply.status_code, []
        out.append(list(reply.json()["choices"][0].get("token_ids") or []))
    return 200, out


def run(out: Path, adapters: Path) -> dict[str, Any]:
    from dankserve.backend_address import TcpAddress
    from dankserve.supervisor.worker.adapters import AdapterChanges, apply

    ensure_model_config()
    started = time.monotonic()
    dirs = {"a1": build_adapter(adapters / "a1", 16, 1), "a2": build_adapter(adapters / "a2", 8, 2)}
    build_seconds = round(time.monotonic() - started, 1)
    lora_argv, estimate = planned_flags({"a1": dirs["a1"]})
    port = sleep_repeat.free_port()
    proc = boot(port, lora_argv, out / "lora-vllm.log")
    boot_seconds = round(time.monotonic() - started - build_seconds, 1)
    rows: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            status, base = token_ids(client, MODEL)
            rows.append({"step": "base", "status": status, "ids": base})
            status, a1 = token_ids(client, "a1")
            rows.append({"step": "a1 (loaded at boot)", "status": status, "ids": a1})
            rows.append(
                {"step": "a1 again", "status": token_ids(client, "a1")[0], "same": token_ids(client, "a1")[1] == a1}
            )
            server = TcpAddress("127.0.0.1", port)
            t0 = time.monotonic()
            loaded = apply(server, None, AdapterChanges({"a2": str(dirs["a2"])}, ()), lambda: {"a2": str(dirs["a2"])})
            rows.append(
                {
                    "step": "load a2 at runtime",
                    "status": 200 if loaded else 0,
                    "seconds": round(time.monotonic() - t0, 3),
                }
            )
            status, a2 = token_ids(client, "a2")
            rows.append({"step": "a2 (loaded at runtime)", "status": status, "ids": a2})
            listed = {m["id"]: m.get("parent") for m in client.get("/v1/models").json()["data"]}
            gpu_used = proof.gpu_used_bytes()
            unloaded = apply(server, None, AdapterChanges({}, ("a1",)), dict)
            rows.append({"step": "unload a1", "status": 200 if unloaded else 0})
            rows.append({"step": "a1 after unload", "status": token_ids(client, "a1")[0]})
    finally:
        sleep_repeat.stop(proc)
    differ = bool(base and a1 and a2) and base not in (a1, a2) and a1 != a2
    return {
        "model": MODEL,
        "command": COMMAND,
        "lora_argv": lora_argv,
        "planner_estimate": estimate,
        "adapter_build_seconds": build_seconds,
        "boot_seconds": boot_seconds,
        "gpu_used_bytes_with_adapters": gpu_used,
        "listed": listed,
        "rows": rows,
        "adapters_differ_from_base": differ,
        "parents_are_the_base": listed.get("a1") == MODEL and listed.get("a2") == MODEL,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fake": FAKE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/results"))
    parser.add_argument("--adapters", type=Path, default=Path("/tmp/lora-adapters"), help="where the adapters go")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args.out, args.adapters)
    (args.out / "lora.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"adapters built in {result['adapter_build_seconds']} s; boot {result['boot_seconds']} s")
    print("planned: " + " ".join(result["lora_argv"]))
    print(f"planner's slot estimate: {result['planner_estimate']['slot_reason']}")
    print(f"{'step':26} {'status':>6}  first ids")
    for r in result["rows"]:
        first = r.get("ids", [[]])[0][:6] if r.get("ids") else r.get("same", r.get("seconds", ""))
        print(f"{r['step']:26} {r['status']!s:>6}  {first}")
    print(f"/v1/models: {result['listed']}")
    print(f"adapters' greedy ids differ from the base's: {result['adapters_differ_from_base']}")
    print(f"adapters listed with parent = the base: {result['parents_are_the_base']}")


if __name__ == "__main__":
    main()
