"""The state directory read-only or full while the daemon supervises; damaged state files at start-up."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from dankserve.state import SCHEMA_VERSION, STATE_FILE, state_to_json
from tests.harness.daemon import RunningDaemon, container_deployment, free_port, running_daemon
from tests.harness.faults import (
    ContainerWatch,
    FaultTally,
    bind_mount,
    cycles,
    fill,
    is_ready,
    read_state,
    ready_after,
    reproduce,
    small_tmpfs,
    tally,
)
from tests.harness.podman_service import PodmanEnv

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]


def restart_container(daemon: RunningDaemon, env: PodmanEnv, name: str) -> dict[str, Any]:
    """Kill the deployment's container and wait until a new one is ready (a change the daemon must record)."""
    boots = daemon.wait_for(name, is_ready, timeout=120)["boots"]
    env.podman("kill", f"dankserve-{name}")
    return daemon.wait_for(name, ready_after(boots), timeout=120)


@contextmanager
def read_only_dir(state_dir: Path) -> Iterator[Callable[[bool], AbstractContextManager[None]]]:
    """The state dir bind-mounted on itself; yields a context that makes it read-only for a while."""
    state_dir.mkdir(mode=0o700, exist_ok=True)
    with bind_mount(state_dir) as set_read_only:

        @contextmanager
        def broken(_: bool) -> Iterator[None]:
            set_read_only(True)
            try:
                yield
            finally:
                set_read_only(False)

        yield broken


@contextmanager
def full_dir(state_dir: Path) -> Iterator[Callable[[bool], AbstractContextManager[None]]]:
    """The state dir on a 1 MiB tmpfs; yields a context that fills it for a while."""
    with small_tmpfs(state_dir, "1m"):

        @contextmanager
        def broken(_: bool) -> Iterator[None]:
            filler = fill(state_dir)
            try:
                yield
            finally:
                filler.unlink()

        yield broken


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_state_dir_read_only_or_full_while_serving(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
    kind: str,
) -> None:
    """With the state dir read-only (a read-only bind mount) or full (a filled tmpfs) the daemon keeps serving and
    restarting, warns, leaves the earlier state file intact, and saves everything once the dir is usable again."""
    name = deployments[0]
    key = "04-state-dir-read-only" if kind == "read-only" else "05-state-dir-full"
    record = FaultTally(
        key,
        "the state dir made read-only (`mount --bind` + `mount -o remount,ro,bind`) while the daemon supervises"
        if kind == "read-only"
        else "the state dir (a 1 MiB tmpfs) filled up while the daemon supervises",
        "a container killed meanwhile is replaced and ready; the daemon logs `state_not_saved`; state.json is "
        "byte-for-byte the one before; once the dir is usable again the next change saves every boot counted "
        "meanwhile",
        reproduce(f"'tests/reliability/test_state_faults.py::test_state_dir_read_only_or_full_while_serving[{kind}]'"),
    )
    state_dir = tmp_path / "state"
    breakage = read_only_dir(state_dir) if kind == "read-only" else full_dir(state_dir)
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with (
        tally(record),
        breakage as broken,
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        daemon.wait_for(name, is_ready, timeout=120)
        for cycle in range(cycles("state_dir_readonly" if kind == "read-only" else "state_dir_full")):
            before = (state_dir / STATE_FILE).read_bytes()
            boots_before = read_state(state_dir).deployment(name).boots
            warned_before = len(daemon.events_named("state_not_saved"))
            with broken(True):
                record.inject(kind)
                try:
                    during = restart_container(daemon, podman_env, name)
                except AssertionError as exc:
                    record.lose(f"cycle {cycle}: no restart while {kind}: {str(exc)[:300]}")
                    break
                unchanged = (state_dir / STATE_FILE).read_bytes() == before
                warned = len(daemon.events_named("state_not_saved")) > warned_before
            after = restart_container(daemon, podman_env, name)  # a change, saved now
            saved = read_state(state_dir).deployment(name)
            if not unchanged:
                record.lose(f"cycle {cycle}: the state file changed while {kind}")
            elif not warned:
                record.lose(f"cycle {cycle}: no state_not_saved warning while {kind}")
            elif (
                during["boots"] != boots_before + 1 or saved.boots != after["boots"] or saved.boots != boots_before + 2
            ):
                record.lose(f"cycle {cycle}: boots {boots_before} -> {during['boots']} -> saved {saved.boots}")
            else:
                record.recover()
        assert daemon.stop() == 0
    assert watch.breaches == []
    record.check()


def _valid_state(name: str) -> str:
    from dankserve.state import DeploymentState, State

    return state_to_json(State(deployments={name: DeploymentState(boots=7, restarts=2)}))


DAMAGE: dict[str, Callable[[str, random.Random], bytes]] = {
    "corrupt (random bytes)": lambda name, rng: bytes(rng.randrange(256) for _ in range(300)),
    "truncated": lambda name, rng: _valid_state(name).encode()[: rng.randrange(1, len(_valid_state(name)) - 1)],
    "deeply nested": lambda name, rng: (
        f'{{"schema_version": {SCHEMA_VERSION}, "deployments": ' + "[" * 100_000 + "]" * 100_000 + "}"
    ).encode(),
    "5,000-digit integer": lambda name, rng: (
        f'{{"schema_version": {SCHEMA_VERSION}, "deployments": {{"{name}": {{"boots": {"9" * 5000}}}}}}}'
    ).encode(),
    "empty": lambda name, rng: b"",
    "wrong types": lambda name, rng: json.dumps(
        {"schema_version": SCHEMA_VERSION, "deployments": {name: {"boots": "seven", "learned_kv": []}}}
    ).encode(),
}


def test_damaged_state_files_are_moved_aside_and_the_daemon_serves(
    *,
    tmp_path: Path,
    podman_env: PodmanEnv,
    vllm_image: str,
    stand_in_host: Path,
    podman_globals: dict[str, Any],
    deployments: list[str],
) -> None:
    """A corrupt, truncated, deeply nested, huge-integer, empty or mistyped state file (written while the daemon
    was down, killed with -9 or stopped) is moved aside with a warning; the daemon starts, serves and writes a
    fresh state file."""
    name = deployments[0]
    rng = random.Random(7)
    record = FaultTally(
        "06-state-file-damage",
        "state.json damaged while the daemon is down (killed with -9 or stopped): corrupt, truncated, "
        "deeply nested, a 5,000-digit integer, empty, wrong types",
        "the next daemon warns (`state_warning`), keeps the damaged file as state.json.corrupt-<time>, adopts or "
        "starts the container, becomes ready and writes a state file that parses",
        reproduce(
            "tests/reliability/test_state_faults.py::test_damaged_state_files_are_moved_aside_and_the_daemon_serves"
        ),
    )
    state_dir = tmp_path / "state"
    dep = container_deployment(vllm_image, free_port(), gpus=[0])
    with (
        tally(record),
        running_daemon(tmp_path, {name: dep}, hardware=stand_in_host, extra_globals=podman_globals) as daemon,
        ContainerWatch(podman_env, (name,)) as watch,
    ):
        daemon.wait_for(name, is_ready, timeout=120)
        for cycle in range(cycles("state_file_damage")):
            for kind, damage in DAMAGE.items():
                how = rng.choice(("killed", "stopped"))
                if how == "killed":
                    daemon.kill()
                else:
                    assert daemon.stop() == 0
                text = damage(name, rng)
                (state_dir / STATE_FILE).write_bytes(text)
                aside_before = set(state_dir.glob(f"{STATE_FILE}.corrupt-*"))
                warned_before = len(daemon.events_named("state_warning"))
                record.inject(kind)
                daemon.start()
                try:
                    daemon.wait_for(name, is_ready, timeout=120)
                except AssertionError as exc:
                    record.lose(f"cycle {cycle}, {kind}: not ready: {str(exc)[:300]}")
                    break
                aside = set(state_dir.glob(f"{STATE_FILE}.corrupt-*")) - aside_before
                if len(aside) != 1 or next(iter(aside)).read_bytes() != text:
                    record.lose(f"cycle {cycle}, {kind}: the damaged file was not kept aside ({aside})")
                elif len(daemon.events_named("state_warning")) <= warned_before:
                    record.lose(f"cycle {cycle}, {kind}: no state_warning")
                else:
                    read_state(state_dir)  # a fresh, valid file
                    record.breakdown[f"daemon {how}"] += 1
                    record.recover()
        assert daemon.stop() == 0
    assert watch.breaches == []
    record.check()


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_a_daemon_started_on_an_unusable_state_dir_exits_3(
    *, tmp_path: Path, stand_in_host: Path, podman_globals: dict[str, Any], deployments: list[str], kind: str
) -> None:
    """A daemon whose state dir is read-only or full when it starts exits 3 naming the dir, without a traceback,
    and changes nothing there."""
    record = FaultTally(
        f"07-state-dir-{kind}-at-start",
        f"the daemon started with its state dir already {kind}",
        "exit 3 (environment) with a message naming the state dir, no traceback; the earlier state file intact",
        reproduce(
            f"'tests/reliability/test_state_faults.py::test_a_daemon_started_on_an_unusable_state_dir_exits_3[{kind}]'"
        ),
    )
    state_dir = tmp_path / "state"
    breakage = read_only_dir(state_dir) if kind == "read-only" else full_dir(state_dir)
    dep = container_deployment("localhost/fake-vllm:latest", free_port(), gpus=[0])
    with tally(record), breakage as broken:
        earlier = _valid_state(deployments[0]).encode()
        (state_dir / STATE_FILE).write_bytes(earlier)
        for _ in range(cycles("state_dir_readonly")):
            with (
                broken(True),
                running_daemon(
                    tmp_path, {deployments[0]: dep}, hardware=stand_in_host, extra_globals=podman_globals
                ) as daemon,
            ):
                record.inject(kind)
                assert daemon.proc is not None
                code = daemon.proc.wait(60)
                tail = daemon.log_tail()
                if code == 3 and str(state_dir) in tail and "Traceback" not in tail:
                    record.recover()
                else:
                    record.lose(f"exit {code}: {tail[-300:]}")
            assert (state_dir / STATE_FILE).read_bytes() == earlier
    record.check()
