"""Stage 3, decide (pure): for each node the verdict names, drain it or only exclude and watch it
(remediation/plan.py's drain rule over the incidents before it), and the checkpoint to resume from
(remediation/eligibility.py's recovery rule)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.config import DrainConfig
from scout_slurm.evidence.records import Cause, Verdict, VerdictKind
from scout_slurm.jobenv import HookContext
from scout_slurm.localise import cause
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


def with_root_cause(verdict: Verdict, named: Mapping[str, NamedNode]) -> Verdict:
    """The verdict with its cause from root's evidence when a root check on a named node
    corroborates it (a hardware Xid class, ECC, a failed self-test): that outranks what the job's
    own exit said. The verdict as it was otherwise."""
    found = [f for x in named.values() for f in x.suspicion.corroborated_by]
    if not found or verdict.cause is Cause.HARDWARE:
        return verdict
    was = cause.CauseFinding(verdict.cause, verdict.cause_evidence, verdict.fault_site)
    now = cause.with_root_evidence(was, "; ".join(found[:2]))
    return dataclasses.replace(
        verdict, cause=now.cause, cause_evidence=now.evidence[:400], fault_site=""
    )


def with_stack_cause(verdict: Verdict, stacks: Sequence[tuple[int, Sequence[str]]]) -> Verdict:
    """A hang whose every suspect was dumped standing in the job's own code (a sleep, a loop of
    its own) is the job's software; the verdict as it was otherwise (root evidence, applied after,
    still outranks it)."""
    if verdict.kind is not VerdictKind.HANG or verdict.cause is not Cause.UNKNOWN:
        return verdict
    found = cause.of_hang(stacks, [s.rank for s in verdict.suspects])
    if found.cause is Cause.UNKNOWN:
        return verdict
    return dataclasses.replace(
        verdict,
        cause=found.cause,
        cause_evidence=found.evidence[:400],
        fault_site=found.fault_site,
    )


def counts_against_nodes(verdict: Verdict) -> bool:
    """Whether the incident's named nodes get the drain rule's decision and a line in the nodes'
    history: not when the job's own software or the infrastructure failed it."""
    return verdict.cause not in (Cause.SOFTWARE, Cause.INFRASTRUCTURE)
