"""How long probing takes: the live probe in-process, and `dankserve probe` as a whole process.

- `probe_host()` in-process with real NVML, when this machine has a usable NVIDIA driver
  (otherwise the row says it was skipped and why); the first call is shown apart, since it
  also loads the NVML library.
- whole process: `python -m dankserve probe --json --hardware dankserve/testing/hosts/h200x1-vm.json` (and
  the text table) against `python3 -c pass` in the same run, median of BENCH_REPEAT (>= 15)
  runs each, with the ratio. Target: under 300 ms.

Run from the repository root: `python3 bench/probe_timing.py` (or `python3 -m bench.probe_timing`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `bench` and `dankserve` importable
    sys.path.insert(0, str(REPO))

from bench.common import median_ms, report, time_call, time_command  # noqa: E402

REPEAT = max(15, int(os.environ.get("BENCH_REPEAT", "15")))
RECORDED = REPO / "dankserve" / "testing" / "hosts" / "h200x1-vm.json"
TARGET_MS = 300.0


def in_process_rows() -> list[dict[str, Any]]:
    from dankserve.errors import NvmlUnavailable
    from dankserve.host.nvml import read_nvml
    from dankserve.host.probe import probe_host

    start = time.perf_counter()
    try:
        host = probe_host()
    except NvmlUnavailable as exc:
        reason = exc.message.split(". Looked for")[0]
        return [{"what": "probe_host() in-process", "median_ms": None, "note": f"skipped: {reason}"}]
    first_ms = round((time.perf_counter() - start) * 1000, 1)
    gpus = f"{len(host.gpus)} x {host.gpus[0].name}"
    probe = time_call(probe_host, REPEAT)
    nvml = time_call(read_nvml, REPEAT)
    return [
        {"what": "probe_host() first call (loads NVML)", "median_ms": first_ms, "note": gpus},
        {"what": "probe_host() in-process", "median_ms": median_ms(probe), "note": f"{gpus}, {REPEAT} runs"},
        {"what": "read_nvml() in-process", "median_ms": median_ms(nvml), "note": f"{REPEAT} runs"},
    ]


def whole_process_rows() -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    python = sys.executable
    commands = {
        "python3 -c pass (baseline)": [python, "-c", "pass"],
        "dankserve probe --json --hardware": [
            python,
            "-m",
            "dankserve",
            "probe",
            "--json",
            "--hardware",
            str(RECORDED),
        ],
        "dankserve probe --hardware (table)": [python, "-m", "dankserve", "probe", "--hardware", str(RECORDED)],
    }
    medians = {name: median_ms(time_command(argv, REPEAT, env=env)) for name, argv in commands.items()}
    baseline = medians["python3 -c pass (baseline)"]
    rows = []
    for name, value in medians.items():
        verdict = (
            "" if name.startswith("python3") else ("under" if value < TARGET_MS else "OVER") + f" {TARGET_MS:.0f} ms"
        )
        rows.append(
            {
                "what": name,
                "median_ms": value,
                "note": f"x{value / baseline:.1f} of baseline, {REPEAT} runs {verdict}".rstrip(),
            }
        )
    return rows


def main() -> None:
    rows = in_process_rows() + whole_process_rows()
    report("probe_timing", rows, extra={"repeat": REPEAT, "recorded_host": RECORDED.name})


if __name__ == "__main__":
    main()
