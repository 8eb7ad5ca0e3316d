"""Test images, built without any network: a busybox rootfs imported with `podman import`.

`busybox_vllm_image` is a two-megabyte image whose `vllm` is tests/harness/fake_vllm.sh: it
answers `--version`, prints its arguments and the /dev/nvidia* it sees, serves /health, and
crashes or ignores SIGTERM on request. Images are tagged by a hash of their content, so a
rebuild happens only when the script or busybox changes (the storage persists between runs).
`stand_in_image` builds the faithful vLLM stand-in from containers/ once that lands.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dankserve.runtime.podman import LABEL_VLLM_VERSION
from dankserve.testing.podman_service import PodmanEnv, build_stand_in_image, storage_root

HERE = Path(__file__).parent
REPO = HERE.parent.parent
FAKE_VLLM = HERE / "fake_vllm.sh"


def _busybox() -> Path:
    found = shutil.which("busybox")
    if found is None:
        raise RuntimeError("busybox is not installed (Debian package busybox-static)")
    return Path(found).resolve()


def rootfs_tarball(extra_files: dict[str, bytes] | None = None) -> bytes:
    """A rootfs with static busybox, every applet linked in /bin, and `vllm` in /usr/bin."""
    busybox = _busybox()
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add(name: str, *, data: bytes | None = None, mode: int = 0o755, link: str | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.mtime = 0
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
            elif data is None:
                info.type = tarfile.DIRTYPE
            else:
                info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for directory in ("bin", "usr", "usr/bin", "dev", "proc", "sys", "etc", "run", "root", "root/.cache"):
            add(directory)
        add("tmp", mode=0o1777)
        add("bin/busybox", data=busybox.read_bytes())
        for applet in applets:
            if applet != "busybox":
                add(f"bin/{applet}", link="busybox")
        add("usr/bin/vllm", data=FAKE_VLLM.read_bytes())
        add("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
        add("etc/group", data=b"root:x:0:\n", mode=0o644)
        for name, data in (extra_files or {}).items():
            add(name, data=data, mode=0o644)
    return buffer.getvalue()


def import_image(env: PodmanEnv, reference: str, tarball: bytes, labels: dict[str, str]) -> None:
    changes = ['ENTRYPOINT ["vllm", "serve"]', "ENV PATH=/usr/bin:/bin"]
    changes += [f"LABEL {key}={value}" for key, value in labels.items()]
    args = ["import", "--quiet"]
    for change in changes:
        args += ["--change", change]
    env.podman_bytes(*args, "-", reference, input=tarball)


@contextmanager
def building() -> Iterator[None]:
    """Held while a test image is built into the shared storage: the pytest-xdist workers each run a
    Podman service of their own on the same storage, and the first to need an image builds it while
    the others wait for it (then find it there)."""
    root = storage_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".dankserve-test-build.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def busybox_vllm_image(env: PodmanEnv, *, version_label: bool = True) -> str:
    """The busybox imitation of vLLM, with or without the vLLM-version image label; its ref."""
    labels = {LABEL_VLLM_VERSION: "0.33.0"} if version_label else {}
    tarball = rootfs_tarball()
    digest = hashlib.sha256(tarball + repr(sorted(labels.items())).encode()).hexdigest()[:12]
    reference = f"localhost/dankserve-test-vllm:{digest}"
    with building():
        if env.podman("image", "exists", reference, check=False).returncode != 0:
            import_image(env, reference, tarball, labels)
    return reference


def pull_test_image(env: PodmanEnv, registry: str, name: str, size_bytes: int = 0) -> str:
    """An image with a layer no other image has, pushed to the registry and absent locally; its ref.

    `size_bytes` of random data make the layer big enough to time a pull. It carries the
    vLLM-version label, so pulling it runs no version probe.
    """
    marker = {"etc/dankserve-test-marker": f"{name} {time.time_ns()}".encode()}
    if size_bytes:
        marker["payload.bin"] = os.urandom(size_bytes)
    local = f"localhost/dankserve-test-pull:{name}"
    remote = f"{registry}/dankserve-test/{name}:latest"
    import_image(env, local, rootfs_tarball(marker), {LABEL_VLLM_VERSION: "0.33.0"})
    env.podman("push", "--quiet", "--tls-verify=false", local, remote)
    env.podman("rmi", "--force", local)
    return remote


def stand_in_image(env: PodmanEnv) -> str:
    """The faithful vLLM stand-in (containers/, `make fake-vllm-image`), built into the test storage."""
    with building():
        return build_stand_in_image(env)


def stand_in_release(env: PodmanEnv, base: str, version: str, knobs: dict[str, str] | None = None) -> str:
    """Another "release" of the stand-in: `base` with FAKE_VLLM_VERSION (what `vllm --version`, the log
    and the compile cache's key say) and stand-in knobs baked in as image ENV (a smaller KV cache, a
    slower decode, a failing boot); built offline, tagged by its content; its ref."""
    settings = {"FAKE_VLLM_VERSION": version, **(knobs or {})}
    lines = [f"FROM {base}", *(f"ENV {key}={value}" for key, value in sorted(settings.items()))]
    containerfile = "\n".join(lines) + "\n"
    base_id = env.podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    digest = hashlib.sha256((base_id + containerfile).encode()).hexdigest()[:12]
    reference = f"localhost/dankserve-test-release:{version}-{digest}"
    with building():
        if env.podman("image", "exists", reference, check=False).returncode != 0:
            with tempfile.TemporaryDirectory() as context:
                (Path(context) / "Containerfile").write_text(containerfile)
                env.podman("build", "--quiet", "--pull=never", "--network=none", "--tag", reference, context)
    return reference


WRAPPER_ENTRYPOINT = "/usr/local/bin/start-vllm.sh"
"""The wrapper image's entrypoint: a script that does something of its own, then runs `vllm serve`."""


def wrapper_entrypoint_image(env: PodmanEnv, base: str) -> str:
    """`base` (the stand-in) with a wrapper script as its entrypoint, as images that prepare something before vLLM
    have (`launcher = "auto"` must not bypass it); built offline, tagged by its content; its ref."""
    script = '#!/bin/sh\necho "start-vllm.sh: preparing" >&2\nexec vllm serve "$@"\n'
    containerfile = f'FROM {base}\nCOPY start-vllm.sh {WRAPPER_ENTRYPOINT}\nENTRYPOINT ["{WRAPPER_ENTRYPOINT}"]\n'
    base_id = env.podman("image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    digest = hashlib.sha256((base_id + containerfile + script).encode()).hexdigest()[:12]
    reference = f"localhost/dankserve-test-wrapper:{digest}"
    with building():
        if env.podman("image", "exists", reference, check=False).returncode != 0:
            with tempfile.TemporaryDirectory() as context:
                (Path(context) / "Containerfile").write_text(containerfile)
                (Path(context) / "start-vllm.sh").write_text(script)
                (Path(context) / "start-vllm.sh").chmod(0o755)  # COPY keeps the mode: no RUN step
                env.podman("build", "--quiet", "--pull=never", "--network=none", "--tag", reference, context)
    return reference
