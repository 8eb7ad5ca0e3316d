"""Stand-in vLLM: image build time (cold, cached, program-only) and the program's boot to /health 200.

The image is built into a private Podman storage and build directory (so "cold" includes
mmdebstrap from the host's Debian mirror); the boots run the program as a plain process with its
default time scale: a cold boot (empty VLLM_CACHE_ROOT), a compile-cache hit, and a hit with the
learned --kv-cache-memory-bytes, against `python3 -c pass` measured in the same run.
Needs root, podman and mmdebstrap. BENCH_REPEAT (default 5) sets the repetitions.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report, time_call, time_command

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "containers" / "build-image.sh"
PROGRAM = REPO / "containers" / "fake-vllm" / "vllm.py"


def build(env: dict[str, str], script: Path = BUILD_SCRIPT) -> None:
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)


def changed_program_build(env: dict[str, str], workdir: Path, index: int) -> float:
    """Seconds to rebuild after a program change: a copy of containers/ with one file edited."""
    copy = workdir / f"containers-{index}"
    shutil.copytree(BUILD_SCRIPT.parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "fake-vllm" / "fake_vllm" / "__init__.py").open("a") as init:
        init.write(f"# bench edit {index}\n")
    start = time.perf_counter()
    build(env, copy / "build-image.sh")
    return time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def boot_to_health(cache_root: Path, extra: list[str]) -> tuple[float, str]:
    """Seconds from start to /health 200, and the boot's stdout."""
    port = free_port()
    env = {**os.environ, "NO_COLOR": "1", "VLLM_CACHE_ROOT": str(cache_root)}
    log = cache_root.parent / "boot.log"
    with log.open("wb") as out:
        start = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, str(PROGRAM), "serve", "/models/tiny", "--port", str(port), *extra],
            env=env,
            stdout=out,
            stderr=subprocess.DEVNULL,
        )
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                        if response.status == 200:
                            break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.01)
            elapsed = time.perf_counter() - start
        finally:
            process.terminate()
            process.wait()
    return elapsed, log.read_text()


def boots(repeat: int, workdir: Path) -> list[dict[str, Any]]:
    cold, hit, learned = [], [], []
    for index in range(repeat):
        cache = workdir / f"cache-{index}"
        seconds, stdout = boot_to_health(cache, [])
        cold.append(seconds)
        seconds, _ = boot_to_health(cache, [])
        hit.append(seconds)
        match = re.search(r"--kv-cache-memory=(\d+)", stdout)
        assert match is not None
        seconds, _ = boot_to_health(cache, ["--kv-cache-memory-bytes", match.group(1)])
        learned.append(seconds)
    baseline = time_command([sys.executable, "-c", "pass"], repeat)
    return [
        {"what": "python3 -c pass (baseline)", "median_ms": median_ms(baseline), "real_h200_s": "-"},
        {"what": "boot to /health: cold", "median_ms": median_ms(cold), "real_h200_s": 116.2},
        {"what": "boot to /health: compile cache hit", "median_ms": median_ms(hit), "real_h200_s": 80.0},
        {"what": "boot to /health: hit + learned KV bytes", "median_ms": median_ms(learned), "real_h200_s": 52.8},
    ]


def image_builds(repeat: int, workdir: Path) -> list[dict[str, Any]]:
    storage = workdir / "storage"
    podman = f"podman --root {storage}/root --runroot {storage}/runroot"
    env = {**os.environ, "PODMAN": podman, "FAKE_VLLM_BUILD_DIR": str(workdir / "build")}
    try:
        cold = time_call(lambda: build(env), 1)
        cached = time_call(lambda: build(env), repeat)
        program_only = [changed_program_build(env, workdir, index) for index in range(repeat)]
    finally:
        subprocess.run([*podman.split(), "rmi", "--all", "--force"], check=False, capture_output=True)
    return [
        {"what": "image build: cold (mmdebstrap + import + build)", "median_ms": median_ms(cold), "real_h200_s": "-"},
        {
            "what": "image build: program changed (rootfs cached)",
            "median_ms": median_ms(program_only),
            "real_h200_s": "-",
        },
        {"what": "image build: nothing changed", "median_ms": median_ms(cached), "real_h200_s": "-"},
    ]


def main() -> None:
    repeat = int(os.environ.get("BENCH_REPEAT", "5"))
    workdir = Path(tempfile.mkdtemp(prefix="fake-vllm-bench-"))
    try:
        rows = boots(repeat, workdir)
        if shutil.which("podman") and shutil.which("mmdebstrap") and os.geteuid() == 0:
            rows += image_builds(repeat, workdir)
        report("fake_vllm_image", rows, {"repeat": repeat})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
