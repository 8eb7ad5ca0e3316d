"""Where a boot's seconds went: each boot row of a launcher.py run, split by its server's stamped log.

launcher.py stamps every line of the servers' logs as it is written (`stamped-launcher.log` for the
daemon's boots, `stamped-manual_best_N.log` for the boots by hand: `EPOCH<TAB>line`; vLLM's own
stamps are whole seconds). This reads those files beside the rows and adds to each boot row a
`breakdown` (seconds per phase, in boot order) from the first line that marks each phase:

  to_server            the event (kill, `down`/`up`, the daemon's start) to the server's process
  interpreter_imports  the process to vLLM's first line (a forked server has imported already)
  api_setup            the API server's first line to the engine core's (a spawned engine core
                       imports torch and vLLM again here)
  engine_start         the engine core to `Loading model` (CUDA and torch.distributed set-up)
  weights              `Loading model` to `Model loading took`
  compile              to `torch.compile took` (Dynamo's bytecode transform and the cache load, or
                       the compile itself on a miss)
  profile_kv           to `GPU KV cache size` (the profiling run, or none with the learned bytes;
                       the KV cache's allocation)
  graphs               to `Graph capturing finished`
  engine_tail          to `init engine ... took` (warm-up, the JIT monitor)
  api_start            to `Application startup complete.`
  warm_up              to the last completion answered before ready: dankserve's warm-up (issue 28 item 4;
                       none by hand, where the first user request pays vLLM's first-request kernel compile)
  to_ready             to the daemon's ready (or, by hand, /health 200)

    python bench/real_vllm/breakdown.py DIR     (DIR holds launcher.json and the stamped logs)

prints one line per boot and writes DIR/launcher.json back with the breakdowns.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dankserve.launcher import protocol

MARKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("first_line", ("(APIServer pid=",)),
    ("engine", ("Initializing a V1 LLM engine",)),
    # vLLM 0.26's V2 model runner, or the V1 runner's line (and the stand-in's)
    ("load_start", ("Loading model from scratch", "Starting to load model")),
    ("weights_done", ("Model loading took",)),
    ("compile_done", ("torch.compile took",)),
    ("kv", ("GPU KV cache size",)),
    ("graphs_done", ("Graph capturing finished",)),
    ("engine_done", ("init engine (profile, create kv cache, warmup model) took",)),
    ("api_up", ("Application startup complete.",)),
)
PHASES = (
    ("to_server", "begin", "server"),
    ("interpreter_imports", "server", "first_line"),
    ("api_setup", "first_line", "engine"),
    ("engine_start", "engine", "load_start"),
    ("weights", "load_start", "weights_done"),
    ("compile", "weights_done", "compile_done"),
    ("profile_kv", "compile_done", "kv"),
    ("graphs", "kv", "graphs_done"),
    ("engine_tail", "graphs_done", "engine_done"),
    ("api_start", "engine_done", "api_up"),
    ("warm_up", "api_up", "warmed"),
    ("to_ready", "warmed", "ready"),
)
COMPLETION_LINE = '"POST /v1/completions'
"""uvicorn's access line, written as each completion is answered."""
BOOT_KINDS = {
    "cold",
    "launcher-kill",
    "launcher-down-up",
    "launcher-config-change",
    "launcher-kill-multithread-load",
    "fork-repeat",
    "manual-best",
}
JIT_LINE = "Triton kernel JIT compilation during inference"
STARTED = re.compile(re.escape(protocol.PREFIX) + r" server (\d+) started:")


def stamped(path: Path) -> list[tuple[float, str]]:
    out = []
    for raw in path.read_text(errors="replace").splitlines():
        stamp, _, text = raw.partition("\t")
        try:
            out.append((float(stamp), text))
        except ValueError:
            continue
    return out


def server_segment(lines: list[tuple[float, str]], server: int) -> tuple[float | None, list[tuple[float, str]]]:
    """The launcher's marker time for `server` and that server's own lines (until the next marker)."""
    start, inside, out = None, False, []
    for at, text in lines:
        marker = STARTED.match(text)
        if marker is not None:
            if inside:
                break
            inside = int(marker.group(1)) == server
            start = at if inside else start
            continue
        if inside:
            out.append((at, text))
    return start, out


def marks(lines: list[tuple[float, str]]) -> dict[str, float]:
    found: dict[str, float] = {}
    for at, text in lines:
        for name, wanted in MARKS:
            if name not in found and any(w in text for w in wanted):
                found[name] = at
    return found


def breakdown(row: dict[str, Any], folder: Path) -> dict[str, Any] | None:
    if row.get("kind") not in BOOT_KINDS or "began_at" not in row:
        return None
    if row["kind"] == "manual-best":
        lines = stamped(folder / row["log"])
        server_at: float | None = row["began_at"]
        ready = row["began_at"] + row["seconds"]
    else:
        server_at, lines = server_segment(stamped(folder / "stamped-launcher.log"), row["server"])
        ready = row["ready_at"]
    at = {"begin": row["began_at"], "server": server_at, **marks(lines), "ready": ready}
    answered = [t for t, text in lines if COMPLETION_LINE in text and t <= ready + 0.02]
    at["warmed"] = answered[-1] if answered else at.get("api_up")
    phases = {
        name: round(at[end] - at[begin], 2) if at.get(begin) is not None and at.get(end) is not None else None
        for name, begin, end in PHASES
    }
    jit = [t for t, text in lines if JIT_LINE in text]
    return {**phases, "jit_after_ready_at": round(jit[0] - ready, 3) if jit else None}


def main() -> int:
    folder = Path(sys.argv[1])
    rows = json.loads((folder / "launcher.json").read_text())
    print(f"{'kind':18} {'s':>7} " + " ".join(f"{name[:10]:>10}" for name, _, _ in PHASES))
    for row in rows:
        found = breakdown(row, folder)
        if found is None:
            continue
        row["breakdown"] = found
        cells = " ".join(f"{'-' if found[n] is None else found[n]:>10}" for n, _, _ in PHASES)
        print(f"{row['kind']:18} {row['seconds']:7.2f} {cells}")
    (folder / "launcher.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
