"""Incident history across jobs, from the verdicts and action records in the evidence root."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.records import ActionKind, ActionsRecord


@dataclass(frozen=True)
class IncidentRow:
    cluster: str
    job_id: int
    restart: int
    kind: str
    confidence: float
    suspects: tuple[tuple[int, str], ...]
    drained: tuple[str, ...]
    created_at: float

    def as_dict(self) -> dict:
        return asdict(self)


def list_incidents(root: Path, *, node: str | None = None, limit: int = 20) -> list[IncidentRow]:
    rows: list[IncidentRow] = []
    if not root.is_dir():
        return rows
    for cluster in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        for job in cluster.iterdir():
            if not job.name.isdigit() or job.is_symlink():
                continue
            for vpath in (job / "results").glob("verdict-*.json"):
                try:
                    v = read_record(vpath, Verdict, root=root)
                except EvidenceError:
                    continue
                if v.kind in (VerdictKind.CLEAN, VerdictKind.UNCHECKED):
                    continue
                drained: tuple[str, ...] = ()
                apath = job / "results" / f"actions-{v.restart}.json"
                if apath.exists():
                    try:
                        a = read_record(apath, ActionsRecord, root=root)
                        drained = tuple(r.target for r in a.results if r.ok and r.kind == ActionKind.DRAIN)
                    except EvidenceError:
                        pass
                suspects = tuple((s.rank, s.node) for s in v.suspects)
                if node and node not in {s[1] for s in suspects} | set(drained):
                    continue
                rows.append(IncidentRow(cluster.name, v.job_id, v.restart, v.kind.value, v.confidence, suspects,
                                        drained, v.created_at))
    rows.sort(key=lambda r: r.created_at, reverse=True)
    return rows[:limit]


@dataclass(frozen=True)
class PendingRow:
    """An incident whose handling began and has not ended (hooks/pending.py)."""
    cluster: str
    job_id: int
    restart: int
    since: float
    holder: str
    status: str              # the actions record's status, or "not planned yet"

    def as_dict(self) -> dict:
        return asdict(self)


def list_pending(root: Path) -> list[PendingRow]:
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.hooks.pending import list_markers
    rows: list[PendingRow] = []
    if not root.is_dir():
        return rows
    for cluster in sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink()):
        try:
            any_job = JobFolder(root, cluster.name, 1)
        except EvidenceError:
            continue
        for m in list_markers(any_job):
            folder = JobFolder(root, cluster.name, m.job_id)
            status = "not planned yet"
            if folder.actions_path(m.restart).exists():
                try:
                    status = read_record(folder.actions_path(m.restart), ActionsRecord, root=root).status.value
                except EvidenceError as exc:
                    status = f"unreadable actions record ({exc})"
            rows.append(PendingRow(cluster.name, m.job_id, m.restart, m.since, m.holder, status))
    return rows
