"""Stage 4, plan (pure): the remediation plan for the verdict and the decisions (remediation/plan.py
builds it under its guards), the actions record that carries it to apply, and the record of what
became of each named node (the watch list's and the next incident's drain rule's history)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scout_slurm.config import RemediationConfig
from scout_slurm.evidence.records import Verdict
from scout_slurm.incident.decide import NamedNode, job_user
from scout_slurm.jobenv import HookContext
from scout_slurm.remediation.eligibility import Assessment
from scout_slurm.remediation.plan import (
    DrainDecision,
    DrainDecisions,
    JobFacts,
    NodeOutcome,
    Plan,
    build_plan,
)
from scout_slurm.remediation.records import ActionsRecord, Drain, PlanStatus


def remediation_plan(
    verdict: Verdict,
    facts: JobFacts,
    cfg: RemediationConfig,
    *,
    evidence_path: str,
    recovery: tuple[Assessment | None, str],
    decisions: Mapping[str, DrainDecision],
    earlier: Sequence[Verdict] = (),
) -> Plan:
    """The plan; `recovery`: the checkpoint the recovery rule chose (or None) and why; `earlier`:
    the verdicts of the job's earlier runs (a software failure's retries count them)."""
    chosen, why = recovery
    return build_plan(
        verdict,
        facts,
        cfg,
        evidence_path=evidence_path,
        checkpoint=chosen.note if chosen else None,
        checkpoint_reason=why,
        checkpoint_status=chosen.status if chosen else None,
        decisions=decisions,
        earlier=earlier,
        software_retries=cfg.software_retries,
    )


def plan_status(plan: Plan, *, observe_only: bool) -> PlanStatus:
    if not plan.actions:
        return PlanStatus.NOTHING_TO_DO
    return PlanStatus.OBSERVE_ONLY if observe_only else PlanStatus.PLANNED


def actions_record(
    job_id: int, restart: int, verdict: Verdict, plan: Plan, *, observe_only: bool, at: float
) -> ActionsRecord:
    """Run `restart`'s actions record as planned: nothing applied yet."""
    return ActionsRecord(
        job_id=job_id,
        restart=restart,
        verdict_kind=verdict.kind,
        status=plan_status(plan, observe_only=observe_only),
        actions=plan.actions,
        held_back=plan.held_back,
        results=(),
        created_at=at,
        updated_at=at,
    )


def decisions_record(
    ctx: HookContext,
    verdict: Verdict,
    named: Mapping[str, NamedNode],
    decisions: Mapping[str, DrainDecision],
    planned: Plan,
    *,
    drain_on: str,
    at: float,
) -> DrainDecisions | None:
    """The incident's word on each named node: drained, watched, or held back by a guard (None
    when the verdict named none)."""
    if not named:
        return None
    drained = {a.payload.node for a in planned.actions if isinstance(a.payload, Drain)}
    rows = []
    for n, x in named.items():
        outcome = "drain" if n in drained else "watch" if n in planned.watched else "held"
        why = decisions[n].why if outcome != "held" else "; ".join(planned.held_back)[:300]
        rows.append(
            NodeOutcome(n, x.suspicion.gpu_serials, outcome, why, x.root_checks, x.root_findings)
        )
    return DrainDecisions(
        job_id=ctx.job_id,
        restart=verdict.restart,
        user=job_user(ctx),
        uid=ctx.job_uid,
        kind=verdict.kind,
        at=at,
        drain_on=drain_on,
        nodes=tuple(rows),
    )
