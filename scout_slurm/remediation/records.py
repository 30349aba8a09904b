"""Plan and outcome records of the remediation, and the resume instruction for the rerun."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from scout_slurm.errors import SlurmError
from scout_slurm.evidence.records import (  # noqa: F401 (re-exported: the job writes these; hooks/ckptcheck.py imports them from here)
    Agreement,
    CheckpointCheck,
    CheckpointChecks,
    CheckpointFile,
    CheckpointNote,
    CoverageSince,
    SoftwareVersions,
    StateSignature,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.slurm.hostlist import compress_hostlist


class ActionKind(str, enum.Enum):
    DRAIN = "drain"
    REQUEUE = "requeue"
    EXCLUDE = "exclude"
    RESUME_FROM = "resume_from"


class CheckpointStatus(str, enum.Enum):
    """A checkpoint as the recovery rule sees it (remediation/eligibility.py decides which)."""

    ELIGIBLE = "eligible"
    CANDIDATE = "candidate"
    REJECTED = "rejected"


class PlanStatus(str, enum.Enum):
    PLANNED = "planned"
    APPLIED = "applied"
    PARTIAL = "partial"  # some actions done; the rest pending (Slurm did not answer)
    PENDING = "pending"  # nothing could be applied yet; kept for a retry
    OBSERVE_ONLY = "observe-only"
    NOTHING_TO_DO = "nothing-to-do"


@dataclass(frozen=True)
class Drain:
    """Drain one node (one action a node: the reason names the ranks that ran there, and a hook
    killed between two drains resumes with the next node)."""

    node: str
    reason: str  # the `scout:` reason Slurm shows, pointing at the evidence


@dataclass(frozen=True)
class Requeue:
    job_id: int


@dataclass(frozen=True)
class Exclude:
    """Set the job's excluded nodes to `nodes`: what it excluded before plus the drained ones."""

    job_id: int
    nodes: tuple[str, ...]

    @property
    def hostlist(self) -> str:
        """Slurm's short form (`n[1,3,7]`); a list that is not valid host names (a record from
        elsewhere: the plan checks the names it writes) is shown as it is, for people."""
        try:
            return compress_hostlist(list(self.nodes))
        except SlurmError:
            return ",".join(self.nodes)


@dataclass(frozen=True)
class ResumeFrom:
    """The checkpoint the rerun loads: the newest eligible one before the first suspect step."""

    checkpoint: str
    step: int
    first_suspect_step: int  # -1: unknown (any recorded step was eligible)
    rule: str  # what the recovery rule said of the choice ("" when nothing more)
    chosen_as: CheckpointStatus | None = (
        None  # the newest eligible or, failing that, candidate; None: not assessed
    )

    def describe(self) -> str:
        return f"step {self.step}, before first suspect step {self.first_suspect_step}" + (
            f"; {self.rule}" if self.rule else ""
        )


ActionPayload = Drain | Requeue | Exclude | ResumeFrom
KIND_OF: dict[type, ActionKind] = {
    Drain: ActionKind.DRAIN,
    Requeue: ActionKind.REQUEUE,
    Exclude: ActionKind.EXCLUDE,
    ResumeFrom: ActionKind.RESUME_FROM,
}


@dataclass(frozen=True)
class PlannedAction:
    """One action of a plan: a typed payload, its kind read from the payload's type (in the JSON
    the payload's fields tell the four apart: each has a field set of its own). Build one with
    `PlannedAction.of(payload)`."""

    payload: ActionPayload

    @classmethod
    def of(cls, payload: ActionPayload) -> PlannedAction:
        return cls(payload)

    @property
    def kind(self) -> ActionKind:
        return KIND_OF[type(self.payload)]

    @property
    def target(self) -> str:
        """What the action is applied to, as its result records it: node, job id or checkpoint
        path.
        """
        p = self.payload
        if isinstance(p, Drain):
            return p.node
        if isinstance(p, (Requeue, Exclude)):
            return str(p.job_id)
        return p.checkpoint

    def describe(self) -> str:
        p = self.payload
        if isinstance(p, Drain):
            return f"drain node {p.node}: {p.reason}"
        if isinstance(p, Requeue):
            return f"requeue job {p.job_id}"
        if isinstance(p, Exclude):
            return f"set job {p.job_id} excluded nodes to {p.hostlist}"
        return f"resume from checkpoint {p.checkpoint} ({p.describe()})"


@dataclass(frozen=True)
class ActionResult:
    kind: ActionKind
    target: str
    ok: bool
    message: str
    attempts: int
    at: float


@dataclass(frozen=True)
class ActionsRecord:
    KIND: ClassVar[str] = "actions"
    job_id: int
    restart: int
    verdict_kind: VerdictKind
    status: PlanStatus
    actions: tuple[PlannedAction, ...]
    held_back: tuple[str, ...]  # what a guard stopped, and why
    results: tuple[ActionResult, ...]
    created_at: float
    updated_at: float
    # 2: typed action payloads (version 1 held each action as target and detail text, which this
    # scout does not parse: such a file is refused by name and version, not called corrupt)
    OLDEST_SCHEMA_VERSION: ClassVar[int] = 2
    schema_version: int = 2

    def done(self) -> set[tuple[ActionKind, str]]:
        return {(r.kind, r.target) for r in self.results if r.ok}


@dataclass(frozen=True)
class RejectedCheckpoint:
    """A checkpoint the recovery rule rejected whose file is still on storage as it was noted."""

    path: str
    step: int
    restart: int  # the run that saved it
    why: str
    schema_version: int = 1


@dataclass(frozen=True)
class RerunCheckpoints:
    """Written by the controller for run `restart` when it requeues a job (results/, read by that
    run's scout-task): the recovery point it chose ("" when none) and the checkpoints on storage
    it rejected, so that the rerun can tell what it actually loads (bootstrap/ckptstate.py)."""

    KIND: ClassVar[str] = "rerun-checkpoints"
    job_id: int
    restart: int
    recovery_point: str
    recovery_step: int  # -1 when none
    rejected: tuple[RejectedCheckpoint, ...]
    schema_version: int = 1


@dataclass(frozen=True)
class ResumeInstruction:
    """Written for run `restart`: which checkpoint to load (read by that run's scout-task)."""

    KIND: ClassVar[str] = "resume"
    job_id: int
    restart: int
    checkpoint: str
    step: int
    reason: str
    schema_version: int = 1
