"""The incident bundle: everything the incident page shows about one run, as typed records, and
the moments of the incident (fault, last advance, detection, verdict, actions) derived from them
(pure). `report/bundle_loader.py` fills a bundle from the evidence folder; `report/html.py` draws
it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scout_slurm.evidence.history import ProgressSample
from scout_slurm.evidence.records import (
    ExitRecord,
    FindingKind,
    JobEvidence,
    Verdict,
    VerdictKind,
    is_fault_injection,
)
from scout_slurm.localise.verdict import is_abnormal, is_cascade
from scout_slurm.remediation.records import ActionKind, ActionsRecord, ResumeInstruction
from scout_slurm.report.map_table import RankMapRow


@dataclass(frozen=True)
class IncidentBundle:
    """One run of one job, as the incident page shows it.

    verdict/evidence: what the localiser saw and said; actions: the remediation record (None when
    none was planned); history: per rank, the bounded progress samples (evidence/history.py),
    oldest first, empty where the run kept none; hardware: one row per rank (report/map_table.py);
    drained: nodes scout drained for this run (from the actions' results); resume: the checkpoint
    the rerun was told to load; verdict_computed: the verdict was computed now, not recorded by
    the Epilog; problems: what could not be read, said on the page."""

    cluster: str
    verdict: Verdict
    evidence: JobEvidence
    actions: ActionsRecord | None = None
    history: Mapping[int, tuple[ProgressSample, ...]] = field(default_factory=dict)
    hardware: tuple[RankMapRow, ...] = ()
    resume: ResumeInstruction | None = None
    verdict_computed: bool = False
    problems: tuple[str, ...] = ()
    # the suspects' dumped stacks: (rank, the current thread's frames or the dump's last lines)
    stacks: tuple[tuple[int, tuple[str, ...]], ...] = ()
    # torch's Flight Recorder: where each rank was in its collectives (report lines)
    flight_recorder: tuple[str, ...] = ()
    schema_version: int = 1

    @property
    def job_id(self) -> int:
        return self.verdict.job_id

    @property
    def restart(self) -> int:
        return self.verdict.restart

    @property
    def suspect_ranks(self) -> frozenset[int]:
        return frozenset(s.rank for s in self.verdict.suspects)

    @property
    def drained(self) -> tuple[str, ...]:
        if self.actions is None:
            return ()
        return tuple(
            dict.fromkeys(
                r.target for r in self.actions.results if r.ok and r.kind == ActionKind.DRAIN
            )
        )


@dataclass(frozen=True)
class IncidentMoments:
    """Wall-clock moments of one incident, 0.0 where unknown. Clocks of different nodes are not
    synchronised to the millisecond: intervals across nodes are approximate."""

    fault_at: float  # the injected fault (injection finding); unknown for a real fault
    last_advance_at: float  # the first suspect's last progress advance
    detected_at: float  # stall decision, numerical finding, or the first primary exit
    verdict_at: float
    actions_done_at: float  # the last remediation action that succeeded
    schema_version: int = 1

    @property
    def origin(self) -> float:
        """Where latency is counted from: the fault when known, else the last advance."""
        return self.fault_at or self.last_advance_at

    def phases(self) -> list[tuple[str, float, float]]:
        """(label, start, end) of each phase that both ends of are known, in order."""
        points = [
            ("fault" if self.fault_at else "last progress", self.origin),
            ("detection", self.detected_at),
            ("verdict", self.verdict_at),
            ("actions done", self.actions_done_at),
        ]
        known = [(n, t) for n, t in points if t > 0]
        out = []
        for (n0, t0), (n1, t1) in zip(known, known[1:]):
            out.append((f"{n0} -> {n1}", t0, max(t0, t1)))
        return out


def last_advance(samples: tuple[ProgressSample, ...]) -> float:
    """The time of the first sample that shows the rank's final position (0.0 without samples)."""
    if not samples:
        return 0.0
    final = (samples[-1].opt_steps, samples[-1].coll_entered, samples[-1].coll_completed)
    at = samples[-1].at
    for s in reversed(samples):
        if (s.opt_steps, s.coll_entered, s.coll_completed) != final:
            break
        at = s.at
    return at


def rank_last_advance(bundle: IncidentBundle, rank: int) -> float:
    samples = bundle.history.get(rank, ())
    p = bundle.evidence.last_progress(rank)
    from_snapshot = (
        max(0.0, p.published_at - p.idle_s) if p is not None and p.published_at > 0 else 0.0
    )
    if samples:
        at = last_advance(samples)
        # the ring holds only the last samples: when none of them moved, the advance is older than
        # the ring and the last snapshot's idle time says when it was
        return from_snapshot if at == samples[0].at and len(samples) > 1 and from_snapshot else at
    return from_snapshot


PRIMARY_SCAN_LIMIT = (
    4096  # exits scanned for primary failures; beyond, the verdict's reasoning says it
)


def primary_exits(ev: JobEvidence) -> list[ExitRecord]:
    """Exits that failed on their own, first first ([] for a world larger than
    PRIMARY_SCAN_LIMIT).
    """
    if len(ev.exits) > PRIMARY_SCAN_LIMIT:
        return []
    return sorted(
        (e for e in ev.exits.values() if is_abnormal(e) and not is_cascade(e)), key=lambda e: e.at
    )


def incident_moments(bundle: IncidentBundle) -> IncidentMoments:
    ev, v = bundle.evidence, bundle.verdict
    injected = [f.at for f in ev.findings if is_fault_injection(f)]
    suspects = [s.rank for s in v.suspects]
    advances = [a for a in (rank_last_advance(bundle, r) for r in suspects) if a > 0]
    detected = 0.0
    if ev.decision is not None:
        detected = ev.decision.at
    elif v.kind in (VerdictKind.SDC, VerdictKind.STRAGGLER):
        kind = FindingKind.SDC if v.kind == VerdictKind.SDC else FindingKind.STRAGGLER
        detected = min((f.at for f in ev.findings if f.kind == kind), default=0.0)
    if not detected:
        # the suspects' own exits only: a cascade check of every rank's stderr costs seconds at 100k
        # ranks
        primary = [
            e.at
            for r in suspects
            if (e := ev.exits.get(r)) is not None and is_abnormal(e) and not is_cascade(e)
        ]
        detected = min(primary, default=0.0) or v.first_failure_at
    done = 0.0
    if bundle.actions is not None:
        done = max((r.at for r in bundle.actions.results if r.ok), default=0.0)
    return IncidentMoments(
        fault_at=min(injected, default=0.0),
        last_advance_at=min(advances, default=0.0),
        detected_at=detected,
        verdict_at=v.created_at,
        actions_done_at=done,
    )
