"""Shared fixtures. Harness fixtures for real services live in tests/harness/.

Real Podman: `podman_env` (a private `podman system service`, session-wide) with stand-in GPUs
and a local registry; `vllm_image` is the image the tests run as vLLM. Any test that uses
`podman_env`, directly or through another fixture, is marked `podman` automatically, so
`pytest -m 'not podman'` runs without Podman. At the end of the session no container of the
session may remain: the check fails the run (after removing them) if one does.

The fault-injection suite (tests/reliability, marker `reliability`) runs only when asked for
with `-m reliability` (`make reliability`): every other run deselects it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dankserve.runtime.base import LABEL_BOOT, LABEL_FINGERPRINT, WorkloadSpec, workload_name
from dankserve.testing.hub import StandInHub
from tests.harness.gpus import StandInGpus, stand_in_gpus
from tests.harness.hub import hub_env, populate
from tests.harness.pids import roomy_pid_space, set_subreaper
from tests.harness.podman_service import (
    SESSION_LABEL,
    PodmanEnv,
    leftover_containers,
    leftover_secrets,
    missing_requirements,
    podman_service,
    remove_containers,
    remove_images_from,
)
from tests.harness.registry import free_loopback_port, local_registry
from tests.harness.wait import WaitTimeout, wait_until

if TYPE_CHECKING:  # importing the runtime pulls in podman-py
    from dankserve.runtime.podman import PodmanRuntime


# No test may reach the real Hugging Face Hub: a closed loopback port unless a test points
# HF_ENDPOINT at the stand-in Hub (the `hub` fixture). Set here so daemons the tests start inherit it.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


_SHORT_BASETEMP = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test`), a short base temp dir of the run's own.

    The workers' temp dirs sit one level deeper (`popen-gwN/`), and a daemon's state dir under a
    test's tmp_path must leave room for its backends' unix sockets (107 bytes at most), so the
    default `/tmp/pytest-of-USER/pytest-N` is replaced by `/tmp/dsXXXXXXXX`; it is removed after a
    run that passed and kept, for reading, after one that failed.
    """
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker is not None:  # an xdist worker starts with COLUMNS=80; the CLI's tables must see the run's own
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
            if worker.get(f"dankserve_{name}") is not None:
                os.environ[name] = worker[f"dankserve_{name}"]
    if worker is None:
        roomy_pid_space()
    # A suite started in the background by a non-interactive shell (`make test &`) inherits SIGINT and SIGQUIT
    # ignored (POSIX), and so would every child: the tests that press Ctrl-C on a command would see it ignored.
    for sig in (signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if getattr(config.option, "numprocesses", None) and config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="ds", dir="/tmp")
        config.stash[_SHORT_BASETEMP] = config.option.basetemp


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """(pytest-xdist) Hand each worker this run's COLUMNS and LINES, or their absence."""
    for name in ("COLUMNS", "LINES"):
        node.workerinput[f"dankserve_{name}"] = os.environ.get(name)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    short = session.config.stash.get(_SHORT_BASETEMP, None)
    if short is not None and exitstatus == 0:
        shutil.rmtree(short, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark tests using the Podman harness `podman`; skip `gpu` tests where NVML cannot be used;
    deselect the `reliability` suite unless the marker expression names it (`make reliability`)."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "podman_env" in fixtures:
            item.add_marker(pytest.mark.podman)
        if "journald" in fixtures or item.get_closest_marker("journald") is not None:
            # A standalone journald (where none runs) is machine-wide: one pytest-xdist worker owns it.
            item.add_marker(pytest.mark.xdist_group("journald"))
    if "reliability" not in (config.getoption("markexpr", "") or ""):
        kept = [item for item in items if item.get_closest_marker("reliability") is None]
        if len(kept) != len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in kept])
            items[:] = kept
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    from tests.harness.gpus import nvml_unusable_reason

    reason = nvml_unusable_reason()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"needs a GPU: {reason}"))


@pytest.fixture(autouse=True)
def _umask_restored() -> Iterator[None]:
    """Each test starts under the session's umask: commands run in-process (`run`, `up`) set the daemon's
    private umask for the whole process, and a test after them would otherwise create files 0600."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


@pytest.fixture(autouse=True)
def _not_a_subreaper() -> Iterator[None]:
    """Each test ends with this worker no child subreaper: a ProcessRuntime made in-process makes it one (its
    servers' orphans come to it, processes.py "Orphans"), and a worker left so would collect every later test's
    orphans as zombies nobody reaps, their pids never free."""
    yield
    set_subreaper(False)


def _require_harness() -> None:
    missing = missing_requirements()
    if missing:
        pytest.skip(f"real-Podman harness unavailable here: missing {', '.join(missing)} (run `make test` as root)")


@pytest.fixture(scope="session")
def harness_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harness")


@pytest.fixture(scope="session")
def gpus(harness_dir: Path) -> Iterator[StandInGpus]:
    """Two stand-in GPUs: device nodes in a private directory and a uniquely named CDI spec."""
    _require_harness()
    with stand_in_gpus(harness_dir / "gpus", count=2) as made:
        yield made


@pytest.fixture(scope="session")
def registry(harness_dir: Path) -> Iterator[str]:
    """A local plain-HTTP registry: `127.0.0.1:PORT`."""
    _require_harness()
    with local_registry(harness_dir / "registry") as address:
        yield address


@pytest.fixture(scope="session")
def podman_env(harness_dir: Path, gpus: StandInGpus, registry: str) -> Iterator[PodmanEnv]:
    """The private Podman service (started after the CDI spec, so it sees it); checked for leaks at the end."""
    _require_harness()
    with podman_service(harness_dir / "podman", insecure_registries=[registry]) as env:
        yield env
        leaked = leftover_containers(env, [f"{SESSION_LABEL}={env.session}"]) + _leaked_probes(env)
        secrets = leftover_secrets(env, workload_name(f"t{env.session}"))
        remove_containers(env, leaked)
        remove_images_from(env, registry)
        for name in secrets:
            env.podman("secret", "rm", name, check=False)
        if leaked or secrets:
            pytest.fail(f"the tests left containers {leaked} and secrets {secrets} behind (now removed)")


def _leaked_probes(env: PodmanEnv) -> list[str]:
    """Version-probe containers still there a while after this session's tests ended.

    They carry no session label; under pytest-xdist another worker's probe may be in flight right
    now (it removes itself within seconds), so only the ones that stay count as leaked.
    """
    seen = leftover_containers(env, ["io.dankserve.probe"])
    if not seen:
        return []
    try:
        wait_until(
            lambda: not set(seen) & set(leftover_containers(env, ["io.dankserve.probe"])),
            timeout=30,
            interval=0.5,
            what=f"the version probes {seen} to go",
        )
    except WaitTimeout:
        return sorted(set(seen) & set(leftover_containers(env, ["io.dankserve.probe"])))
    return []


@pytest.fixture(scope="session")
def vllm_image(podman_env: PodmanEnv) -> str:
    """The image the tests run as vLLM: the stand-in of containers/ (`make fake-vllm-image`)."""
    from tests.harness.images import stand_in_image

    return stand_in_image(podman_env)


@pytest.fixture(scope="session")
def busybox_image(podman_env: PodmanEnv) -> str:
    """The busybox imitation, always (it can ignore SIGTERM; no version label)."""
    from tests.harness.images import busybox_vllm_image

    return busybox_vllm_image(podman_env, version_label=False)


@pytest.fixture
def deployment(podman_env: PodmanEnv, request: pytest.FixtureRequest) -> Iterator[str]:
    """A deployment name unique to this test and session; its container and secrets are removed after."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:32].strip("-")
    name = f"t{podman_env.session}-{slug}"
    yield name
    podman_env.podman("rm", "-f", "-t", "0", workload_name(name), check=False)
    for secret in leftover_secrets(podman_env, workload_name(name) + "."):
        podman_env.podman("secret", "rm", secret, check=False)


@pytest.fixture
def podman_runtime(podman_env: PodmanEnv, gpus: StandInGpus, tmp_path: Path) -> Iterator[PodmanRuntime]:
    """A PodmanRuntime on the private service; device nodes from the stand-in GPUs; no journal."""
    from dankserve.runtime.podman import PodmanRuntime

    runtime = PodmanRuntime(
        podman_env.url,
        cache_dir=tmp_path / "cache",
        dev_root=gpus.dev_dir,
        journal_socket=tmp_path / "no-journal.socket",
    )
    yield runtime
    runtime.close()


@pytest.fixture
def make_spec(podman_env: PodmanEnv, deployment: str, vllm_image: str) -> Callable[..., WorkloadSpec]:
    """Build a WorkloadSpec for this test's deployment: a free port, quick boot, session labels."""

    def build(**overrides: Any) -> WorkloadSpec:
        fields: dict[str, Any] = {
            "deployment": deployment,
            "image": vllm_image,
            "argv": ("test/model", "--port", "8000"),
            "env": {"FAKE_VLLM_BOOT_SECONDS": "0"},
            "port": free_loopback_port(),
            "labels": {SESSION_LABEL: podman_env.session, LABEL_FINGERPRINT: "fp-1", LABEL_BOOT: "1"},
        }
        fields.update(overrides)
        return WorkloadSpec(**fields)

    return build


@pytest.fixture(scope="session")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    """A stand-in Hugging Face Hub on loopback with the tests' models (tests/harness/hub.py)."""
    server = populate(StandInHub(tmp_path_factory.mktemp("stand-in-hub")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def hub_environment(hub: StandInHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """HF_ENDPOINT at the stand-in Hub; a fresh state dir and HF cache for this test."""
    env = hub_env(hub, tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    return env
