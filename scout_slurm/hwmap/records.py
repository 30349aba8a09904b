"""The hardware-map record: what one node had when a job started (frozen, versioned, JSON)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar


class NicKind(str, enum.Enum):
    ETHERNET = "ethernet"
    INFINIBAND = "infiniband"
    LOOPBACK = "loopback"
    VIRTUAL = "virtual"  # bridge, bond, veth, ifb, tun: no device of its own


class Affinity(str, enum.Enum):
    """How near a NIC is to a GPU, best first."""

    SAME_PCI_SWITCH = "same-pci-switch"  # both below one PCI bridge (switch or root port)
    SAME_NUMA = "same-numa"  # same NUMA node, or same host bridge when NUMA is unknown
    NONE = "none"  # nothing in common, or nothing to compare


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML's index (not CUDA's: see nvml.resolve_visible_uuids)
    uuid: str  # GPU-xxxxxxxx-...
    serial: str  # board serial; "" when NVML does not say
    pci_bus_id: str  # sysfs form: 0000:04:00.0 (4-digit domain, lower case)
    name: str
    driver_version: str
    cuda_driver_version: str  # "12.4"
    ecc_mode: str  # "enabled", "disabled", "unknown"
    numa_node: int  # from sysfs; -1 unknown
    mig_uuids: tuple[str, ...] = ()  # MIG-... of the instances on this GPU, when MIG is on


@dataclass(frozen=True)
class NicInfo:
    name: str
    mac: str
    pci_address: str  # "" for a virtual interface
    numa_node: int  # -1 unknown
    speed_mbps: int  # -1 unknown (link down, virtual, or the driver does not say)
    operstate: str  # up, down, unknown, ...
    kind: NicKind


@dataclass(frozen=True)
class IbPort:
    hca: str  # mlx5_0
    port: int
    guid: str  # port GUID (from gids/0), else the HCA's node GUID; 0x-prefixed
    state: str  # "4: ACTIVE"
    rate: str  # "200 Gb/sec (4X HDR)"
    link_layer: str  # InfiniBand or Ethernet (RoCE)


@dataclass(frozen=True)
class GpuNic:
    gpu_uuid: str
    nic: str  # "" when there is no candidate NIC
    how: Affinity


@dataclass(frozen=True)
class HardwareMap:
    KIND: ClassVar[str] = "hardware-map"
    node: str  # Slurm's node name
    hostname: str  # the kernel's host name (equal for every slurmd -N node on one machine)
    boot_id: str
    kernel: str
    cpu_model: str
    cpu_sockets: int
    memory_bytes: int
    gpus: tuple[GpuInfo, ...]
    nics: tuple[NicInfo, ...]
    ib_ports: tuple[IbPort, ...]
    gpu_nic_affinity: tuple[GpuNic, ...]
    nvml_status: str  # "ok", "no-library", "no-gpu", "error: ..."
    problems: tuple[str, ...]  # everything that could not be read, each naming the file or call
    collected_at: float
    duration_s: float
    schema_version: int = 1

    def gpu_by_uuid(self, uuid: str) -> GpuInfo | None:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None

    def gpu_by_pci(self, address: str) -> GpuInfo | None:
        return gpu_at_pci(self.gpus, address)

    @property
    def nvml_failed(self) -> bool:
        """NVML answered but reported an error (not: no library, no GPU)."""
        return self.nvml_status.startswith("error")


def gpu_at_pci(gpus: Sequence[GpuInfo], address: str) -> GpuInfo | None:
    """The GPU at a PCI address as the kernel log prints it: a full `dddd:bb:dd.f`, or the NVIDIA
    driver's `dddd:bb:dd` (an Xid names no function: a GPU is function 0 of its device). Both
    sides in lower case; the map's addresses are sysfs' form (`normalise_pci_address`)."""
    address = address.strip().lower()
    if address.count(":") != 2:
        return None
    if "." not in address:
        address += ".0"
    for gpu in gpus:
        if gpu.pci_bus_id.lower() == address:
            return gpu
    return None
