"""Podman runtime overhead: dankserve's create+start and pull against the podman CLI, same run.

1. create+start: `PodmanRuntime.start(spec)` (look up, secrets sweep, create, start,
   inspect) against `podman run -d` with the same options (name, labels, port on 127.0.0.1,
   ipc=host, env, entrypoint, compile-cache mount). Target: ratio <= 1.3.
2. pull: `PodmanRuntime.ensure_image(ref, "always")` against `podman pull ref`, from a local
   registry, the image removed before each pull. Target: ratio <= 1.2.

Runs on the test harness (private Podman service, local registry; root, Debian 12):
    .venv/bin/python bench/podman_start.py [--repeat N] [--pull-mb MB]
Both variants alternate within one run so drift on a shared machine hits both alike.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_ms, report
from dankserve.runtime.base import (
    LABEL_BOOT,
    LABEL_DEPLOYMENT,
    LABEL_FINGERPRINT,
    LABEL_MANAGED,
    PullProgress,
    WorkloadSpec,
)
from tests.harness.images import busybox_vllm_image, pull_test_image
from tests.harness.podman_service import SESSION_LABEL, PodmanEnv, missing_requirements, podman_service
from tests.harness.registry import free_loopback_port, local_registry


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_start(env: PodmanEnv, image: str, workdir: Path, repeat: int) -> dict[str, object]:
    from dankserve.runtime.podman import PodmanRuntime

    runtime = PodmanRuntime(env.url, cache_dir=workdir / "cache", cdi_dirs=(), journal_socket=workdir / "none")
    cache = workdir / "compile-cache"
    cache.mkdir()
    deployment = f"bench{env.session}"
    labels = {SESSION_LABEL: env.session, LABEL_FINGERPRINT: "fp", LABEL_BOOT: "1"}

    def spec() -> WorkloadSpec:
        return WorkloadSpec(
            deployment=deployment,
            image=image,
            argv=("bench/model", "--port", "8000"),
            env={"FAKE_VLLM_BOOT_SECONDS": "0"},
            port=free_loopback_port(),
            labels=labels,
            cache_dir=cache,
        )

    def cli_run() -> None:
        label_args = [
            arg
            for key, value in {**labels, LABEL_MANAGED: "true", LABEL_DEPLOYMENT: f"{deployment}-cli"}.items()
            for arg in ("--label", f"{key}={value}")
        ]
        env.podman(
            "run", "-d", "--name", f"dankserve-{deployment}-cli", *label_args,
            "-p", f"127.0.0.1:{free_loopback_port()}:8000/tcp", "--ipc=host",
            "-e", "FAKE_VLLM_BOOT_SECONDS=0", "-e", "VLLM_CACHE_ROOT=/root/.cache/vllm",
            "--mount", f"type=bind,source={cache},target=/root/.cache/vllm",
            "--entrypoint", '["vllm", "serve"]', image, "bench/model", "--port", "8000",
        )  # fmt: skip

    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(timed(lambda: runtime.start(spec())))
        env.podman("rm", "-f", "-t", "0", f"dankserve-{deployment}")
        theirs.append(timed(cli_run))
        env.podman("rm", "-f", "-t", "0", f"dankserve-{deployment}-cli")
    runtime.close()
    return row("create+start", ours, theirs, 1.3)


def bench_pull(env: PodmanEnv, registry: str, size_mb: int, repeat: int) -> dict[str, object]:
    from dankserve.runtime.podman import PodmanRuntime

    reference = pull_test_image(env, registry, f"bench{env.session}", size_bytes=size_mb * 1024 * 1024)
    runtime = PodmanRuntime(env.url)
    reports: list[PullProgress] = []  # consumed like the CLI's progress bar would
    ours, theirs = [], []
    for _ in range(repeat):
        ours.append(timed(lambda: runtime.ensure_image(reference, "always", reports.append)))
        env.podman("rmi", reference)
        theirs.append(timed(lambda: env.podman("pull", "--quiet", reference)))
        env.podman("rmi", reference)
    runtime.close()
    return row(f"pull {size_mb} MiB", ours, theirs, 1.2)


def row(case: str, ours: list[float], theirs: list[float], target: float) -> dict[str, object]:
    ratio = round(median_ms(ours) / median_ms(theirs), 3)
    return {
        "case": case,
        "runs": len(ours),
        "dankserve_ms": median_ms(ours),
        "podman_cli_ms": median_ms(theirs),
        "ratio": ratio,
        "target": f"<= {target}",
        "ok": ratio <= target,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="runs of each variant (default 15)")
    parser.add_argument("--pull-mb", type=int, default=64, help="size of the pulled image's payload in MiB")
    args = parser.parse_args()
    missing = missing_requirements()
    if missing:
        print(f"cannot run here: missing {', '.join(missing)}", file=sys.stderr)
        return 3
    with tempfile.TemporaryDirectory(prefix="dankserve-bench-") as tmp:
        workdir = Path(tmp)
        with (
            local_registry(workdir / "registry") as registry,
            podman_service(workdir / "podman", insecure_registries=[registry]) as env,
        ):
            image = busybox_vllm_image(env)
            rows = [bench_start(env, image, workdir, args.repeat), bench_pull(env, registry, args.pull_mb, args.repeat)]
    report("podman_start", rows, {"repeat": args.repeat, "image": "busybox vLLM imitation (tests/harness)"})
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
