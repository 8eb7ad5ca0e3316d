"""The systemd unit's sandbox lets a process-runtime server do what vLLM needs: servers of the process
runtime are the daemon's children and inherit every line of it (issue 26's read-in-the-code items)."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[1] / "units" / "dankserve.service"


def _values(key: str) -> list[str]:
    lines = UNIT.read_text().splitlines()
    return [line.split("=", 1)[1] for line in lines if line.startswith(f"{key}=")]


def test_the_unit_filters_no_ip_addresses() -> None:
    """No IPAddressDeny: it blocked the Hub, the gateway and cluster API beyond loopback, Ray and process servers."""
    assert _values("IPAddressDeny") == [] and _values("IPAddressAllow") == []


def test_the_unit_allows_what_vllms_numa_binding_and_jit_need() -> None:
    """set_mempolicy/mbind/sched_setaffinity (@resources) and CAP_SYS_NICE for numactl; no W^X denial."""
    denied = " ".join(v for v in _values("SystemCallFilter") if v.startswith("~"))
    assert "@resources" not in denied and "@privileged" in denied
    assert "CAP_SYS_NICE" in _values("CapabilityBoundingSet")[0].split()
    assert _values("MemoryDenyWriteExecute") == ["no"]
