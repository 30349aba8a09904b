"""Incident history across jobs, read from the evidence root: the incidents (verdicts and actions
records, `scout incidents`), those whose handling has not ended (`scout incidents --pending`), and
the drain rule's history of each node and GPU serial some incident named (`past_incidents`, read by
the gather stage; `scout suspects`). A reader: it writes nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import DRAIN_DECISIONS, VERDICTS, JobFolder
from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.plan import DrainDecisions, PastIncident
from scout_slurm.remediation.records import ActionKind, ActionsRecord
from scout_slurm.slurm.parse import NodeInfo


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
            folder = _job_folder(root, cluster.name, job.name)
            if folder is None:
                continue
            for vpath in folder.results_dir.glob(VERDICTS):
                try:
                    v = read_record(vpath, Verdict, root=root)
                except EvidenceError:
                    continue
                if v.kind in (VerdictKind.CLEAN, VerdictKind.UNCHECKED):
                    continue
                drained: tuple[str, ...] = ()
                apath = folder.actions_path(v.restart)
                if apath.exists():
                    try:
                        a = read_record(apath, ActionsRecord, root=root)
                        drained = tuple(
                            r.target for r in a.results if r.ok and r.kind == ActionKind.DRAIN
                        )
                    except EvidenceError:
                        pass
                suspects = tuple((s.rank, s.node) for s in v.suspects)
                if node and node not in {s[1] for s in suspects} | set(drained):
                    continue
                rows.append(
                    IncidentRow(
                        cluster.name,
                        v.job_id,
                        v.restart,
                        v.kind.value,
                        v.confidence,
                        suspects,
                        drained,
                        v.created_at,
                    )
                )
    rows.sort(key=lambda r: r.created_at, reverse=True)
    return rows[:limit]


@dataclass(frozen=True)
class PendingRow:
    """An incident whose handling began and has not ended (incident/pending.py)."""

    cluster: str
    job_id: int
    restart: int
    since: float
    holder: str
    status: str  # the actions record's status, or "not planned yet"

    def as_dict(self) -> dict:
        return asdict(self)


def list_pending(root: Path) -> list[PendingRow]:
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.incident.pending import list_markers

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
                    status = read_record(
                        folder.actions_path(m.restart), ActionsRecord, root=root
                    ).status.value
                except EvidenceError as exc:
                    status = f"unreadable actions record ({exc})"
            rows.append(PendingRow(cluster.name, m.job_id, m.restart, m.since, m.holder, status))
    return rows


# --- the drain rule's history: what each incident decided for each node it named ----------------


def _decision_records(
    root: Path, cluster: str | None, *, since: float = 0.0
) -> list[DrainDecisions]:
    """Every results/drain-decisions-*.json under the evidence root (one cluster's, or all),
    written since `since` (a file older than that by its mtime is not opened)."""
    out: list[DrainDecisions] = []
    if not root.is_dir():
        return out
    clusters = (
        [root / cluster]
        if cluster
        else sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    )
    for cdir in clusters:
        if not cdir.is_dir() or cdir.is_symlink():
            continue
        for job in cdir.iterdir():
            if not job.name.isdigit() or job.is_symlink():
                continue
            folder = _job_folder(root, cdir.name, job.name)
            if folder is None:
                continue
            for path in folder.results_dir.glob(DRAIN_DECISIONS):
                try:
                    if path.stat().st_mtime < since:
                        continue
                    out.append(read_record(path, DrainDecisions, root=root))
                except (OSError, EvidenceError):
                    continue
    return out


def past_incidents(root: Path, cluster: str, *, since: float) -> list[PastIncident]:
    """The earlier incidents the drain rule counts: those where it ran (drained or watched a
    node).
    """
    return [
        PastIncident(
            job_id=r.job_id,
            user=r.user,
            node=n.node,
            gpu_serials=n.gpu_serials,
            kind=r.kind.value,
            at=r.at,
        )
        for r in _decision_records(root, cluster, since=since)
        if r.at >= since
        for n in r.nodes
        if n.outcome in ("drain", "watch")
    ]


@dataclass(frozen=True)
class SuspectIncident:
    cluster: str
    job_id: int
    restart: int
    user: str
    kind: str
    at: float
    outcome: str
    why: str
    root_checks: tuple[str, ...]
    root_findings: tuple[str, ...]


@dataclass(frozen=True)
class SuspectRow:
    """One node or GPU serial with the incidents that named it (`scout suspects`)."""

    what: str  # "node" or "gpu"
    name: str  # node name or GPU serial
    incidents: tuple[SuspectIncident, ...]
    # the node as Slurm says it is now ("" for a GPU, or when Slurm was not asked or not answering)
    slurm_state: str = ""
    drained_now: bool | None = None

    @property
    def users(self) -> tuple[str, ...]:
        return tuple(sorted({i.user for i in self.incidents}))

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({i.kind for i in self.incidents}))

    @property
    def status(self) -> str:
        """ "drained" when an incident drained it and Slurm still has it drained, "undrained" when
        it was drained and has been returned to service since (`scout undrain`, an operator), else
        "watch" (on the watch list), else "held"."""
        outcomes = {i.outcome for i in self.incidents}
        if "drain" in outcomes:
            return "undrained" if self.drained_now is False else "drained"
        return "watch" if "watch" in outcomes else "held"

    def as_dict(self) -> dict:
        return {
            "what": self.what,
            "name": self.name,
            "status": self.status,
            "slurm_state": self.slurm_state,
            "users": list(self.users),
            "kinds": list(self.kinds),
            "incidents": [asdict(i) for i in self.incidents],
        }


def list_suspects(
    root: Path, *, gpu: str | None = None, node_states: Mapping[str, NodeInfo] | None = None
) -> list[SuspectRow]:
    """Every node and GPU serial some incident named, newest incident first within each; only
    GPU serial `gpu` when given. `node_states`: Slurm's word on each node now (None: not asked)."""
    by: dict[tuple[str, str], list[SuspectIncident]] = {}
    for cdir in (
        sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
        if root.is_dir()
        else []
    ):
        for r in _decision_records(root, cdir.name):
            for n in r.nodes:
                inc = SuspectIncident(
                    cdir.name,
                    r.job_id,
                    r.restart,
                    r.user,
                    r.kind.value,
                    r.at,
                    n.outcome,
                    n.why,
                    n.root_checks,
                    n.root_findings,
                )
                keys = [("gpu", s) for s in n.gpu_serials if s]
                if gpu is None:
                    keys.append(("node", n.node))
                for key in keys:
                    if gpu is None or key[1] == gpu:
                        by.setdefault(key, []).append(inc)
    states = node_states or {}
    rows = [
        SuspectRow(
            what,
            name,
            tuple(sorted(incs, key=lambda i: i.at, reverse=True)),
            slurm_state=states[name].state_text if what == "node" and name in states else "",
            drained_now=states[name].is_drained if what == "node" and name in states else None,
        )
        for (what, name), incs in by.items()
    ]
    return sorted(rows, key=lambda r: (r.what != "node", r.name))


def render_suspects(rows: list[SuspectRow]) -> str:
    """`scout suspects` as text: a line per node or GPU, then a line per incident (pure)."""
    import time

    lines = []
    for r in rows:
        now = f" (Slurm: {r.slurm_state})" if r.slurm_state else ""
        lines.append(
            f"{r.what} {r.name}: {r.status}{now}; {len(r.incidents)} incident(s) from "
            f"{len(r.users)} user(s) "
            f"({', '.join(r.users)}); kinds {', '.join(r.kinds)}"
        )
        for i in r.incidents:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(i.at))
            lines.append(
                f"  {when} job {i.job_id} run {i.restart} {i.user} {i.kind}: {i.outcome}: {i.why}"
            )
            if i.root_checks:
                lines.append(f"    root checks: {', '.join(i.root_checks)}")
            for f in i.root_findings[:5]:
                lines.append(f"    root found: {f}")
    return "\n".join(lines) + ("\n" if lines else "")


def _job_folder(root: Path, cluster: str, job: str) -> JobFolder | None:
    """The job folder of a listed `<root>/<cluster>/<job>` (None for names the layout refuses)."""
    try:
        return JobFolder(root, cluster, int(job))
    except (EvidenceError, ValueError):
        return None
