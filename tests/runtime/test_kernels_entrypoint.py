"""The container entrypoint's kept kernels (issue 42): the shell wrapper run for real by `sh` with a `vllm` stub.

A first boot fetches FlashInfer's kernels into the kept dir (`vllm download-kernels`, PIP_TARGET) and puts
them first on PYTHONPATH; a later boot fetches nothing and uses them; an offline first boot warns and serves."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from dankserve.runtime.base import KernelsDir, SecretFile
from dankserve.runtime.podman.spec import serve_entrypoint

STUB = """#!/bin/sh
if [ "$1" = download-kernels ]; then
  echo "download-kernels into $PIP_TARGET" >> "$CALLS"
  [ -n "$OFFLINE" ] && { echo "pip: no network" >&2; exit 1; }
  mkdir -p "$PIP_TARGET/flashinfer_cubin"; exit 0
fi
echo "$* PYTHONPATH=$PYTHONPATH"
"""


def run(tmp_path: Path, kernels: KernelsDir, offline: bool = False) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "vllm").write_text(STUB)
    (bin_dir / "vllm").chmod(0o755)
    entrypoint = serve_entrypoint((), kernels)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": "/opt/image-site",
        "CALLS": str(tmp_path / "calls"),
        **({"OFFLINE": "1"} if offline else {}),
    }
    return subprocess.run([*entrypoint, "m", "--port", "8000"], env=env, capture_output=True, text=True, check=True)


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_first_boot_fetches_later_boots_reuse(tmp_path: Path) -> None:
    kept = tmp_path / "cache" / "kernels" / "0.34.0"
    first = run(tmp_path, KernelsDir(str(kept), download=True))
    assert (kept / "flashinfer_cubin").is_dir() and not Path(f"{kept}.partial").exists()
    assert first.stdout.strip() == f"serve m --port 8000 PYTHONPATH={kept}:/opt/image-site"
    assert calls(tmp_path) == [f"download-kernels into {kept}.partial"]
    again = run(tmp_path, KernelsDir(str(kept), download=True))  # present: not fetched again
    later = run(tmp_path, KernelsDir(str(kept), download=False))
    assert again.stdout == later.stdout == first.stdout
    assert len(calls(tmp_path)) == 1


def test_an_offline_first_boot_warns_and_serves(tmp_path: Path) -> None:
    kept = tmp_path / "cache" / "kernels" / "0.34.0"
    done = run(tmp_path, KernelsDir(str(kept), download=True), offline=True)
    assert not kept.exists()
    assert "vllm download-kernels into" in done.stderr and "fetches or compiles kernels at start" in done.stderr
    assert done.stdout.strip() == "serve m --port 8000 PYTHONPATH=/opt/image-site"


def test_kernels_and_a_value_secret_share_one_wrapper(tmp_path: Path) -> None:
    entrypoint = serve_entrypoint(
        (SecretFile("api_key", tmp_path / "k", "VLLM_API_KEY"),), KernelsDir("/k/0.34.0", False)
    )
    assert entrypoint[:2] == ["sh", "-c"] and entrypoint[2].index("PYTHONPATH") < entrypoint[2].index("VLLM_API_KEY")
    assert entrypoint[2].endswith('exec vllm serve "$@"')


@pytest.mark.parametrize("path", ["relative/k", "/k;rm -rf /", "/k/$(x)", "/k/../../etc"])
def test_a_kernels_path_that_is_not_plain_is_refused(path: str) -> None:
    with pytest.raises(ValueError, match="not a plain absolute path"):
        serve_entrypoint((), KernelsDir(path, True))
