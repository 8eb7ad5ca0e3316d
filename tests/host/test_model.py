"""Tests for dankserve.host.model: PCI bus-id spellings and GPU identity checks."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dankserve.host.model import Gpu, GpuLink, Host, nvml_bus_id, pci_address, sysfs_bus_id

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


def _host(**fields: object) -> Host:
    gpus = tuple(_gpu(i, f"GPU-{i}") for i in range(3))
    return Host.model_validate(
        {"gpus": gpus, "cpu": {"physical_cores": 1, "logical_cores": 1}, "memory": {"total_bytes": 1}, **fields}
    )


def test_links_are_optional_and_looked_up_in_either_order() -> None:
    """A host without links has None (older files); a recorded link is found by its GPUs in either order."""
    assert _host().links is None
    host = _host(links=[{"a": 0, "b": 2, "kind": "NVLINK", "nvlinks": 18}, {"a": 0, "b": 1, "kind": "SYS"}])
    assert host.link(2, 0) == GpuLink(a=0, b=2, kind="NVLINK", nvlinks=18)
    assert host.link(1, 0) is not None and host.link(1, 0).label() == "SYS"  # type: ignore[union-attr]
    assert host.link(1, 2) is None
    assert GpuLink(a=0, b=1, kind="NVLINK").label() == "NV?"


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ([{"a": 1, "b": 0, "kind": "SYS"}], "a < b"),
        ([{"a": 0, "b": 0, "kind": "SYS"}], "a < b"),
        ([{"a": 0, "b": 1, "kind": "PXB", "nvlinks": 2}], "no NVLinks"),
        ([{"a": 0, "b": 1, "kind": "NV18"}], "kind"),
        ([{"a": 0, "b": 7, "kind": "SYS"}], "lacks"),
        ([{"a": 0, "b": 1, "kind": "SYS"}, {"a": 0, "b": 1, "kind": "PIX"}], "twice"),
    ],
)
def test_malformed_links_are_rejected(links: list[dict[str, object]], message: str) -> None:
    """Links out of order, NVLinks on a PCIe path, unknown kinds, unknown GPUs and repeated pairs are invalid."""
    with pytest.raises(ValidationError, match=message):
        _host(links=links)
