"""Tests for dankserve.host.model: PCI bus-id spellings and GPU identity checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dankserve.host.model import Gpu, Host, nvml_bus_id, pci_address, sysfs_bus_id

BUS_IDS = [
    # given, NVML form, sysfs form
    ("00000000:17:00.0", "00000000:17:00.0", "0000:17:00.0"),
    ("0000:ab:00.0", "00000000:AB:00.0", "0000:ab:00.0"),
    ("00000000:AB:00.0\n", "00000000:AB:00.0", "0000:ab:00.0"),
    ("0001:3b:1f.7", "00000001:3B:1F.7", "0001:3b:1f.7"),
    ("0000D4C5:00:00.0", "0000D4C5:00:00.0", "d4c5:00:00.0"),  # Hyper-V style domain
    ("1:2:3.4", "00000001:02:03.4", "0001:02:03.4"),
]


@pytest.mark.parametrize(("given", "nvml", "sysfs"), BUS_IDS)
def test_bus_id_spellings(given: str, nvml: str, sysfs: str) -> None:
    """Bus ids in either spelling convert to NVML's and to Linux sysfs's form."""
    assert nvml_bus_id(given) == nvml
    assert sysfs_bus_id(given) == sysfs


@pytest.mark.parametrize("bad", ["", "17:00.0", "0000:17:00", "0000:17:00.8", "zz:17:00.0", "000000000:17:00.0"])
def test_malformed_bus_id_is_rejected(bad: str) -> None:
    """Text that is not domain:bus:device.function raises ValueError naming it."""
    with pytest.raises(ValueError, match="not a PCI bus id"):
        pci_address(bad)


def test_bus_ids_sort_numerically() -> None:
    """PCI addresses order by domain, then bus, device and function as numbers."""
    ids = ["0000:9a:00.0", "00000000:18:00.0", "0001:01:00.0", "0000:2A:00.0"]
    assert sorted(ids, key=pci_address) == ["00000000:18:00.0", "0000:2A:00.0", "0000:9a:00.0", "0001:01:00.0"]


def _gpu(index: int, uuid: str, bus: str | None = None) -> Gpu:
    return Gpu(index=index, uuid=uuid, name="g", memory_total_bytes=1, compute_capability=(9, 0), pci_bus_id=bus)


def test_gpu_stores_bus_id_in_nvml_form() -> None:
    """A GPU given a sysfs-form bus id keeps NVML's spelling."""
    assert _gpu(0, "GPU-a", "0000:ab:00.0").pci_bus_id == "00000000:AB:00.0"


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ((_gpu(0, "GPU-a"), _gpu(0, "GPU-b")), "share the index 0"),
        ((_gpu(0, "GPU-a"), _gpu(1, "GPU-a")), "share the uuid GPU-a"),
    ],
)
def test_host_rejects_ambiguous_gpus(gpus: tuple[Gpu, ...], message: str) -> None:
    """Two GPUs with one index or one UUID make a host invalid, since deployments name GPUs by them."""
    with pytest.raises(ValidationError, match=message):
        Host(gpus=gpus, cpu={"physical_cores": 1, "logical_cores": 1}, memory={"total_bytes": 1})
