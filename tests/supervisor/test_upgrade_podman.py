"""`dankserve upgrade` and `rollback` in a real daemon on the real Podman service: two "releases" of the
stand-in (different vLLM versions) and releases that shrink the KV cache, decode slower or fail to boot,
each ending switched or rolled back, with every request sent through the gateway meanwhile answered."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from dankserve.runtime.base import workload_name
from dankserve.supervisor.upgrade.edge import trial_name
from tests.harness.daemon import MODEL_FACTS, RunningDaemon, free_port, running_daemon, write_host
from tests.harness.faults import ContainerWatch, containers_of
from tests.harness.gpus import StandInGpus
from tests.harness.images import stand_in_release
from tests.harness.podman_service import PodmanEnv
from tests.harness.wait import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.podman]

DECODE = {"FAKE_VLLM_TOKEN_SECONDS": "0.01"}
"""Streamed tokens spaced out, so the fixed request's decode rate can be timed."""


@pytest.fixture(scope="module")
def releases(podman_env: PodmanEnv, vllm_image: str) -> dict[str, str]:
    """The old release (0.33.0), a good new one (0.34.0), and new ones with a regression each."""
    return {
        "old": stand_in_release(podman_env, vllm_image, "0.33.0", DECODE),
        "good": stand_in_release(podman_env, vllm_image, "0.34.0", DECODE),
        # 16384 -> 20480 bytes a token: the same memory holds 20 % fewer tokens
        "smaller": stand_in_release(
            podman_env, vllm_image, "0.34.1", {**DECODE, "FAKE_VLLM_KV_BYTES_PER_TOKEN": "20480"}
        ),
        "slower": stand_in_release(podman_env, vllm_image, "0.34.2", {"FAKE_VLLM_TOKEN_SECONDS": "0.04"}),
        "broken": stand_in_release(podman_env, vllm_image, "0.34.3", {**DECODE, "FAKE_VLLM_FAIL": "oom_load"}),
        "slow": stand_in_release(podman_env, vllm_image, "0.34.9", SLOW_STEPS),
    }


@dataclass(frozen=True)
class Rig:
    name: str
    podman_env: PodmanEnv
    gpus: StandInGpus


@pytest.fixture
def rig(podman_env: PodmanEnv, gpus: StandInGpus, deployment: str) -> Iterator[Rig]:
    """The test's deployment on the Podman service; its trial server's container is removed afterwards too."""
    yield Rig(deployment, podman_env, gpus)
    podman_env.podman("rm", "-f", "-t", "0", workload_name(trial_name(deployment)), check=False)


@dataclass
class Traffic:
    """Requests sent through the gateway in a loop while an upgrade runs; every answer kept."""

    url: str
    model: str
    answers: list[tuple[int, str | None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        def loop() -> None:
            with httpx.Client(timeout=200) as client:
                while not self._stop.is_set():
                    try:
                        reply = client.post(self.url, json={"model": self.model, "prompt": "hi", "max_tokens": 4})
                    except httpx.HTTPError as exc:  # a dropped connection is a request not accounted for
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                        continue
                    self.answers.append((reply.status_code, reply.headers.get("retry-after")))

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(240)

    def check_accounted(self) -> None:
        """Each request completed or got a 503 with Retry-After; none was dropped."""
        assert not self.errors, self.errors
        assert self.answers, "no request was answered"
        odd = [(code, retry) for code, retry in self.answers if code != 200 and not (code == 503 and retry)]
        assert not odd, odd


def _deployment(image: str, *, swap: bool) -> dict[str, Any]:
    dep: dict[str, Any] = {
        "model": "test/tiny",
        "served_model_name": "tiny",
        "image": image,
        "pull": "never",
        "port": free_port(),
        "gpus": [0],
        "env": {"FAKE_VLLM_TIME_SCALE": "0.02"},
        "model_facts": MODEL_FACTS,
    }
    if swap:
        dep["swap_group"] = "g"
    return dep


def _daemon(tmp_path: Path, rig: Rig, image: str, *, swap: bool) -> Any:
    gateway = free_port()
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in rig.gpus.gpus])
    globals_ = {"podman_url": rig.podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    deployments = {rig.name: _deployment(image, swap=swap)}
    daemon = running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_)
    return daemon, f"http://127.0.0.1:{gateway}/v1/completions"


def _upgrade(daemon: RunningDaemon, name: str, url: str, image: str) -> tuple[Any, Traffic]:
    daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
    traffic = Traffic(url, "tiny")
    traffic.start()
    done = daemon.cli("upgrade", name, "--image", image, "--timeout", "400", timeout=420)
    traffic.stop()
    return done, traffic


def _steps(daemon: RunningDaemon) -> list[str]:
    return [e["step"] for e in daemon.events_named("upgrade_step")]


def _serving(podman_env: PodmanEnv, name: str) -> list[str]:
    """The ids of the containers under the deployment's own name (a handed-over trial keeps its labels)."""
    found = podman_env.podman("ps", "-a", "--no-trunc", "-q", "--filter", f"name=^{workload_name(name)}$")
    return found.stdout.split()


def _handed_over(daemon: RunningDaemon, podman_env: PodmanEnv, name: str, boots: int) -> None:
    """Issue 40: after the switch the trial's container is the one serving: the same container id, no second
    boot (boots unchanged, no `started` after the switch), adopted through the lifecycle."""
    (moved,) = [e for e in daemon.events_named("handover_socket") if e.get("deployment") == name]
    assert _serving(podman_env, name) == [moved["container_id"]]
    assert daemon.deployment(name)["boots"] == boots  # type: ignore[index]
    assert not _events_between(daemon, "started", name, "switching", "no such step"), "a second boot"
    assert [e for e in daemon.events_named("adopting") if e.get("deployment") == name]


def _trial_gone(podman_env: PodmanEnv, name: str) -> bool:
    return podman_env.podman("ps", "-aq", "--filter", f"name=^{workload_name(trial_name(name))}$").stdout.strip() == ""


def test_a_new_release_no_worse_is_switched_to_and_rolled_back_by_hand(
    tmp_path: Path, rig: Rig, releases: dict[str, str]
) -> None:
    """0.33.0 -> 0.34.0 in a swap group: the old server sleeps at level 1, the new one passes its checks and
    serves; the gateway's requests meanwhile all complete or get 503 with Retry-After; `rollback` boots
    0.33.0 again, the record surviving in state.json."""
    name, podman_env = rig.name, rig.podman_env
    daemon_cm, url = _daemon(tmp_path, rig, releases["old"], swap=True)
    with daemon_cm as daemon:
        first = daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
        done, traffic = _upgrade(daemon, name, url, releases["good"])
        assert done.returncode == 0, done.stdout + done.stderr
        assert "now runs" in done.stdout and "greedy ids equal" in done.stdout
        # issue 40: it returns once the deployment serves on the new image, the trial server handed over
        assert f"{name}: ready, serving {releases['good']} at " in done.stdout, done.stdout
        assert "the trial server handed over: no second boot" in done.stdout, done.stdout
        # The re-plan names what 0.34 changes (issue 42): the release, its own KV sizing on the first boot (the
        # learned bytes are per release), the kept kernels moving to 0.34.0's directory.
        assert "the plan for the new release changed:" in done.stdout
        assert "vLLM 0.33.0 -> 0.34.0" in done.stdout
        assert "kept kernels /root/.cache/vllm/kernels/0.33.0 -> /root/.cache/vllm/kernels/0.34.0" in done.stdout
        assert _steps(daemon)[:7] == [
            "pulling",
            "reading_version",
            "replanning",
            "making_room",
            "booting",
            "checking",
            "switching",
        ]
        ready = daemon.wait_for(name, lambda d: d["state"] == "ready" and d["vllm_version"] == "0.34.0", timeout=180)
        _handed_over(daemon, podman_env, name, first["boots"])
        assert ready["upgrade"]["step"] == "switched" and ready["upgrade"]["room"] in ("1", "stop")
        assert "vLLM 0.33.0 -> 0.34.0" in ready["upgrade"]["report"]["plan_changes"]
        assert ready["image"] == releases["good"]
        assert _trial_gone(podman_env, name)
        traffic.check_accounted()

        # The switched image is a fact of state.json, not of the settings: a reload of the same file keeps it.
        boots = daemon.deployment(name)["boots"]
        kept = daemon.cli("reload")
        assert kept.returncode == 0 and f"{name}: keeps running" in kept.stdout, kept.stdout + kept.stderr
        said = daemon.deployment(name)
        assert said is not None and said["image"] == releases["good"] and said["boots"] == boots, said

        back = daemon.cli("rollback", name, "--timeout", "180", timeout=200)
        assert back.returncode == 0, back.stdout + back.stderr
        # issue 39.7: "ready, serving" is said of the rollback's own boot, never of the server it replaces
        said = daemon.deployment(name)
        assert said is not None and said["boots"] > boots and said["image"] == releases["old"], said
        assert f"{name}: ready, serving at " in back.stdout, back.stdout
        again = daemon.wait_for(name, lambda d: d["state"] == "ready" and d["vllm_version"] == "0.33.0", timeout=180)
        assert again["upgrade"]["step"] == "rolled_back" and again["image"] == releases["old"]
        # warm: 0.33.0's snapshot was kept as NAME@previous while 0.34.0 ran, and the rollback restores it (issue 41)
        assert (again["last_boot"] or {}).get("kind") == "restore", again["last_boot"]
        assert again["snapshot"]["last_failure"] is None or "digest" not in again["snapshot"]["last_failure"]


@pytest.mark.parametrize(
    "case",
    [("smaller", True, "KV cache shrank"), ("slower", False, "slower"), ("broken", False, "did not boot")],
    ids=["smaller-kv", "slower-decode", "fails-to-boot"],
)
def test_a_regressing_release_is_rolled_back_and_the_old_server_serves(
    tmp_path: Path, rig: Rig, releases: dict[str, str], case: tuple[str, bool, str]
) -> None:
    """A smaller KV cache (the old asleep at level 1: woken), a slower decode or a failed boot (the old
    stopped: booted again): exit 5 naming the regression, the old release serves, no trial left, every
    gateway request accounted for."""
    release, swap, words = case
    name, podman_env = rig.name, rig.podman_env
    daemon_cm, url = _daemon(tmp_path, rig, releases["old"], swap=swap)
    with daemon_cm as daemon:
        done, traffic = _upgrade(daemon, name, url, releases[release])
        assert done.returncode == 5, done.stdout + done.stderr
        assert words in done.stderr
        ready = daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=120)
        assert ready["vllm_version"] == "0.33.0" and ready["upgrade"]["step"] == "rolled_back"
        assert "rolling_back" in _steps(daemon)
        assert _trial_gone(podman_env, name)
        traffic.check_accounted()


SLOW_STEPS = {**DECODE, "FAKE_VLLM_BOOT_SECONDS": "8", "FAKE_VLLM_SLEEP_SECONDS": "2"}
"""A new release slow to boot, over a sleep that takes its time: each step lasts long enough to be hit."""


def _wait_for_step(daemon: RunningDaemon, step: str, timeout: float = 240) -> None:
    wait_until(
        lambda: step in _steps(daemon),
        timeout,
        what=lambda: f"step {step}; steps {_steps(daemon)}\n{daemon.log_tail()}",
    )


@pytest.mark.parametrize("step", ["pulling", "making_room", "booting", "checking", "switching"])
def test_a_daemon_killed_at_any_step_leaves_what_the_next_one_finishes_or_undoes(
    tmp_path: Path, rig: Rig, releases: dict[str, str], step: str
) -> None:
    """kill -9 of the daemon during each step: the next daemon removes the trial server before any boot,
    ends the upgrade switched (a switch under way) or rolled back, and serves; at no time two containers
    of the deployment beside the trial, at the end one container and no trial."""
    name, podman_env = rig.name, rig.podman_env
    daemon_cm, _ = _daemon(tmp_path, rig, releases["old"], swap=True)
    with daemon_cm as daemon, ContainerWatch(podman_env, (name, trial_name(name))) as watch:
        daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
        started = daemon.cli("upgrade", name, "--image", releases["slow"], "--timeout", "1", timeout=60)
        assert started.returncode in (0, 5, 6), started.stderr
        _wait_for_step(daemon, step)
        daemon.kill()
        daemon.start()
        ready = daemon.wait_for(
            name, lambda d: d["state"] == "ready" and d["upgrade"]["step"] in ("switched", "rolled_back"), timeout=240
        )
        expected = "0.34.9" if ready["upgrade"]["step"] == "switched" else "0.33.0"
        assert ready["vllm_version"] == expected
        if step in ("pulling", "making_room", "booting"):  # (checking may have become switching by the kill)
            assert ready["upgrade"]["step"] == "rolled_back"
            assert daemon.events_named("upgrade_recovering")
        assert _trial_gone(podman_env, name)
        # one container serves: the deployment's own, or the trial handed over (which keeps its labels)
        assert len(containers_of(podman_env, name)) + len(containers_of(podman_env, trial_name(name))) == 1
        assert len(_serving(podman_env, name)) == 1
    assert not [b for b in watch.breaches if trial_name(name) not in b], watch.breaches


def test_auto_update_local_upgrades_only_when_the_local_image_changed(
    tmp_path: Path, rig: Rig, releases: dict[str, str]
) -> None:
    """auto_update = "local": `upgrade --auto` finds the image up to date (nothing restarts); once the
    reference names a newer local build it is tried and switched to."""
    name, podman_env = rig.name, rig.podman_env
    moving = f"localhost/dankserve-test-moving:{podman_env.session}"
    podman_env.podman("tag", releases["old"], moving)
    try:
        gateway = free_port()
        host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in rig.gpus.gpus])
        globals_ = {
            "podman_url": podman_env.url,
            "gateway": {"listen": f"127.0.0.1:{gateway}"},
            "upgrade": {"auto_update": "local"},
        }
        deployments = {name: _deployment(moving, swap=True)}
        with running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_) as daemon:
            first = daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
            same = daemon.cli("upgrade", "--auto", "--timeout", "300", timeout=320)
            assert same.returncode == 0 and f"{name}: up to date" in same.stdout, same.stdout + same.stderr
            assert daemon.deployment(name)["boots"] == first["boots"]  # type: ignore[index]
            podman_env.podman("tag", releases["good"], moving)
            newer = daemon.cli("upgrade", "--auto", "--timeout", "300", timeout=320)
            assert newer.returncode == 0 and "now runs" in newer.stdout, newer.stdout + newer.stderr
            daemon.wait_for(name, lambda d: d["state"] == "ready" and d["vllm_version"] == "0.34.0", timeout=180)
            assert _trial_gone(podman_env, name)
    finally:
        podman_env.podman("rmi", moving, check=False)


def test_a_release_without_a_planned_flag_is_refused_before_the_old_server_is_touched(
    tmp_path: Path, rig: Rig, releases: dict[str, str]
) -> None:
    """extra_args plans --disable-chunked-prefill, which vLLM 0.26 does not know: the upgrade to an image
    reporting 0.26.0 is refused (exit 2) naming the flag; the old server never stopped serving."""
    name, podman_env = rig.name, rig.podman_env
    older = stand_in_release(podman_env, releases["old"], "0.26.0")
    gateway = free_port()
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in rig.gpus.gpus])
    globals_ = {"podman_url": podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    dep = {**_deployment(releases["old"], swap=False), "extra_args": ["--disable-chunked-prefill"]}
    with running_daemon(tmp_path, {name: dep}, hardware=host, extra_globals=globals_) as daemon:
        daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
        done = daemon.cli("upgrade", name, "--image", older, "--timeout", "300", timeout=320)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--disable-chunked-prefill" in done.stderr and "0.26.0" in done.stderr
        after = daemon.deployment(name)
        assert after is not None and after["state"] == "ready" and after["boots"] == 1
        assert after["upgrade"]["step"] == "refused" and "making_room" not in _steps(daemon)
        assert _trial_gone(podman_env, name)


def _events_between(daemon: RunningDaemon, event: str, name: str, first: str, last: str) -> list[dict[str, Any]]:
    """`event`s of `name` logged after the upgrade's step `first` began and before its step `last` did."""
    seen, out = False, list[dict[str, Any]]()
    for item in daemon.events():
        if item.get("event") == "upgrade_step" and item.get("step") == first:
            seen = True
        elif item.get("event") == "upgrade_step" and item.get("step") == last and seen:
            return out
        elif seen and item.get("event") == event and item.get("deployment") == name:
            out.append(item)
    return out


def _pair(tmp_path: Path, rig: Rig, image: str) -> tuple[Any, str, str]:
    """Two members of swap group g that do not fit on GPU 0 together: NAME (the group's first, awake) and NAME-b."""
    other = f"{rig.name}-b"
    gateway = free_port()
    host = write_host(tmp_path / "host.json", uuids=[g.uuid for g in rig.gpus.gpus])
    globals_ = {"podman_url": rig.podman_env.url, "gateway": {"listen": f"127.0.0.1:{gateway}"}}
    deployments = {
        rig.name: {**_deployment(image, swap=True), "gpu_memory_utilization": 0.9},
        other: {**_deployment(image, swap=True), "served_model_name": "other", "gpu_memory_utilization": 0.9},
    }
    daemon = running_daemon(tmp_path, deployments, hardware=host, extra_globals=globals_)
    return daemon, other, f"http://127.0.0.1:{gateway}/v1/completions"


def _in_thread(run: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
    thread.start()
    return thread, out


def test_the_other_member_of_a_swap_group_is_not_woken_onto_the_gpu_the_trial_holds(
    tmp_path: Path, rig: Rig, releases: dict[str, str], podman_env: PodmanEnv
) -> None:
    """Issue 40: a two-member swap group, NAME upgraded: a request for the other member through the gateway and
    `dankserve wake` of it while the trial boots and is checked do not wake it onto the GPU the trial holds (it
    stays asleep, no `swap_wake`); once the upgrade ends its wake is served and the request answered."""
    name = rig.name
    daemon_cm, other, url = _pair(tmp_path, rig, releases["old"])
    try:
        with daemon_cm as daemon:
            daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
            daemon.wait_for(other, lambda d: d["state"] == "asleep", timeout=180)
            upgrade, upgraded = _in_thread(
                lambda: daemon.cli("upgrade", name, "--image", releases["slow"], "--timeout", "400", timeout=420)
            )
            _wait_for_step(daemon, "booting")

            def ask() -> int:
                with httpx.Client(timeout=400) as client:
                    body = {"model": "other", "prompt": "hi", "max_tokens": 4}
                    return client.post(url, json=body).status_code

            asked, answered = _in_thread(ask)
            woken, woke = _in_thread(lambda: daemon.cli("wake", other, timeout=400))
            while upgrade.is_alive() and "switching" not in _steps(daemon):
                now = daemon.deployment(other)
                assert now is not None and now["state"] == "asleep", "woken onto the trial's GPU"
                upgrade.join(0.2)
            upgrade.join(420)
            assert upgraded and upgraded[0].returncode == 0, upgraded[0].stdout + upgraded[0].stderr
            assert not _events_between(daemon, "swap_wake", other, "booting", "switching")
            assert daemon.events_named("upgrade_hold") and daemon.events_named("upgrade_release")
            asked.join(400)
            woken.join(400)
            assert answered in ([200], [503]) and woke[0].returncode == 0, woke[0].stdout + woke[0].stderr
    finally:
        podman_env.podman("rm", "-f", "-t", "0", workload_name(other), check=False)


def test_wake_by_hand_during_an_upgrade_is_held_like_the_gateways(
    tmp_path: Path, rig: Rig, releases: dict[str, str]
) -> None:
    """Issue 40: `dankserve wake NAME` while NAME's upgrade tries its new server does not wake the old server
    asleep for the trial (the gateway's wake is held the same way): the upgrade goes on undisturbed and switches,
    and the wake answers once NAME serves on the new release."""
    name = rig.name
    daemon_cm, _ = _daemon(tmp_path, rig, releases["old"], swap=True)
    with daemon_cm as daemon:
        daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
        upgrade, upgraded = _in_thread(
            lambda: daemon.cli("upgrade", name, "--image", releases["slow"], "--timeout", "400", timeout=420)
        )
        _wait_for_step(daemon, "booting")
        woken, woke = _in_thread(lambda: daemon.cli("wake", name, timeout=400))
        upgrade.join(420)
        assert upgraded and upgraded[0].returncode == 0, upgraded[0].stdout + upgraded[0].stderr
        assert [e for e in daemon.events_named("wake_held") if e.get("deployment") == name]
        assert not _events_between(daemon, "swap_wake", name, "booting", "switching")
        assert "rolling_back" not in _steps(daemon)
        woken.join(400)
        assert woke and woke[0].returncode == 0, woke[0].stdout + woke[0].stderr
        ready = daemon.wait_for(name, lambda d: d["state"] == "ready", timeout=180)
        assert ready["vllm_version"] == "0.34.9"
