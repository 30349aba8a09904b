"""The rank-to-hardware table (`scout map JOBID`): each rank's place joined with its node's
hardware map (pure: records in, rows and text out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.evidence.records import RankPlace
from scout_slurm.hwmap.records import HardwareMap

UNKNOWN = "?"


@dataclass(frozen=True)
class RankMapRow:
    rank: int
    local_rank: int
    node: str
    hostname: str
    gpu_uuids: tuple[str, ...]
    gpu_serials: tuple[
        str, ...
    ]  # one per UUID, in the same order; "?" when the map does not know it
    nic: str
    map_missing: bool = False  # no hardware map for this node: serials are unknown


def rank_map_rows(places: Sequence[RankPlace], maps: Mapping[str, HardwareMap]) -> list[RankMapRow]:
    """One row per rank, ordered by rank. A rank's GPU serials are found by UUID in its node's
    map; a rank recorded twice keeps its first place (the later ones are the same rank's retries
    or a forged file, and the first is what the job started with)."""
    seen: dict[int, RankPlace] = {}
    for place in places:
        seen.setdefault(place.rank, place)
    rows = []
    for rank in sorted(seen):
        place = seen[rank]
        hwmap = maps.get(place.node)
        serials = []
        for uuid in place.gpu_uuids:
            gpu = hwmap.gpu_by_uuid(uuid) if hwmap is not None else None
            serials.append(gpu.serial if gpu is not None and gpu.serial else UNKNOWN)
        rows.append(
            RankMapRow(
                rank=place.rank,
                local_rank=place.local_rank,
                node=place.node,
                hostname=place.hostname or (hwmap.hostname if hwmap is not None else ""),
                gpu_uuids=tuple(place.gpu_uuids),
                gpu_serials=tuple(serials),
                nic=place.nic,
                map_missing=hwmap is None,
            )
        )
    return rows


_HEADERS = ("RANK", "LOCAL", "NODE", "HOSTNAME", "GPU UUID", "GPU SERIAL", "NIC")


def _cells(row: RankMapRow) -> tuple[str, ...]:
    return (
        str(row.rank),
        str(row.local_rank),
        row.node + (" (no map)" if row.map_missing else ""),
        row.hostname or UNKNOWN,
        ",".join(row.gpu_uuids) or "-",
        ",".join(row.gpu_serials) or "-",
        row.nic or "-",
    )


def render_rank_map_table(rows: Sequence[RankMapRow]) -> str:
    """A plain text table, one line per rank, columns padded to their widest cell."""
    if not rows:
        return "no ranks recorded\n"
    table = [_HEADERS] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADERS))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class PlaceHistoryRow:
    cluster: str
    job_id: int
    restart: int
    rank: int
    node: str
    gpu_uuids: tuple[str, ...]
    started_at: float


def history_rows(
    entries: Sequence[tuple[str, RankPlace]], *, node: str | None = None, gpu: str | None = None
) -> list[PlaceHistoryRow]:
    """The ranks that ran on a node or a GPU, across jobs, newest first (pure)."""
    rows = []
    for cluster, p in entries:
        if node is not None and p.node != node:
            continue
        if gpu is not None and not any(u == gpu or u.startswith(gpu) for u in p.gpu_uuids):
            continue
        rows.append(
            PlaceHistoryRow(
                cluster, p.job_id, p.restart, p.rank, p.node, tuple(p.gpu_uuids), p.started_at
            )
        )
    rows.sort(key=lambda r: (-r.started_at, r.job_id, r.rank))
    return rows
