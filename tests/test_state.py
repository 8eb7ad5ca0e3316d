"""Tests for dankserve.state: the versioned state file, atomic writes, surviving bad files and disks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dankserve.state import (
    SCHEMA_VERSION,
    BootSummary,
    DeploymentState,
    FailureRecord,
    LearnedKv,
    State,
    StateCorrupt,
    StateStore,
    UnsafeSleep,
    state_from_json,
    state_to_json,
)

GIB = 2**30
LEARNED = LearnedKv(132530194268, (139 * GIB,), 1_764_000_000.0, "0.33.0")


def populated() -> State:
    chat = DeploymentState(
        learned_kv={"kv1-abc": LEARNED},
        boots=3,
        restarts=1,
        last_failure=FailureRecord("oom_load", "Failed to load model - not enough GPU memory.", 1_764_000_100.0),
        last_boot=BootSummary(
            at=1_764_000_200.0,
            ready=True,
            vllm_version="0.33.0",
            compile_cache_hit=True,
            compile_seconds=2.55,
            kv_cache_memory_bytes=132530194268,
            kv_cache_learned_used=True,
        ),
        down=True,
        overrides={"max_model_len": 34480},
        remediated=("max_len_too_large",),
        asleep="1",
        swapping="waking",
        timings={"cold": (41.2,), "warm": (12.0, 11.8), "wake": (0.9,)},
        unsafe_sleep=(UnsafeSleep("1", "0.26.0", "m", "asleep, yet its processes still hold 20 GiB", 1_764_000_300.0),),
        canaries={"kv1-abc": (791, 3681, 13)},
    )
    return State(deployments={"chat": chat, "code": DeploymentState()}, image_versions={"sha256:abc": "0.33.0"})


def test_round_trip() -> None:
    """Every field survives the JSON form, which carries the schema version."""
    text = state_to_json(populated())
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert state_from_json(text) == populated()


def test_an_unknown_sleep_level_loads_as_none() -> None:
    """A sleep level this release does not know is forgotten (the server is asked instead), not a corrupt file."""
    data = json.loads(state_to_json(populated()))
    data["deployments"]["chat"]["asleep"] = "3"
    assert state_from_json(json.dumps(data)).deployment("chat").asleep is None


def test_an_unknown_or_missing_swap_move_loads_as_none() -> None:
    """A move this release does not know, or none (a file from before it was kept), is no move under way."""
    data = json.loads(state_to_json(populated()))
    data["deployments"]["chat"]["swapping"] = "dozing"
    del data["deployments"]["code"]["swapping"]
    loaded = state_from_json(json.dumps(data))
    assert loaded.deployment("chat").swapping is None and loaded.deployment("code").swapping is None


def test_hostile_canaries_and_unsafe_levels_are_bounded_or_refused() -> None:
    """Canary ids that are not integers are dropped, long ones cut; an unsafe level that is not 1 or 2 is damage."""
    data = json.loads(state_to_json(populated()))
    data["deployments"]["chat"]["canaries"] = {"a": [1, "x"], "b": list(range(500)), "c": [True]}
    loaded = state_from_json(json.dumps(data)).deployment("chat")
    assert set(loaded.canaries) == {"b"} and len(loaded.canaries["b"]) == 64
    data["deployments"]["chat"]["unsafe_sleep"] = [{"level": "stop", "model": "m"}]
    with pytest.raises(StateCorrupt, match="unsafe_sleep level"):
        state_from_json(json.dumps(data))


def test_a_file_from_before_the_checks_loads_without_them() -> None:
    """No unsafe_sleep or canaries (an older file): none."""
    data = json.loads(state_to_json(populated()))
    del data["deployments"]["chat"]["unsafe_sleep"], data["deployments"]["chat"]["canaries"]
    loaded = state_from_json(json.dumps(data)).deployment("chat")
    assert loaded.unsafe_sleep == () and loaded.canaries == {}


def test_save_then_load(tmp_path: Path) -> None:
    """What was saved loads back, with no warnings, in a fresh store."""
    store = StateStore(tmp_path / "state")
    assert store.save(populated()) == ()
    assert StateStore(tmp_path / "state").load().state == populated()


def test_modes(tmp_path: Path) -> None:
    """The state file is 0600 in a 0700 directory."""
    store = StateStore(tmp_path / "state")
    store.save(State())
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_missing_file_is_an_empty_state(tmp_path: Path) -> None:
    """A first start (no directory, no file) has an empty state and no warning."""
    result = StateStore(tmp_path / "nothing-yet").load()
    assert result.state == State() and result.warnings == ()


def test_down_stays_down_across_restarts(tmp_path: Path) -> None:
    """A deployment taken down is still down when a new daemon loads the state."""
    store = StateStore(tmp_path)
    store.save(State().update("chat", lambda dep: DeploymentState(down=True)))
    assert StateStore(tmp_path).load().state.deployment("chat").down


def test_leftover_temp_file_is_removed(tmp_path: Path) -> None:
    """A temp file left by a write interrupted by a crash is cleaned up; the state is untouched."""
    store = StateStore(tmp_path)
    store.save(populated())
    leftover = tmp_path / ".state.json.x1y2.tmp"
    leftover.write_text('{"schema_version": 1, "dep')
    assert store.load().state == populated()
    assert not leftover.exists()


BAD_FILES = [
    ("empty", ""),
    ("truncated", state_to_json(populated())[:57]),
    ("not an object", "[1, 2]"),
    ("no schema", json.dumps({"deployments": {}})),
    ("wrong types", json.dumps({"schema_version": 1, "deployments": {"chat": {"boots": "three"}}})),
    ("bad learned entry", json.dumps({"schema_version": 1, "deployments": {"chat": {"learned_kv": {"f": {}}}}})),
    ("nested deeply", '{"schema_version": 1, "deployments": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    ("nested too deep to be a state", '{"schema_version": 1, "x": ' + "[" * 40 + "]" * 40 + "}"),
    ("5,000-digit integer", '{"schema_version": 1, "deployments": {"chat": {"boots": ' + "9" * 5000 + "}}}"),
    ("100-digit integer", '{"schema_version": 1, "deployments": {"chat": {"boots": ' + "9" * 100 + "}}}"),
    ("huge float", '{"schema_version": 1, "deployments": {"chat": {"last_failure": {"cause": "c", "at": 1e999}}}}'),
    ("binary", "\udcff"),
]


@pytest.mark.parametrize(("_name", "text"), BAD_FILES, ids=[name for name, _ in BAD_FILES])
def test_unusable_file_moved_aside(tmp_path: Path, _name: str, text: str) -> None:
    """An unusable state file is moved to state.json.corrupt-<time> with a warning; the state starts empty."""
    store = StateStore(tmp_path, clock=lambda: 1_764_000_000.0)
    store.path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
    result = store.load()
    assert result.state == State()
    assert len(result.warnings) == 1 and "moved it to" in result.warnings[0]
    aside = tmp_path / "state.json.corrupt-20251124T160000Z"
    assert aside.read_bytes() == text.encode("utf-8", errors="surrogateescape")
    assert not store.path.exists()
    assert store.save(State()) == ()  # and the daemon carries on


def test_a_looking_load_moves_nothing(tmp_path: Path) -> None:
    """A load without repair (status without a daemon) leaves a damaged file where it is and says so."""
    store = StateStore(tmp_path)
    store.path.write_text("{")
    result = store.load(repair=False)
    assert result.state == State() and "the daemon moves it aside" in result.warnings[0]
    assert store.path.read_text() == "{"


@pytest.mark.parametrize("repair", [True, False])
def test_a_newer_schema_is_left_untouched(tmp_path: Path, repair: bool) -> None:
    """A state file a newer dankserve wrote is never moved aside: the load says who wrote it."""
    text = json.dumps({"schema_version": SCHEMA_VERSION + 1, "deployments": {"chat": {"down": True}}})
    store = StateStore(tmp_path)
    store.path.write_text(text)
    result = store.load(repair=repair)
    assert result.newer is not None and result.newer.version == SCHEMA_VERSION + 1
    assert "written by a newer dankserve" in result.warnings[0]
    assert store.path.read_text() == text and not list(tmp_path.glob("state.json.corrupt-*"))


def test_second_corrupt_file_same_second(tmp_path: Path) -> None:
    """Two corrupt files moved aside in the same second both survive."""
    store = StateStore(tmp_path, clock=lambda: 0.0)
    for _ in range(2):
        store.path.write_text("{")
        store.load()
    assert len(list(tmp_path.glob("state.json.corrupt-*"))) == 2


@pytest.mark.parametrize(("_name", "text"), BAD_FILES[:-1], ids=[name for name, _ in BAD_FILES[:-1]])
def test_parse_errors_name_the_problem(_name: str, text: str) -> None:
    """The pure parser raises StateCorrupt with a reason for each bad form."""
    with pytest.raises(StateCorrupt) as info:
        state_from_json(text)
    assert str(info.value)


def test_remember_keeps_first_and_forget() -> None:
    """Learned bytes per fingerprint keep the first value; forget drops them."""
    later = LearnedKv(1, (1,), 2.0, "0.33.0")
    dep = DeploymentState().remember("kv1-a", LEARNED).remember("kv1-a", later)
    assert dep.learned("kv1-a") == LEARNED
    assert dep.forget("kv1-a").learned("kv1-a") is None


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted in tmp_path (root only), unmounted afterwards."""
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_read_only_disk_keeps_old_file(small_tmpfs: Path) -> None:
    """On a read-only file system save warns, changes nothing, and the earlier state still loads."""
    store = StateStore(small_tmpfs / "state")
    assert store.save(populated()) == ()
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    warnings = store.save(State())
    assert len(warnings) == 1 and "read-only" in warnings[0]
    assert StateStore(small_tmpfs / "state").load().state == populated()


def test_full_disk_keeps_old_file(small_tmpfs: Path) -> None:
    """On a full disk save warns, leaves no temp file, and the earlier state still loads."""
    store = StateStore(small_tmpfs / "state")
    assert store.save(populated()) == ()
    fd = os.open(small_tmpfs / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    big = State(image_versions={f"sha256:{i:064d}": "0.33.0" for i in range(400)})
    warnings = store.save(big)
    assert len(warnings) == 1 and "full" in warnings[0]
    assert list((small_tmpfs / "state").glob(".state.json.*")) == []
    assert StateStore(small_tmpfs / "state").load().state == populated()


def test_an_upgrade_record_round_trips_and_an_old_file_without_one_reads() -> None:
    """The upgrade record survives state.json; a file without the key has none (schema 1 kept)."""
    from dankserve.state import DeploymentState, State, UpgradeRecord, state_from_json, state_to_json

    record = UpgradeRecord("booting", "img:old", "img:new", 1.0, "0.26.0", "0.27.0", "1", "w", None, {"a": 1})
    state = State(deployments={"chat": DeploymentState(upgrade=record)})
    assert state_from_json(state_to_json(state)).deployment("chat").upgrade == record
    old = '{"schema_version": 1, "deployments": {"chat": {"boots": 1}}}'
    assert state_from_json(old).deployment("chat").upgrade is None


def test_a_damaged_upgrade_record_is_corrupt_state() -> None:
    """An unknown step is damage, named."""
    import pytest

    from dankserve.state import StateCorrupt, state_from_json

    upgrade = '{"step": "x", "old_image": "a", "new_image": "b"}'
    text = '{"schema_version": 1, "deployments": {"chat": {"upgrade": ' + upgrade + "}}}"
    with pytest.raises(StateCorrupt, match="not an upgrade record"):
        state_from_json(text)
