"""`dankserve doctor`'s snapshot check: CRIU missing, old, failing, gVisor, no capability, TP > 1."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dankserve.doctor import CriuReading, read_criu, snapshot_verdict
from dankserve.snapshot.criu import criu_path

_ROOT_CAPS = (1 << 21) | (1 << 40)
_GOOD = CriuReading("/usr/local/sbin/criu", "4.2.1", True, "", "6.18.0", _ROOT_CAPS)


def test_working_criu_is_ok() -> None:
    check = snapshot_verdict(_GOOD, wanted=True)
    assert check.verdict == "ok" and "4.2.1" in check.detail


@pytest.mark.parametrize(
    ("reading", "words"),
    [
        (replace(_GOOD, path=None, version=None), "not installed"),
        (replace(_GOOD, version="3.17.1"), "older than 4.2"),
        (replace(_GOOD, version=None), "older than 4.2"),
        (replace(_GOOD, kernel_release="4.4.0"), "gVisor"),
        (replace(_GOOD, effective_caps=0), "CAP_CHECKPOINT_RESTORE"),
        (replace(_GOOD, check_ok=False, check_reason="vdso: Unexpected rt vDSO area bounds"), "vDSO area"),
    ],
)
def test_each_reason_is_a_warn_with_a_fix(reading: CriuReading, words: str) -> None:
    check = snapshot_verdict(reading, wanted=True)
    assert check.verdict == "warn" and words in check.detail and check.fix


def test_checkpoint_restore_capability_alone_is_enough() -> None:
    assert snapshot_verdict(replace(_GOOD, effective_caps=1 << 40), wanted=True).verdict == "ok"


def test_tensor_parallel_deployments_are_named() -> None:
    check = snapshot_verdict(_GOOD, wanted=True, multi_gpu=["big", "a"])
    assert check.verdict == "warn" and "a, big" in check.detail and "TP > 1" in check.detail


def test_all_off_is_ok_even_without_criu() -> None:
    check = snapshot_verdict(replace(_GOOD, path=None), wanted=False)
    assert check.verdict == "ok" and "off" in check.detail


@pytest.mark.skipif(read_criu(criu_path()).path is None, reason="CRIU is not installed (make system-deps)")
def test_real_criu_reading() -> None:
    reading = read_criu(criu_path())
    assert reading.path is not None and reading.version is not None
    assert reading.version.count(".") >= 1
    assert snapshot_verdict(reading, wanted=True).verdict in ("ok", "warn")


_NO_BINDINGS = ("cuda-bindings is not installed", "pip install 'dankserve[snapshot]'")


def test_cuda_bindings_missing_turns_a_working_criu_into_off_with_the_fix() -> None:
    check = snapshot_verdict(_GOOD, wanted=True, gpu_missing=_NO_BINDINGS)
    assert check.verdict == "warn" and check.detail.startswith("off: cuda-bindings is not installed")
    assert check.fix == _NO_BINDINGS[1]


def test_cuda_bindings_missing_is_said_beside_criu_missing_with_both_fixes() -> None:
    check = snapshot_verdict(replace(_GOOD, path=None), wanted=True, gpu_missing=_NO_BINDINGS)
    assert check.verdict == "warn" and "CRIU is not installed" in check.detail and "cuda-bindings" in check.detail
    assert check.fix is not None and "make system-deps" in check.fix and "dankserve[snapshot]" in check.fix


def test_cuda_bindings_do_not_matter_when_every_deployment_has_snapshots_off() -> None:
    assert snapshot_verdict(_GOOD, wanted=False, gpu_missing=_NO_BINDINGS).verdict == "ok"


def test_podman_snapshots_say_which_criu_podman_runs_and_which_deployments_it_cannot_checkpoint() -> None:
    from dankserve.doctor import podman_snapshot_verdict
    from dankserve.runtime.podman.checkpoint import criu_of

    assert criu_of({"host": {"ociRuntime": {"name": "runc"}}}) is None, "Podman 4.3 says nothing of CRIU"
    assert criu_of({"host": {"criuEnabled": True}}) == "criuEnabled=True"
    ok = podman_snapshot_verdict(None, "/usr/local/sbin/criu", {})
    assert ok.verdict == "ok" and "/usr/local/sbin/criu" in ok.detail and "Podman 4.3" in ok.detail
    missing = podman_snapshot_verdict(None, None, {})
    assert missing.verdict == "warn" and "make system-deps" in (missing.fix or "")
    blocked = podman_snapshot_verdict("criuEnabled=True", "/usr/local/sbin/criu", {"chat": "shares /dev/shm"})
    assert blocked.verdict == "warn" and "chat: shares /dev/shm" in blocked.detail
