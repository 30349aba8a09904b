"""Reading rank places and node maps from the evidence folder for `scout map` (works after the
job, the allocation and the node are gone: everything comes from the records)."""

from __future__ import annotations

from pathlib import Path

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import RANK_PLACES, JobFolder
from scout_slurm.evidence.records import RankPlace
from scout_slurm.evidence.store import list_records, read_record
from scout_slurm.hwmap.records import HardwareMap


def read_places(folder: JobFolder, restart: int) -> tuple[list[RankPlace], list[str]]:
    d = folder.ranks_dir(restart)
    if not d.is_dir():
        return [], [f"{d}: no rank records"]
    return list_records(d, RANK_PLACES, RankPlace, root=folder.root)


def read_maps(folder: JobFolder, nodes: set[str]) -> tuple[dict[str, HardwareMap], list[str]]:
    maps, problems = {}, []
    for node in sorted(nodes):
        path = folder.hardware_map_path(node)
        if not path.exists():
            problems.append(f"{path}: no hardware map (Prolog not installed, or it failed)")
            continue
        try:
            maps[node] = read_record(path, HardwareMap, root=folder.root)
        except EvidenceError as exc:
            problems.append(str(exc))
    return maps, problems


def all_places(
    root: Path, *, limit_jobs: int = 100_000
) -> tuple[list[tuple[str, RankPlace]], list[str]]:
    out, problems = [], []
    if not root.is_dir():
        return out, [f"{root}: evidence root does not exist"]
    for cluster in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        jobs = [
            j for j in cluster.iterdir() if j.name.isdigit() and j.is_dir() and not j.is_symlink()
        ]
        for job in sorted(jobs, key=lambda j: int(j.name))[-limit_jobs:]:
            folder = JobFolder(root, cluster.name, int(job.name))
            for restart in folder.restarts():
                places, errs = read_places(folder, restart)
                out += [(cluster.name, p) for p in places]
                problems += errs
    return out, problems
