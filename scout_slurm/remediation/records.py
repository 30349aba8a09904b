"""Plan and outcome records of the remediation, and the resume instruction for the rerun."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from scout_slurm.evidence.records import VerdictKind


class ActionKind(str, enum.Enum):
    DRAIN = "drain"
    REQUEUE = "requeue"
    EXCLUDE = "exclude"
    RESUME_FROM = "resume_from"


class PlanStatus(str, enum.Enum):
    PLANNED = "planned"
    APPLIED = "applied"
    PARTIAL = "partial"          # some actions done; the rest pending (Slurm did not answer)
    PENDING = "pending"          # nothing could be applied yet; kept for a retry
    OBSERVE_ONLY = "observe-only"
    NOTHING_TO_DO = "nothing-to-do"


@dataclass(frozen=True)
class PlannedAction:
    kind: ActionKind
    target: str                   # node name, job id or checkpoint path
    detail: str                   # the drain reason, the merged exclusion list, the step

    def describe(self) -> str:
        return {ActionKind.DRAIN: f"drain node {self.target}: {self.detail}",
                ActionKind.REQUEUE: f"requeue job {self.target}",
                ActionKind.EXCLUDE: f"set job {self.target} excluded nodes to {self.detail}",
                ActionKind.RESUME_FROM: f"resume from checkpoint {self.target} ({self.detail})"}[self.kind]


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
    held_back: tuple[str, ...]          # what a guard stopped, and why
    results: tuple[ActionResult, ...]
    created_at: float
    updated_at: float
    schema_version: int = 1

    def done(self) -> set[tuple[ActionKind, str]]:
        return {(r.kind, r.target) for r in self.results if r.ok}


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


@dataclass(frozen=True)
class CheckpointNote:
    """A checkpoint the training process wrote (seen through torch.save or the explicit call)."""
    KIND: ClassVar[str] = "checkpoint-note"
    path: str
    step: int
    rank: int
    restart: int
    saved_at: float
    size_bytes: int
    sha256: str = ""               # of the file as re-read from storage after fsync
    versions: str = ""             # python, torch, scout at save time
    schema_version: int = 1


@dataclass(frozen=True)
class VoteCoverage:
    """Written by the lowest rank after every state vote: how far the replicas were seen to agree."""
    KIND: ClassVar[str] = "vote-coverage"
    restart: int
    votes: int
    last_clean_step: int           # the last step at which every replica's state agreed (-1: none)
    last_vote_step: int
    schema_version: int = 1
