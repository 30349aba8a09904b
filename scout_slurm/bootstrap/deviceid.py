"""The GPU a rank uses, from the rank itself: the UUID torch reports for the device its parameters
are on, written into the rank's place record and joined with the Prolog's map by UUID (never by
index: Slurm's cgroups renumber CUDA_VISIBLE_DEVICES, and CUDA's order need not be PCI order).
`record` is the one function that reaches outside (the evidence folder)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


def device_uuid(t: Any) -> str:
    """The UUID torch reports for the CUDA device tensor `t` is on; "" for any other device.
    Reads properties of a device the job already uses: creates no context elsewhere."""
    if t.device.type != "cuda":
        return ""
    import torch

    return str(torch.cuda.get_device_properties(t.device).uuid)


def record(run_dir: Path, rank: int, uuid: str) -> Any:
    """Rewrite rank `rank`'s place with `uuid` and the GPU it names in the node's map; the new
    place, or None where there is no place of this rank's to rewrite (a hand-run job; under
    torchrun places are per Slurm task, not per torch rank)."""
    from scout_slurm.errors import ScoutError
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.records import RankPlace
    from scout_slurm.evidence.store import read_record, write_record
    from scout_slurm.hwmap.join import device_gpu, join_with_map, read_node_map

    try:
        folder, restart = JobFolder.of_run_dir(run_dir)
        path = folder.rank_place_path(restart, rank)
        place = read_record(path, RankPlace)
    except ScoutError:
        return None
    if place.launcher == "torchrun" or place.rank != rank:
        return None
    place = dataclasses.replace(place, device_uuid=uuid)
    try:
        hwmap = read_node_map(folder, place.node)
    except ScoutError:  # no map of this node: the UUID alone still names the GPU
        place = dataclasses.replace(place, gpu_uuids=(device_gpu(uuid, None),), gpu_from="device")
    else:
        place = join_with_map(dataclasses.replace(place, nic=""), hwmap)
    write_record(path, place)
    return place
