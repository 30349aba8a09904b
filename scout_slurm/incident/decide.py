"""Stage 3, decide (pure): for each node the verdict names, drain it or only exclude and watch it
(remediation/plan.py's drain rule over the incidents before it), and the checkpoint to resume from
(remediation/eligibility.py's recovery rule)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.config import DrainConfig
from scout_slurm.evidence.records import Verdict
from scout_slurm.jobenv import HookContext
from scout_slurm.remediation.eligibility import Assessment, recovery_point
from scout_slurm.remediation.plan import (
    DrainDecision,
    NodeSuspicion,
    PastIncident,
    drain_decision,
)


@dataclass(frozen=True)
class NamedNode:
    """What is on record of one node the verdict names, beyond the job's word (gathered)."""

    suspicion: NodeSuspicion
    root_checks: tuple[str, ...] = ()  # "name: status" of each root check its Epilog ran
    root_findings: tuple[str, ...] = ()  # "category: detail" of each thing they found


def recovery(assessments: Sequence[Assessment], verdict: Verdict) -> tuple[Assessment | None, str]:
    """The checkpoint to resume from (None: none fits) and why."""
    return recovery_point(assessments, verdict.first_suspect_step)


def job_user(ctx: HookContext) -> str:
    """The job's user as records name them: the name, else the uid."""
    return ctx.job_user or f"uid {ctx.job_uid}"


def drain_decisions(
    ctx: HookContext,
    named: Mapping[str, NamedNode],
    past: Sequence[PastIncident],
    *,
    at: float,
    cfg: DrainConfig,
) -> dict[str, DrainDecision]:
    """The drain rule's decision for each named node, over the incidents `past`."""
    user = job_user(ctx)
    return {
        n: drain_decision(x.suspicion, job_id=ctx.job_id, user=user, at=at, past=past, cfg=cfg)
        for n, x in named.items()
    }
