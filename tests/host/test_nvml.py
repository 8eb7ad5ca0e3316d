"""Tests for dankserve.host.nvml: raw NVML readings -> GPUs (pure), sysfs NUMA, and the real driver.

The `gpu`-marked tests compare the probe with `nvidia-smi` on a real GPU host; they are
skipped where NVML cannot be initialised. No hypothesis here: the GPU machine runs this file
with only pytest installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dankserve.errors import NvmlUnavailable
from dankserve.exitcodes import ExitCode
from dankserve.host.model import GpuLink
from dankserve.host.nvml import (
    NvmlReadings,
    RawGpu,
    RawNvLink,
    RawPair,
    cuda_version_string,
    gpus_from_readings,
    links_from_readings,
    numa_node_of,
    nvml_unavailable,
    read_devices,
    read_nvml,
    sysfs_numa_node,
)
from tests.harness.gpus import nvml_unusable_reason

GIB = 2**30


def raw(nvml_index: int, bus: str, **changes: object) -> RawGpu:
    """A recorded H100 reading, changed where a test needs it."""
    base = RawGpu(
        nvml_index=nvml_index,
        uuid=f"GPU-0000000{nvml_index}-aaaa-bbbb-cccc-dddddddddddd",
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=85520809984,
        memory_free_bytes=84966113280,
        compute_capability=(9, 0),
        pci_bus_id=bus,
        nvml_numa_node=None,
        sysfs_numa_node=0,
        mig_current_mode=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def readings(*gpus: RawGpu, skipped: tuple[str, ...] = (), pairs: tuple[RawPair, ...] | None = None) -> NvmlReadings:
    return NvmlReadings(driver_version="580.95.05", cuda_driver_version=13000, gpus=gpus, skipped=skipped, pairs=pairs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(13000, "13.0"), (12040, "12.4"), (12080, "12.8"), (12010, "12.1"), (11080, "11.8"), (0, None), (None, None)],
)
def test_cuda_version_string(value: int | None, expected: str | None) -> None:
    """NVML's integer CUDA driver version reads as major.minor; zero or absent is unknown."""
    assert cuda_version_string(value) == expected


@pytest.mark.parametrize(
    ("nvml_node", "sysfs_node", "cpu_nodes", "expected"),
    [
        (0, None, None, 0),  # NVML knows, layout unknown
        (1, 0, {0, 1}, 1),  # NVML names a node with CPUs: it wins
        (None, 1, {0, 1}, 1),  # NVML does not support the query: sysfs
        (-1, 1, None, 1),  # NVML says unknown: sysfs
        (1, 0, {0}, 0),  # Grace Hopper: NVML's node is the GPU's own memory, no CPUs
        (1, None, {0}, None),  # ... and sysfs does not know either
        (None, None, {0}, None),  # nobody knows
        (None, -1, None, None),  # sysfs -1 means unknown (common in VMs)
    ],
)
def test_numa_node_choice(
    nvml_node: int | None, sysfs_node: int | None, cpu_nodes: set[int] | None, expected: int | None
) -> None:
    """A GPU's NUMA node is NVML's when it names a node with CPUs, else sysfs's, else unknown."""
    assert numa_node_of(nvml_node, sysfs_node, cpu_nodes) == expected


def test_gpus_are_numbered_in_pci_bus_order() -> None:
    """GPUs are sorted by PCI bus id and indexed by that position, bus ids in NVML form."""
    facts = gpus_from_readings(
        readings(
            raw(0, "00000000:9A:00.0", sysfs_numa_node=1),
            raw(1, "00000000:18:00.0"),
            raw(2, "0000:ab:00.0", sysfs_numa_node=1),
            raw(3, "00000000:2A:00.0"),
        )
    )
    assert [gpu.pci_bus_id for gpu in facts.gpus] == [
        "00000000:18:00.0",
        "00000000:2A:00.0",
        "00000000:9A:00.0",
        "00000000:AB:00.0",
    ]
    assert [gpu.index for gpu in facts.gpus] == [0, 1, 2, 3]
    assert [gpu.uuid[:12] for gpu in facts.gpus] == ["GPU-00000001", "GPU-00000003", "GPU-00000000", "GPU-00000002"]
    assert [gpu.numa_node for gpu in facts.gpus] == [0, 0, 1, 1]


def test_nvml_order_differing_from_bus_order_is_warned() -> None:
    """When NVML's numbering is not PCI bus order, a warning says nvidia-smi's indices differ."""
    facts = gpus_from_readings(readings(raw(0, "00000000:9A:00.0"), raw(1, "00000000:18:00.0")))
    assert len(facts.warnings) == 1
    assert "nvidia-smi" in facts.warnings[0]
    assert "[1, 0]" in facts.warnings[0]


def test_bus_ordered_nvml_gives_no_warning() -> None:
    """NVML numbering in PCI bus order (the usual case) keeps the indices and warns nothing."""
    facts = gpus_from_readings(readings(raw(0, "00000000:18:00.0"), raw(1, "00000000:2A:00.0")))
    assert facts.warnings == ()
    assert [gpu.index for gpu in facts.gpus] == [0, 1]


def test_driver_wide_facts_and_skipped_devices() -> None:
    """Driver and CUDA versions pass through; devices NVML could not open become warnings."""
    facts = gpus_from_readings(readings(raw(0, "00000000:18:00.0"), skipped=("GPU 1 (NVML index) skipped: x",)))
    assert (facts.driver_version, facts.cuda_version) == ("580.95.05", "13.0")
    assert facts.warnings == ("GPU 1 (NVML index) skipped: x",)


@pytest.mark.parametrize(("mode", "expected"), [(None, None), (0, False), (1, True)])
def test_mig_mode(mode: int | None, expected: bool | None) -> None:
    """MIG's current mode 1 is on, 0 off, and unsupported is unknown (null)."""
    facts = gpus_from_readings(readings(raw(0, "00000000:18:00.0", mig_current_mode=mode)))
    assert facts.gpus[0].mig_mode is expected


def test_recorded_fields_pass_through() -> None:
    """Name, UUID, memory and compute capability are copied unchanged."""
    gpu = gpus_from_readings(readings(raw(0, "00000000:18:00.0"))).gpus[0]
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"
    assert (gpu.memory_total_bytes, gpu.memory_free_bytes) == (85520809984, 84966113280)
    assert gpu.compute_capability == (9, 0)


SWITCH, GPU, VM_SWITCH_BUS = 2, 0, "FFFFFFFF:FF:FF.0"


def to_switch(count: int) -> tuple[RawNvLink, ...]:
    """`count` active links ending at an NVSwitch, as NVML reports them inside a VM."""
    return tuple(RawNvLink(SWITCH, VM_SWITCH_BUS) for _ in range(count))


def to_gpu(bus: str, count: int) -> tuple[RawNvLink, ...]:
    return tuple(RawNvLink(GPU, bus) for _ in range(count))


BUS_A, BUS_B = "00000000:18:00.0", "00000000:2A:00.0"

# name, links of the GPU at BUS_A, links of the GPU at BUS_B, common ancestor, NVLink P2P status, expected link
PAIR_CASES = [
    (
        "H200 VM: 18 links each to NVSwitches",
        to_switch(18),
        to_switch(18),
        30,
        0,
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=18),
    ),
    ("A100 SXM: 12 switch links", to_switch(12), to_switch(12), 50, 0, GpuLink(a=0, b=1, kind="NVLINK", nvlinks=12)),
    (
        "switches, one GPU with fewer links up",
        to_switch(18),
        to_switch(16),
        50,
        None,
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=16),
    ),
    ("switches but another NVLink partition", to_switch(18), to_switch(18), 50, 4, GpuLink(a=0, b=1, kind="SYS")),
    (
        "RTX 3090 pair with a bridge: NV4",
        to_gpu(BUS_B, 4),
        to_gpu(BUS_A, 4),
        30,
        0,
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=4),
    ),
    (
        "direct links seen from one side only",
        to_gpu("0000:2a:00.0", 2),
        (),
        20,
        None,
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=2),
    ),
    ("links to a third GPU do not count", to_gpu("00000000:3A:00.0", 4), (), 40, None, GpuLink(a=0, b=1, kind="NODE")),
    (
        "remote type unknown, bus id matches",
        (RawNvLink(None, BUS_B),),
        (),
        20,
        None,
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=1),
    ),
    ("PCIe: one board", (), (), 0, None, GpuLink(a=0, b=1, kind="PIX")),
    ("PCIe: single switch", (), (), 10, None, GpuLink(a=0, b=1, kind="PIX")),
    ("PCIe: several switches", (), (), 20, None, GpuLink(a=0, b=1, kind="PXB")),
    ("PCIe: host bridge", (), (), 30, None, GpuLink(a=0, b=1, kind="PHB")),
    ("PCIe: across host bridges", (), (), 40, None, GpuLink(a=0, b=1, kind="NODE")),
    ("PCIe: across NUMA nodes", (), (), 50, None, GpuLink(a=0, b=1, kind="SYS")),
]


@pytest.mark.parametrize(
    ("links_a", "links_b", "ancestor", "p2p", "expected"),
    [case[1:] for case in PAIR_CASES],
    ids=[case[0] for case in PAIR_CASES],
)
def test_pair_link(
    links_a: tuple[RawNvLink, ...], links_b: tuple[RawNvLink, ...], ancestor: int, p2p: int | None, expected: GpuLink
) -> None:
    """A pair is NVLink when links join them directly or both reach NVSwitches with P2P OK, else its PCIe path."""
    # NVML numbers B first: the link is still named in PCI bus order
    gpus = (raw(0, BUS_B, nvlinks=links_b), raw(1, BUS_A, nvlinks=links_a))
    pairs = (RawPair(nvml_a=0, nvml_b=1, common_ancestor=ancestor, p2p_nvlink=p2p),)
    assert links_from_readings(readings(*gpus, pairs=pairs)) == (expected,)


def test_links_unknown_or_unread() -> None:
    """Links not read are None; a pair with no NVLink and no PCIe answer is left out; one GPU has no pairs."""
    assert links_from_readings(readings(raw(0, BUS_A), raw(1, BUS_B))) is None
    unknown = (RawPair(nvml_a=0, nvml_b=1, common_ancestor=None, p2p_nvlink=None),)
    assert links_from_readings(readings(raw(0, BUS_A), raw(1, BUS_B), pairs=unknown)) == ()
    assert links_from_readings(readings(raw(0, BUS_A), pairs=())) == ()


def test_gpu_facts_carry_links_and_link_problems() -> None:
    """The interpreted facts hold the links; a failure reading them is a warning and no links."""
    pairs = (RawPair(nvml_a=0, nvml_b=1, common_ancestor=50, p2p_nvlink=None),)
    facts = gpus_from_readings(readings(raw(0, BUS_A), raw(1, BUS_B), pairs=pairs))
    assert facts.links == (GpuLink(a=0, b=1, kind="SYS"),)
    failed = replace(readings(raw(0, BUS_A), raw(1, BUS_B)), link_problem="NVML failed (Unknown)")
    facts = gpus_from_readings(failed)
    assert facts.links is None
    assert facts.warnings == ("links between GPUs not recorded: NVML failed (Unknown)",)


@pytest.mark.parametrize(("content", "expected"), [("1\n", 1), ("0", 0), ("-1\n", None), ("garbage", None)])
def test_sysfs_numa_node(tmp_path: Path, content: str, expected: int | None) -> None:
    """The PCI device's numa_node file is read under the sysfs name of an NVML bus id; -1 is unknown."""
    device = tmp_path / "bus" / "pci" / "devices" / "0000:ab:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text(content)
    assert sysfs_numa_node("00000000:AB:00.0", tmp_path) == expected


def test_sysfs_numa_node_absent(tmp_path: Path) -> None:
    """A device without a sysfs entry has an unknown NUMA node."""
    assert sysfs_numa_node("00000000:17:00.0", tmp_path) is None


def test_unavailable_error_names_what_was_looked_for() -> None:
    """The no-GPU error names the NVML library and device nodes, what was found, and exits 3."""
    error = nvml_unavailable("NVML sees no GPU", ["/dev/nvidiactl"])
    assert error.exit_code == ExitCode.ENVIRONMENT
    assert int(error.exit_code) == 3
    assert "libnvidia-ml.so.1" in error.message
    assert "/dev/nvidia*" in error.message
    assert "found: /dev/nvidiactl" in error.message
    assert error.fix is not None and "--hardware" in error.fix
    assert "found: none" in nvml_unavailable("x", []).message


@pytest.mark.skipif(nvml_unusable_reason() is None, reason="NVML works here")
def test_read_nvml_without_driver_raises() -> None:
    """On a machine without a usable NVIDIA driver, reading NVML raises NvmlUnavailable."""
    with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1"):
        read_nvml()


@dataclass
class StandInNvml:
    """An NVML binding answering like pynvml for recorded devices, raising pynvml's own error classes."""

    devices: list[dict[str, Any]]
    unsupported: set[str] = field(default_factory=set)
    no_permission: set[int] = field(default_factory=set)
    cuda_v2: bool = True
    links_fail: bool = False
    NVML_NVLINK_MAX_LINKS = 36  # nvidia-ml-py 13's value
    NVML_P2P_CAPS_INDEX_NVLINK = 3

    def __post_init__(self) -> None:
        import pynvml

        self.NVMLError = pynvml.NVMLError
        self.NVMLError_NoPermission = pynvml.NVMLError_NoPermission
        self.NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
        self.NVMLError_Unknown = pynvml.NVMLError_Unknown
        self.NVMLError_NotSupported = pynvml.NVMLError_NotSupported
        self.NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
        self._not_supported = pynvml.NVMLError_NotSupported
        self._function_not_found = pynvml.NVMLError_FunctionNotFound

    def _answer(self, name: str, handle: int) -> Any:
        if name in self.unsupported:
            raise self._not_supported()
        return self.devices[handle][name]

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802  (pynvml's names)
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802  (pynvml's names)
        if index in self.no_permission:
            raise self.NVMLError_NoPermission()
        return index

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802  (pynvml's names)
        return "580.95.05"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:  # noqa: N802  (pynvml's names)
        if not self.cuda_v2:
            raise self._function_not_found()
        return 13000

    def nvmlSystemGetCudaDriverVersion(self) -> int:  # noqa: N802  (pynvml's names)
        return 12080

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:  # noqa: N802  (pynvml's names)
        return SimpleNamespace(total=self.devices[handle]["total"], free=self.devices[handle]["free"])

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:  # noqa: N802  (pynvml's names)
        return SimpleNamespace(busId=self.devices[handle]["bus"])

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:  # noqa: N802  (pynvml's names)
        return (9, 0)

    def nvmlDeviceGetUUID(self, handle: int) -> str:  # noqa: N802  (pynvml's names)
        return f"GPU-{handle}"

    def nvmlDeviceGetName(self, handle: int) -> bytes:  # noqa: N802  (pynvml's names)
        return b"NVIDIA H200"  # older nvidia-ml-py versions return bytes

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:  # noqa: N802  (pynvml's names)
        return int(self._answer("numa", handle))

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:  # noqa: N802  (pynvml's names)
        return [int(self._answer("mig", handle)), 0]

    # links: each device's "links" is a list of (remote type, remote bus id); no list means no NVLink
    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802  (pynvml's names)
        if self.links_fail:
            raise self.NVMLError_Unknown()
        links = self.devices[handle].get("links")
        if links is None:
            raise self._not_supported()
        if link >= 18:
            raise self.NVMLError_InvalidArgument()  # as a real H200 answers past its 18 links
        return 1 if link < len(links) else 0

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:  # noqa: N802  (pynvml's names)
        return int(self.devices[handle]["links"][link][0])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> Any:  # noqa: N802  (pynvml's names)
        return SimpleNamespace(busId=self.devices[handle]["links"][link][1].encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, first: int, second: int) -> int:  # noqa: N802  (pynvml's names)
        if "ancestor" in self.unsupported:
            raise self._not_supported()
        return 30

    def nvmlDeviceGetP2PStatus(self, first: int, second: int, index: int) -> int:  # noqa: N802  (pynvml's names)
        assert index == self.NVML_P2P_CAPS_INDEX_NVLINK
        return 0


def h200(bus: bytes | str, numa: int = 0, mig: int = 0, switch_links: int | None = 18) -> dict[str, Any]:
    links = None if switch_links is None else [(2, "FFFFFFFF:FF:FF.0")] * switch_links
    return {"bus": bus, "total": 150754820096, "free": 150167617536, "numa": numa, "mig": mig, "links": links}


def test_read_devices_through_binding(tmp_path: Path) -> None:
    """Each device's readings are taken as NVML gives them, bytes decoded and the sysfs node read beside."""
    device = tmp_path / "bus" / "pci" / "devices" / "0000:9b:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    result = read_devices(StandInNvml([h200(b"00000000:9B:00.0", numa=1, mig=1)]), tmp_path)
    assert (result.driver_version, result.cuda_driver_version, result.skipped) == ("580.95.05", 13000, ())
    (gpu,) = result.gpus
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id) == ("NVIDIA H200", "GPU-0", "00000000:9B:00.0")
    assert (gpu.memory_total_bytes, gpu.memory_free_bytes, gpu.compute_capability) == (
        150754820096,
        150167617536,
        (9, 0),
    )
    assert (gpu.nvml_numa_node, gpu.sysfs_numa_node, gpu.mig_current_mode) == (1, 1, 1)


def test_read_devices_unsupported_queries_are_unknown(tmp_path: Path) -> None:
    """NUMA and MIG queries NVML does not support, and a missing v2 CUDA call, read as unknown or fall back."""
    nvml = StandInNvml([h200("00000000:18:00.0")], unsupported={"numa", "mig"}, cuda_v2=False)
    result = read_devices(nvml, tmp_path)
    assert (result.gpus[0].nvml_numa_node, result.gpus[0].mig_current_mode) == (None, None)
    assert result.gpus[0].sysfs_numa_node is None
    assert result.cuda_driver_version == 12080


def test_read_devices_skips_forbidden_devices(tmp_path: Path) -> None:
    """A device NVML will not open is skipped with a note; none left is NvmlUnavailable."""
    nvml = StandInNvml([h200("00000000:18:00.0"), h200("00000000:2A:00.0")], no_permission={0})
    result = read_devices(nvml, tmp_path)
    assert [gpu.uuid for gpu in result.gpus] == ["GPU-1"]
    assert "GPU 0 (NVML index) skipped" in result.skipped[0]
    with pytest.raises(NvmlUnavailable, match="could open none of its 1 GPUs"):
        read_devices(StandInNvml([h200("00000000:18:00.0")], no_permission={0}), tmp_path)
    with pytest.raises(NvmlUnavailable, match="NVML sees no GPU"):
        read_devices(StandInNvml([]), tmp_path)


def test_read_links_through_binding(tmp_path: Path) -> None:
    """Active NVLinks are read per device with their remote ends, and every pair's PCIe ancestor and P2P status."""
    nvml = StandInNvml([h200("00000000:00:06.0"), h200("00000000:00:07.0", switch_links=16), h200("00000000:00:08.0")])
    result = read_devices(nvml, tmp_path)
    assert [len(gpu.nvlinks) for gpu in result.gpus] == [18, 16, 18]
    assert result.gpus[0].nvlinks[0] == RawNvLink(remote_type=2, remote_bus_id="FFFFFFFF:FF:FF.0")
    assert result.pairs == tuple(
        RawPair(nvml_a=a, nvml_b=b, common_ancestor=30, p2p_nvlink=0) for a, b in ((0, 1), (0, 2), (1, 2))
    )
    assert result.link_problem is None
    assert gpus_from_readings(result).links == (
        GpuLink(a=0, b=1, kind="NVLINK", nvlinks=16),
        GpuLink(a=0, b=2, kind="NVLINK", nvlinks=18),
        GpuLink(a=1, b=2, kind="NVLINK", nvlinks=16),
    )


def test_read_links_pcie_only_and_unsupported(tmp_path: Path) -> None:
    """GPUs without NVLink (Not Supported) have no links; an unsupported ancestor query leaves the pair unknown."""
    pcie = [h200("00000000:01:00.0", switch_links=None), h200("00000000:21:00.0", switch_links=None)]
    result = read_devices(StandInNvml(pcie), tmp_path)
    assert [gpu.nvlinks for gpu in result.gpus] == [(), ()]
    assert gpus_from_readings(result).links == (GpuLink(a=0, b=1, kind="PHB"),)
    result = read_devices(StandInNvml(pcie, unsupported={"ancestor"}), tmp_path)
    assert gpus_from_readings(result).links == ()


def test_link_errors_are_a_warning_not_a_failure(tmp_path: Path) -> None:
    """An NVML error while reading links leaves the GPUs read, the links unknown and a warning."""
    result = read_devices(StandInNvml([h200("00000000:18:00.0"), h200("00000000:2A:00.0")], links_fail=True), tmp_path)
    assert len(result.gpus) == 2
    assert result.pairs is None
    assert result.link_problem is not None and "NVML" in result.link_problem
    facts = gpus_from_readings(result)
    assert facts.links is None
    assert any(warning.startswith("links between GPUs not recorded") for warning in facts.warnings)


# ---- real hardware ----------------------------------------------------------------------


def nvidia_smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed")
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def smi_query() -> dict[str, dict[str, str]]:
    """nvidia-smi's per-GPU CSV, keyed by UUID."""
    fields = ["index", "uuid", "name", "memory.total", "pci.bus_id", "compute_cap"]
    text = nvidia_smi(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    rows = [dict(zip(fields, (cell.strip() for cell in line.split(",")), strict=True)) for line in text.splitlines()]
    return {row["uuid"]: row for row in rows if row.get("uuid")}


def smi_q_value(text: str, key: str) -> str | None:
    match = re.search(rf"^\s*{re.escape(key)}\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    return match.group(1) if match else None


def smi_q_mig(text: str) -> dict[str, str]:
    """Current MIG mode per GPU section of `nvidia-smi -q`, keyed by the section's bus id."""
    modes = {}
    for section in re.split(r"^(?=GPU [0-9A-Fa-f]+:)", text, flags=re.MULTILINE)[1:]:
        bus = section.split()[1]
        match = re.search(r"MIG Mode\s*\n\s*Current\s*:\s*(\S+)", section)
        modes[bus] = match.group(1) if match else "N/A"
    return modes


def topo_numa(text: str) -> dict[int, str]:
    """The 'NUMA Affinity' column of `nvidia-smi topo -m` output per nvidia-smi GPU index; {} if absent."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()
    header = next((line.split("\t") for line in lines if "NUMA Affinity" in line), None)
    if header is None:
        return {}
    column = [cell.strip() for cell in header].index("NUMA Affinity")
    result = {}
    for line in lines:
        cells = line.split("\t")
        if re.fullmatch(r"GPU\d+", cells[0].strip()) and len(cells) > column:
            result[int(cells[0].strip()[3:])] = cells[column].strip()
    return result


def topo_cells(text: str) -> dict[tuple[int, int], str]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m` (NV18, PXB, SYS...) by nvidia-smi index pair (i < j)."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()
    header = next((line.split("\t") for line in lines if "GPU0" in line and not line.startswith("GPU0")), None)
    if header is None:
        return {}
    columns = {
        position: int(cell.strip()[3:]) for position, cell in enumerate(header) if re.fullmatch(r"GPU\d+", cell.strip())
    }
    cells = {}
    for line in lines:
        row = line.split("\t")
        if not re.fullmatch(r"GPU\d+", row[0].strip()):
            continue
        i = int(row[0].strip()[3:])
        for position, j in columns.items():
            if i < j and position < len(row):
                cells[(i, j)] = row[position].strip()
    return cells


TOPO_2GPU = (
    "\x1b[4m\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \t48-95\t1\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n"
)
SMI_Q = """
Driver Version                            : 580.95.05
CUDA Version                              : 13.0

Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    MIG Mode
        Current                           : Disabled
        Pending                           : Disabled
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA GeForce RTX 4090
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
"""


def test_nvidia_smi_parsers() -> None:
    """The helpers that read nvidia-smi's output for the gpu tests parse its known layouts."""
    assert topo_numa(TOPO_2GPU) == {0: "0", 1: "1"}
    assert topo_cells(TOPO_2GPU) == {(0, 1): "NV18"}
    assert topo_cells("no matrix here") == {}
    assert topo_numa("no matrix here") == {}
    assert smi_q_value(SMI_Q, "Driver Version") == "580.95.05"
    assert smi_q_value(SMI_Q, "CUDA Version") == "13.0"
    assert smi_q_mig(SMI_Q) == {"00000000:18:00.0": "Disabled", "00000000:2A:00.0": "N/A"}


@pytest.mark.gpu
def test_probe_matches_nvidia_smi_query() -> None:
    """Every GPU's index, UUID, name, memory, bus id and compute capability match nvidia-smi."""
    facts = gpus_from_readings(read_nvml())
    smi = smi_query()
    assert {gpu.uuid for gpu in facts.gpus} == set(smi)
    reordered = any("nvidia-smi" in warning for warning in facts.warnings)
    for gpu in facts.gpus:
        row = smi[gpu.uuid]
        assert gpu.name == row["name"]
        assert gpu.memory_total_bytes // 2**20 == int(row["memory.total"])
        assert gpu.pci_bus_id == row["pci.bus_id"]
        assert "{}.{}".format(*gpu.compute_capability) == row["compute_cap"]
        assert gpu.memory_free_bytes is not None and 0 <= gpu.memory_free_bytes <= gpu.memory_total_bytes
        if not reordered:
            assert gpu.index == int(row["index"])
    assert [gpu.pci_bus_id for gpu in facts.gpus] == sorted(gpu.pci_bus_id or "" for gpu in facts.gpus)


@pytest.mark.gpu
def test_probe_matches_nvidia_smi_q() -> None:
    """Driver version, CUDA version and each GPU's MIG mode match `nvidia-smi -q`."""
    facts = gpus_from_readings(read_nvml())
    text = nvidia_smi("-q")
    assert facts.driver_version == smi_q_value(text, "Driver Version")
    cuda = smi_q_value(text, "CUDA Version") or smi_q_value(text, "CUDA Driver Version")
    assert facts.cuda_version == cuda
    mig = smi_q_mig(text)
    expected = {"Enabled": True, "Disabled": False}
    for gpu in facts.gpus:
        assert gpu.mig_mode is expected.get(mig[gpu.pci_bus_id or ""])


@pytest.mark.gpu
def test_probe_numa_matches_topology() -> None:
    """Each GPU's NUMA node matches nvidia-smi topo's NUMA affinity; null only where that or sysfs has none."""
    facts = gpus_from_readings(read_nvml())
    by_uuid = {uuid: int(row["index"]) for uuid, row in smi_query().items()}
    topo = topo_numa(nvidia_smi("topo", "-m"))
    if not topo:
        pytest.skip("nvidia-smi topo -m shows no NUMA Affinity column")
    for gpu in facts.gpus:
        shown = topo[by_uuid[gpu.uuid]]
        if not shown.isdigit():
            assert gpu.numa_node is None
        elif gpu.numa_node is not None:
            assert gpu.numa_node == int(shown)
        else:  # unknown to us: only allowed where sysfs says -1 (documented: never guessed)
            assert gpu.pci_bus_id is not None and sysfs_numa_node(gpu.pci_bus_id) is None


@pytest.mark.gpu
def test_probe_links_match_topology() -> None:
    """Every GPU pair's link matches `nvidia-smi topo -m`: NV# as NVLink with # links, else the same PCIe path."""
    facts = gpus_from_readings(read_nvml())
    smi_index = {uuid: int(row["index"]) for uuid, row in smi_query().items()}
    cells = topo_cells(nvidia_smi("topo", "-m"))
    if len(facts.gpus) < 2:
        pytest.skip("one GPU: no links")
    assert facts.links is not None, facts.warnings
    by_pair = {(link.a, link.b): link for link in facts.links}
    for first in facts.gpus:
        for second in facts.gpus[first.index + 1 :]:
            i, j = sorted((smi_index[first.uuid], smi_index[second.uuid]))
            link = by_pair.get((first.index, second.index))
            assert link is not None, f"no link read for GPUs {first.index}-{second.index} (nvidia-smi: {cells[(i, j)]})"
            assert link.label() == cells[(i, j)], f"GPUs {first.index}-{second.index}"
