"""The daemon's persistent state: one versioned JSON file under `state_dir`.

Pure part: `State` and `DeploymentState` (frozen), `state_to_json()` / `state_from_json()`.
I/O part: `StateStore`, which writes atomically (a temp file in the same directory, fsync,
rename, fsync of the directory; the file 0600 in a 0700 directory) and never lets the state
file stop the daemon: a corrupt, truncated, empty or future-schema file is moved aside as
`state.json.corrupt-<UTC time>` with a warning; a failed write (read-only or full disk) is a
warning, the caller keeps its in-memory state and the previous file stays intact.

File form (schema 1)::

    {"schema_version": 1,
     "deployments": {"chat": {"learned_kv": {"kv1-…": {LearnedKv}}, "boots": 3, "restarts": 1,
                              "last_failure": {"cause", "message", "at"} | null,
                              "last_boot": {BootSummary} | null, "down": false,
                              "overrides": {"max_model_len": 34480}, "remediated": ["max_len_too_large"],
                              "asleep": "1" | "2" | "stop" | null,
                              "swapping": "falling_asleep" | "waking" | null,
                              "timings": {"cold": [41.2], "warm": [12.0, 11.8], "wake": [0.9]},
                              "unsafe_sleep": [{"level": "1", "vllm_version": "0.26.0", "model": "m",
                                                "reason": "...", "at": 1764680000.0}],
                              "canaries": {"kv1-…": [791, 3681, 13]},
                              "upgrade": {UpgradeRecord} | null}},
     "image_versions": {"sha256:…": "0.33.0"}}
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATE_FILE = "state.json"

TIMING_KINDS: tuple[str, ...] = ("cold", "warm", "wake", "sleep")
"""`cold`: a boot without compile cache; `warm`: any faster boot (compile cache, learned KV bytes,
the launcher); `wake`: a swap group member woken (at its level, a boot for `stop`); `sleep`: one
put to sleep (an awake member's sleep comes before another's wake)."""

KEPT = 10
"""Timings kept per kind (the oldest go first)."""


def timings_json(timings: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    return {kind: list(values) for kind, values in sorted(timings.items()) if values}


def timings_from_json(data: Any) -> dict[str, tuple[float, ...]]:
    """What state.json holds (unknown kinds and values that are no non-negative numbers are dropped)."""
    if not isinstance(data, dict):
        return {}
    out: dict[str, tuple[float, ...]] = {}
    for kind, values in data.items():
        if kind not in TIMING_KINDS or not isinstance(values, list):
            continue
        kept = tuple(
            float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e7
        )
        if kept:
            out[kind] = kept[-KEPT:]
    return out


class StateCorrupt(ValueError):
    """The state file's text is not a state of this schema (the reason is the message)."""


class StateFromNewerRelease(ValueError):
    """The state file was written by a newer dankserve (a schema this one does not know).

    Never moved aside: it is the newer release's, and holds its `down` flags and learned sizes."""

    def __init__(self, version: int) -> None:
        super().__init__(f"written by a newer dankserve (schema_version {version}; this one reads {SCHEMA_VERSION})")
        self.version = version


MAX_DEPTH = 16
"""The deepest nesting a state file of this schema has (a few levels); deeper is damage."""
MAX_INT = 2**63
"""Every count, byte size and time in the state fits in 64 bits; a larger number is damage."""


def _check_shape(value: Any, depth: int = 0) -> None:
    """StateCorrupt when the parsed JSON nests deeper or holds larger integers than a state can."""
    if depth > MAX_DEPTH:
        raise StateCorrupt(f"nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= MAX_INT:
        raise StateCorrupt(f"holds an integer of {len(str(abs(value)))} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise StateCorrupt(f"holds the number {value}")
    if isinstance(value, dict):
        for item in value.values():
            _check_shape(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_shape(item, depth + 1)


@dataclass(frozen=True)
class FailureRecord:
    """The last failure of a deployment."""

    cause: str
    message: str | None
    at: float


@dataclass(frozen=True)
class BootSummary:
    """What `status` shows of a deployment's last boot."""

    at: float
    ready: bool
    vllm_version: str | None = None
    compile_cache_hit: bool | None = None
    compile_seconds: float | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_learned_used: bool = False
    seconds: float | None = None
    """How long the boot took to turn ready (kept when a later daemon adopts its server)."""
    kind: str | None = None
    """cold, warm, ... (the telemetry's boot kind)."""


@dataclass(frozen=True)
class LearnedKv:
    """KV bytes learned from a profiled boot, and the free memory that boot started with."""

    kv_cache_memory_bytes: int
    baseline_free_bytes: tuple[int, ...]
    """NVML free memory per assigned GPU (assignment order) just before the learning boot."""
    learned_at: float
    """Unix time."""
    vllm_version: str | None = None
    kv_cache_tokens: int | None = None
    """The profiled boot's `GPU KV cache size: N tokens` (None: not read, or learned before it was kept)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "baseline_free_bytes": list(self.baseline_free_bytes),
            "learned_at": self.learned_at,
            "vllm_version": self.vllm_version,
            "kv_cache_tokens": self.kv_cache_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LearnedKv:
        """Read `to_json()`'s form; raises ValueError/TypeError/KeyError when it is not that."""
        kv = data["kv_cache_memory_bytes"]
        baseline = data["baseline_free_bytes"]
        if not isinstance(kv, int) or kv <= 0 or not isinstance(baseline, list):
            raise ValueError(f"not a learned KV entry: {dict(data)!r}")
        if not all(isinstance(value, int) and value >= 0 for value in baseline):
            raise ValueError(f"baseline_free_bytes must be non-negative integers: {baseline!r}")
        version = data.get("vllm_version")
        tokens = data.get("kv_cache_tokens")
        return cls(
            kv,
            tuple(baseline),
            float(data["learned_at"]),
            None if version is None else str(version),
            tokens if isinstance(tokens, int) and tokens > 0 else None,
        )


def keep_first(existing: LearnedKv | None, candidate: LearnedKv | None) -> LearnedKv | None:
    """The learned value to store: the first one stays; a later boot's suggestion never replaces it.

    The store's write rule for learned bytes (until `forget`); why the first is kept, and what
    learned bytes mean for a boot, is the supervisor's (`supervisor.learning`)."""
    return existing if existing is not None else candidate


UPGRADE_STEPS: tuple[str, ...] = (
    "pulling",
    "reading_version",
    "replanning",
    "making_room",
    "booting",
    "checking",
    "switching",
    "rolling_back",
    "switched",
    "rolled_back",
    "refused",
)
"""An upgrade's steps as state.json names them (supervisor.upgrade.steps owns what they mean)."""


@dataclass(frozen=True)
class UpgradeRecord:
    """A deployment's last upgrade (or rollback): where it stands and which images it moves between.

    Recorded before each step is taken, so a daemon following one killed with -9 finishes or undoes it."""

    step: str
    old_image: str
    new_image: str
    started_at: float
    old_version: str | None = None
    new_version: str | None = None
    room: str | None = None
    """How the old server made room: "1" (asleep at level 1) or "stop"; None: not yet."""
    new_workload: str | None = None
    """The new server's workload id once started (stopped and removed when the upgrade is undone)."""
    reason: str | None = None
    """Why it was refused or rolled back; what the checks found when it switched."""
    report: Mapping[str, Any] = field(default_factory=dict)
    """The checks' figures (KV bytes, decode tokens/s, greedy ids equal) for status."""

    @property
    def serving_image(self) -> str:
        """The image the deployment runs: the new one once switched, else the old one."""
        return self.new_image if self.step == "switched" else self.old_image

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "old_image": self.old_image,
            "new_image": self.new_image,
            "started_at": self.started_at,
            "old_version": self.old_version,
            "new_version": self.new_version,
            "room": self.room,
            "new_workload": self.new_workload,
            "reason": self.reason,
            "report": dict(self.report),
        }

    @classmethod
    def from_json(cls, data: Any) -> UpgradeRecord:
        """Read `to_json()`'s form; StateCorrupt when it is not that."""
        if not isinstance(data, dict):
            raise StateCorrupt("upgrade is not an object")
        step, old, new = data.get("step"), data.get("old_image"), data.get("new_image")
        if step not in UPGRADE_STEPS or not isinstance(old, str) or not isinstance(new, str):
            raise StateCorrupt(f"not an upgrade record: step {step!r}")
        room = _optional(data, "room", str)
        return cls(
            step=step,
            old_image=old,
            new_image=new,
            started_at=float(_optional(data, "started_at", int, float) or 0.0),
            old_version=_optional(data, "old_version", str),
            new_version=_optional(data, "new_version", str),
            room=room if room in ("1", "stop") else None,
            new_workload=_optional(data, "new_workload", str),
            reason=_optional(data, "reason", str),
            report=dict(_optional(data, "report", dict) or {}),
        )


@dataclass(frozen=True)
class UnsafeSleep:
    """A sleep level that failed its check (memory not freed, or a wake answering other tokens) for one
    vLLM version and model (issue 29): later sleeps of the deployment take the next safe way."""

    level: str
    vllm_version: str | None
    model: str
    reason: str
    at: float


CANARY_TOKENS_KEPT = 64
"""The most canary token ids kept per fingerprint (a hostile server's answer is cut there)."""
CANARIES_KEPT = 8
"""Fingerprints kept per deployment (one per configuration; the oldest go first)."""


@dataclass(frozen=True)
class DeploymentState:
    """What the daemon remembers of one deployment across its own restarts."""

    learned_kv: Mapping[str, LearnedKv] = field(default_factory=dict)
    """Learned KV bytes by boot fingerprint."""
    boots: int = 0
    restarts: int = 0
    last_failure: FailureRecord | None = None
    last_boot: BootSummary | None = None
    down: bool = False
    """Taken down with `dankserve down`: stays down across daemon restarts until `up`."""
    overrides: Mapping[str, int | float | str] = field(default_factory=dict)
    """Planned values changed by a remediation (cleared when the configuration changes)."""
    remediated: tuple[str, ...] = ()
    """Failure causes already remediated (each only once)."""
    asleep: str | None = None
    """A swap group member's sleep level ("1", "2", "stop", "suspend") while asleep, falling asleep or waking, else
    None: a daemon that follows one killed with -9 adopts the member's server as it was (issue 16)."""
    swapping: str | None = None
    """The sleep or wake under way at the level `asleep` names ("falling_asleep", "waking"), recorded
    before it is sent: a daemon following one killed meanwhile sends it again."""
    timings: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Seconds the last boots (cold, warm), wakes and sleeps took, latest last: the predictions'
    history (supervisor.observe.prediction)."""
    unsafe_sleep: tuple[UnsafeSleep, ...] = ()
    """Sleep levels that failed their check, each for the vLLM version and model it failed with."""
    canaries: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Greedy token ids of the canary prompt by configuration (boot key), taken before the first sleep:
    every wake must answer the same."""
    upgrade: UpgradeRecord | None = None
    """The last `dankserve upgrade` or `rollback` (its image overrides the configured one once switched)."""

    def learned(self, fingerprint: str) -> LearnedKv | None:
        return self.learned_kv.get(fingerprint)

    def remember(self, fingerprint: str, learned: LearnedKv | None) -> DeploymentState:
        """Store learned bytes for a fingerprint, keeping the first value already there."""
        kept = keep_first(self.learned_kv.get(fingerprint), learned)
        if kept is None or kept is self.learned_kv.get(fingerprint):
            return self
        return replace(self, learned_kv={**self.learned_kv, fingerprint: kept})

    def forget(self, fingerprint: str) -> DeploymentState:
        """Drop the learned bytes of a fingerprint (after an OOM with them)."""
        if fingerprint not in self.learned_kv:
            return self
        return replace(self, learned_kv={k: v for k, v in self.learned_kv.items() if k != fingerprint})


@dataclass(frozen=True)
class State:
    """Everything the state file holds."""

    deployments: Mapping[str, DeploymentState] = field(default_factory=dict)
    image_versions: Mapping[str, str] = field(default_factory=dict)
    """vLLM version by image digest (asking an image for its version starts a container)."""

    def deployment(self, name: str) -> DeploymentState:
        """A deployment's state (empty when it has none yet)."""
        return self.deployments.get(name) or DeploymentState()

    def with_deployment(self, name: str, deployment: DeploymentState) -> State:
        return replace(self, deployments={**self.deployments, name: deployment})

    def update(self, name: str, change: Callable[[DeploymentState], DeploymentState]) -> State:
        """The state with `change` applied to one deployment."""
        return self.with_deployment(name, change(self.deployment(name)))

    def with_image_version(self, digest: str, version: str) -> State:
        return replace(self, image_versions={**self.image_versions, digest: version})


# --- (de)serialisation, pure ---------------------------------------------------------------------


def _optional(data: Mapping[str, Any], key: str, *kinds: type) -> Any:
    """data[key] when it is None or one of `kinds` (a bool is no int here); else StateCorrupt."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise StateCorrupt(f"{key} = {value!r} is not {' or '.join(kind.__name__ for kind in kinds)}")
    return value


def _seconds(value: float | None) -> float | None:
    """A duration read back: a number a boot can take (none past a year, nan or below zero: unknown)."""
    return float(value) if value is not None and 0 <= value <= 365 * 86400 else None


def _deployment_from_json(name: str, data: Any) -> DeploymentState:
    if not isinstance(data, dict):
        raise StateCorrupt(f"deployment {name!r} is not an object")
    try:
        learned = {str(fp): LearnedKv.from_json(entry) for fp, entry in (data.get("learned_kv") or {}).items()}
        failure = data.get("last_failure")
        boot = data.get("last_boot")
        return DeploymentState(
            learned_kv=learned,
            boots=int(_optional(data, "boots", int) or 0),
            restarts=int(_optional(data, "restarts", int) or 0),
            last_failure=None
            if failure is None
            else FailureRecord(str(failure["cause"]), failure.get("message"), float(failure["at"])),
            last_boot=None
            if boot is None
            else BootSummary(
                at=float(boot["at"]),
                ready=bool(boot["ready"]),
                vllm_version=_optional(boot, "vllm_version", str),
                compile_cache_hit=_optional(boot, "compile_cache_hit", bool),
                compile_seconds=_optional(boot, "compile_seconds", int, float),
                kv_cache_memory_bytes=_optional(boot, "kv_cache_memory_bytes", int),
                kv_cache_learned_used=bool(boot.get("kv_cache_learned_used", False)),
                seconds=_seconds(_optional(boot, "seconds", int, float)),
                kind=kind[:32] if (kind := _optional(boot, "kind", str)) is not None else None,
            ),
            down=bool(_optional(data, "down", bool) or False),
            overrides=dict(_optional(data, "overrides", dict) or {}),
            remediated=tuple(str(cause) for cause in _optional(data, "remediated", list) or ()),
            # A level this release does not know is as good as none: the server is asked (/is_sleeping).
            asleep=asleep if (asleep := _optional(data, "asleep", str)) in ("1", "2", "stop", "suspend") else None,
            swapping=moving if (moving := _optional(data, "swapping", str)) in ("falling_asleep", "waking") else None,
            timings=timings_from_json(data.get("timings")),
            unsafe_sleep=tuple(_unsafe_from_json(entry) for entry in _optional(data, "unsafe_sleep", list) or ()),
            canaries={
                str(key): tuple(int(i) for i in ids[:CANARY_TOKENS_KEPT])
                for key, ids in list((_optional(data, "canaries", dict) or {}).items())[-CANARIES_KEPT:]
                if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            },
            upgrade=None if data.get("upgrade") is None else UpgradeRecord.from_json(data["upgrade"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise StateCorrupt(f"deployment {name!r}: {exc}") from None


def _unsafe_from_json(data: Any) -> UnsafeSleep:
    if not isinstance(data, dict):
        raise StateCorrupt(f"unsafe_sleep entry {data!r} is not an object")
    level = _optional(data, "level", str)
    if level not in ("1", "2", "suspend"):
        raise StateCorrupt(f"unsafe_sleep level {level!r} is not 1, 2 or suspend")
    return UnsafeSleep(
        level=level,
        vllm_version=_optional(data, "vllm_version", str),
        model=str(_optional(data, "model", str) or ""),
        reason=str(_optional(data, "reason", str) or "")[:500],
        at=float(_optional(data, "at", int, float) or 0.0),
    )


def state_from_json(text: str) -> State:
    """Parse a state file; StateCorrupt names what is wrong (empty, truncated, nested too deep ...),
    StateFromNewerRelease says a newer dankserve wrote it."""
    if not text.strip():
        raise StateCorrupt("the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateCorrupt(f"not JSON (truncated?): {exc}") from None
    except RecursionError:
        raise StateCorrupt("nested too deeply to read") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit for conversions
        raise StateCorrupt(f"not a state: {exc}") from None
    if not isinstance(data, dict):
        raise StateCorrupt("not a JSON object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        if isinstance(version, int) and not isinstance(version, bool) and SCHEMA_VERSION < version < MAX_INT:
            raise StateFromNewerRelease(version)
        raise StateCorrupt(f"schema_version {version!r} is not {SCHEMA_VERSION}")
    _check_shape(data)
    deployments = data.get("deployments") or {}
    images = data.get("image_versions") or {}
    if not isinstance(deployments, dict) or not isinstance(images, dict):
        raise StateCorrupt("deployments and image_versions must be objects")
    return State(
        deployments={str(name): _deployment_from_json(str(name), entry) for name, entry in deployments.items()},
        image_versions={str(digest): str(version) for digest, version in images.items()},
    )


def _deployment_to_json(deployment: DeploymentState) -> dict[str, Any]:
    failure = deployment.last_failure
    boot = deployment.last_boot
    return {
        "learned_kv": {fp: entry.to_json() for fp, entry in sorted(deployment.learned_kv.items())},
        "boots": deployment.boots,
        "restarts": deployment.restarts,
        "last_failure": None
        if failure is None
        else {"cause": failure.cause, "message": failure.message, "at": failure.at},
        "last_boot": None
        if boot is None
        else {
            "at": boot.at,
            "ready": boot.ready,
            "vllm_version": boot.vllm_version,
            "compile_cache_hit": boot.compile_cache_hit,
            "compile_seconds": boot.compile_seconds,
            "kv_cache_memory_bytes": boot.kv_cache_memory_bytes,
            "kv_cache_learned_used": boot.kv_cache_learned_used,
            "seconds": boot.seconds,
            "kind": boot.kind,
        },
        "down": deployment.down,
        "overrides": dict(deployment.overrides),
        "remediated": list(deployment.remediated),
        "asleep": deployment.asleep,
        "swapping": deployment.swapping,
        "timings": timings_json(deployment.timings),
        "unsafe_sleep": [
            {"level": u.level, "vllm_version": u.vllm_version, "model": u.model, "reason": u.reason, "at": u.at}
            for u in deployment.unsafe_sleep
        ],
        "canaries": {key: list(ids) for key, ids in deployment.canaries.items()},
        "upgrade": None if deployment.upgrade is None else deployment.upgrade.to_json(),
    }


def state_to_json(state: State) -> str:
    """The state file's text."""
    data = {
        "schema_version": SCHEMA_VERSION,
        "deployments": {name: _deployment_to_json(dep) for name, dep in sorted(state.deployments.items())},
        "image_versions": dict(sorted(state.image_versions.items())),
    }
    return json.dumps(data, indent=1) + "\n"


# --- the file, atomically ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    """The state read (empty when there was none usable) and what went wrong on the way."""

    state: State
    warnings: tuple[str, ...] = ()
    newer: StateFromNewerRelease | None = None
    """Set when a newer dankserve wrote the file (left untouched; the state is then empty)."""


def _utc_stamp(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))


class StateStore:
    """The state file under a state directory."""

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = state_dir
        self.path = state_dir / STATE_FILE
        self._clock = clock

    def load(self, *, repair: bool = True) -> LoadResult:
        """Read the state; a missing file is an empty state, an unusable one is moved aside (with
        `repair`; a reader that only looks, like `status`, changes nothing). A file a newer
        dankserve wrote is never moved: `newer` says so and the caller decides."""
        if repair:
            self._remove_stale_temp_files()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return LoadResult(State())
        except (OSError, UnicodeDecodeError) as exc:
            if isinstance(exc, UnicodeDecodeError):
                return self._unusable(f"not UTF-8 text: {exc}", repair)
            return LoadResult(State(), (f"state file {self.path} cannot be read ({exc}); starting without it",))
        try:
            return LoadResult(state_from_json(text))
        except StateFromNewerRelease as exc:
            return LoadResult(State(), (f"state file {self.path} was {exc}: left untouched",), newer=exc)
        except StateCorrupt as exc:
            return self._unusable(str(exc), repair)

    def _unusable(self, reason: str, repair: bool) -> LoadResult:
        if repair:
            return self._move_aside(reason)
        return LoadResult(State(), (f"state file {self.path} is unusable ({reason}); the daemon moves it aside",))

    def save(self, state: State) -> tuple[str, ...]:
        """Write the state atomically; warnings (empty when saved). A failed write changes no file."""
        tmp: str | None = None
        try:
            self._ensure_dir()
            fd, tmp = tempfile.mkstemp(prefix=f".{STATE_FILE}.", suffix=".tmp", dir=self.state_dir)
            with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp: mode 0600
                out.write(state_to_json(state))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
            tmp = None
            self._fsync_dir()
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            why = {errno.ENOSPC: "the disk is full", errno.EROFS: "the file system is read-only"}.get(
                exc.errno or 0, exc.strerror or str(exc)
            )
            return (f"state not saved to {self.path}: {why}; keeping it in memory and retrying on the next change",)
        return ()

    def _ensure_dir(self) -> None:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.state_dir.stat()
        if info.st_uid == os.geteuid() and not info.st_mode & 0o022:  # never a shared dir (a link to /tmp)
            with contextlib.suppress(OSError):
                self.state_dir.chmod(0o700)

    def _fsync_dir(self) -> None:
        fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _move_aside(self, reason: str) -> LoadResult:
        aside = self.path.with_name(f"{STATE_FILE}.corrupt-{_utc_stamp(self._clock())}")
        counter = 1
        while aside.exists():
            aside = self.path.with_name(f"{STATE_FILE}.corrupt-{_utc_stamp(self._clock())}-{counter}")
            counter += 1
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            return LoadResult(
                State(),
                (
                    f"state file {self.path} is unusable ({reason}) and could not be moved aside ({exc}); "
                    "starting with an empty state",
                ),
            )
        return LoadResult(
            State(),
            (
                f"state file {self.path} is unusable ({reason}); moved it to {aside}, starting with an empty "
                "state (learned KV sizes are learned again)",
            ),
        )

    def _remove_stale_temp_files(self) -> None:
        # Temp files of a write interrupted by a crash; ours by name, never the state itself.
        with contextlib.suppress(OSError):
            for leftover in self.state_dir.glob(f".{STATE_FILE}.*.tmp"):
                with contextlib.suppress(OSError):
                    leftover.unlink()
