"""Join one rank's place with its node's hardware map: which GPU UUIDs it uses and the NIC
nearest them. `join_place` reads the Prolog's map (the rim); `join_with_map` is pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scout_slurm.evidence.layout import HARDWARE_MAP_NAME, JobFolder
from scout_slurm.evidence.records import RankPlace
from scout_slurm.evidence.store import read_record
from scout_slurm.hwmap.nvml import resolve_visible_uuids
from scout_slurm.hwmap.records import Affinity, GpuInfo, HardwareMap, NicKind

MAP_NAME = HARDWARE_MAP_NAME  # the name the Prolog writes it under (hooks/prolog.py)
MAX_MAP_BYTES = 4 * 1024 * 1024


def _bare(uuid: str) -> str:
    u = uuid.strip().lower()
    for prefix in ("mig-", "gpu-"):
        if u.startswith(prefix):
            u = u[len(prefix) :]
    return u


def uuid_on_map(device_uuid: str, gpus: Sequence[GpuInfo]) -> str | None:
    """The map's GPU for a UUID the rank's torch reported (bare hex as torch prints it, or
    GPU-...; a MIG instance's names its parent GPU), or None when the map has no such GPU."""
    want = _bare(device_uuid)
    if not want:
        return None
    for gpu in gpus:
        if gpu.uuid and _bare(gpu.uuid) == want:
            return gpu.uuid
        if any(_bare(m) == want for m in gpu.mig_uuids):
            return gpu.uuid
    return None


def device_gpu(device_uuid: str, hwmap: HardwareMap | None) -> str:
    """The GPU a recorded device UUID names: the map's UUID for it, else the UUID itself in
    NVML's form (a GPU the map does not list is still that GPU, never another by index)."""
    found = uuid_on_map(device_uuid, hwmap.gpus) if hwmap is not None else None
    if found:
        return found
    u = device_uuid.strip()
    return u if u.upper().startswith(("GPU-", "MIG-")) else f"GPU-{u}"


def rank_gpus(place: RankPlace, hwmap: HardwareMap) -> tuple[str, ...]:
    """The GPUs a rank uses. The UUID its own torch reported for its device, when recorded (the
    bootstrap's, by UUID: Slurm's cgroups renumber CUDA_VISIBLE_DEVICES and CUDA's order need
    not be PCI order). Else those CUDA_VISIBLE_DEVICES leaves it, and when it leaves several,
    the one at LOCAL_RANK among them (torchrun's and `cuda.set_device(local_rank)`'s
    convention; a rank that drives several GPUs itself is named by its first)."""
    if place.device_uuid:
        return (device_gpu(place.device_uuid, hwmap),)
    visible = resolve_visible_uuids(place.cuda_visible_devices, hwmap.gpus)
    if len(visible) <= 1:
        return visible
    return (visible[place.local_rank % len(visible)],)


def rank_nic(gpu_uuids: tuple[str, ...], hwmap: HardwareMap) -> str:
    """The NIC nearest the rank's first GPU; without one, the first InfiniBand interface that is
    up, else the first Ethernet one (a guess: NCCL and gloo may be told otherwise)."""
    for link in hwmap.gpu_nic_affinity:
        if (
            gpu_uuids
            and link.gpu_uuid == gpu_uuids[0]
            and link.how is not Affinity.NONE
            and link.nic
        ):
            return link.nic
    for kind in (NicKind.INFINIBAND, NicKind.ETHERNET):
        for nic in hwmap.nics:
            if nic.kind is kind and nic.operstate == "up":
                return nic.name
    return ""


def join_with_map(place: RankPlace, hwmap: HardwareMap) -> RankPlace:
    """`place` with gpu_uuids and nic filled from the node's map (a NIC already set is kept)."""
    gpus = rank_gpus(place, hwmap)
    return dataclasses.replace(
        place,
        gpu_uuids=gpus,
        nic=place.nic or rank_nic(gpus, hwmap),
        gpu_from="device" if place.device_uuid else "index" if gpus else "",
    )


def read_node_map(folder: JobFolder, node: str) -> HardwareMap:
    """The Prolog's map of `node`; EvidenceError (a ScoutError) when absent or unsafe."""
    return read_record(
        folder.hardware_map_path(node), HardwareMap, max_bytes=MAX_MAP_BYTES, root=folder.root
    )


def join_place(folder: JobFolder, place: RankPlace) -> RankPlace:
    """What the task shim calls: the rank's place joined with its node's map."""
    return join_with_map(place, read_node_map(folder, place.node))
