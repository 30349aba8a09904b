"""Build the remediation plan from a verdict (pure). Every guard of the site config is applied
here, and what it held back is written into the plan with the reason.

The drain rule (`drain_decision`): a job's own evidence is always enough to *exclude* a node from
that job's rerun (it harms nobody else), but a *drain* takes the node from everyone, so it needs
evidence the job cannot forge: a root-run check on the node that corroborates the verdict's kind
(hooks/rootcheck.py), or incidents of at least `min_users` different users naming the node (or a
GPU serial on it, wherever that GPU moved) within the site's window. Otherwise the node is
excluded and put on the watch list with its evidence. `[drain] drain_on = "job-evidence"` keeps
the old rule. Exclusive allocations are treated as shared ones: a job that had a node to itself
could still forge a finding that takes the node from everyone after it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from scout_slurm.config import DrainConfig, RemediationConfig
from scout_slurm.evidence.records import Cause, Verdict, VerdictKind
from scout_slurm.remediation.records import (
    CheckpointNote,
    CheckpointStatus,
    Drain,
    Exclude,
    PlannedAction,
    Requeue,
    ResumeFrom,
)
from scout_slurm.slurm.hostlist import compress_hostlist

DRAINABLE = frozenset(
    {VerdictKind.HANG, VerdictKind.CRASH, VerdictKind.SDC, VerdictKind.STRAGGLER, VerdictKind.INFRA}
)


@dataclass(frozen=True)
class JobFacts:
    """What Slurm says of the job (trusted), gathered by the caller."""

    job_id: int
    allocation: tuple[str, ...]
    excluded: tuple[str, ...]
    requeue_allowed: bool
    restart_count: int
    usable_nodes: tuple[str, ...]  # nodes of the cluster that are up and not drained
    state: str = ""  # Slurm's JobState when the hook ran ("" when Slurm did not say)


# How the job ended, by Slurm's own word, where that alone decides that scout must not act. A rank
# that failed in such a job failed because Slurm or a person ended the job, or Slurm already acted:
# the verdict is kept for the record, nothing is drained, the job is not requeued.
ENDED_BY_SLURM = {
    "CANCELLED": "the job was cancelled (scancel, by its user or an administrator)",
    "TIMEOUT": "the job reached its time limit and Slurm ended it (a rerun would reach it again)",
    "DEADLINE": "the job reached its deadline and Slurm ended it",
    "PREEMPTED": "Slurm preempted the job for another; its PreemptMode decides whether it is "
    "requeued",
    "NODE_FAIL": "Slurm saw a node of the job fail: it set that node down and requeues the job "
    "itself where allowed",
    "BOOT_FAIL": "a node of the job failed to boot: Slurm set it down and handles the job itself",
}


def ended_by_slurm(state: str) -> str:
    """Why scout must not act on a job that ended this way, or "" (pure)."""
    return ENDED_BY_SLURM.get(state.split()[0].upper() if state else "", "")


@dataclass(frozen=True)
class Plan:
    actions: tuple[PlannedAction, ...]
    held_back: tuple[str, ...]
    watched: tuple[str, ...] = ()  # named nodes the drain rule did not drain: excluded, watched


# What every drain reason of scout's starts with: Slurm keeps only the text, and `scout undrain`,
# the acceptance test and the benchmarks tell scout's drains from others' by it.
DRAIN_REASON_PREFIX = "scout:"


def is_scout_drain(reason: str, job_id: int | None = None) -> bool:
    """Whether a node's Slurm reason is one `drain_reason` wrote (for `job_id`, when given)."""
    if not reason.startswith(DRAIN_REASON_PREFIX):
        return False
    return job_id is None or f" job {int(job_id)} " in reason


def drain_reason(verdict: Verdict, node: str, evidence_path: str, why: str = "") -> str:
    ranks = ",".join(str(s.rank) for s in verdict.suspects if s.node == node)
    because = f" {why};" if why else ""
    return (
        f"{DRAIN_REASON_PREFIX} {verdict.kind.value} rank {ranks} job {verdict.job_id} run "
        f"{verdict.restart} "
        f"conf {verdict.confidence:.2f}{because} see {evidence_path}"
    )


@dataclass(frozen=True)
class PastIncident:
    """An earlier incident's decision on one node (the controller reads them from the evidence
    root).
    """

    job_id: int
    user: str
    node: str
    gpu_serials: tuple[str, ...]
    kind: str
    at: float


@dataclass(frozen=True)
class NodeSuspicion:
    """What the controller knows of one node the verdict names, beyond the job's word."""

    node: str
    gpu_serials: tuple[str, ...]  # of the suspect ranks' GPUs, from the Prolog's map
    corroborated_by: tuple[str, ...]  # root-found facts that corroborate the verdict's kind
    root_checked: bool  # whether the node's root checks are on record at all


@dataclass(frozen=True)
class DrainDecision:
    drain: bool
    why: str


def drain_decision(
    suspicion: NodeSuspicion,
    *,
    job_id: int,
    user: str,
    at: float,
    past: Sequence[PastIncident],
    cfg: DrainConfig,
) -> DrainDecision:
    """Drain `suspicion.node`, or only exclude it and watch it (pure; see the module's
    docstring).
    """
    if cfg.drain_on == "job-evidence":
        return DrainDecision(True, "on the job's evidence (site setting drain_on = job-evidence)")
    if suspicion.corroborated_by:
        return DrainDecision(
            True, f"corroborated by root check: {'; '.join(suspicion.corroborated_by[:3])}"[:200]
        )
    serials = {s for s in suspicion.gpu_serials if s}
    others = [
        p
        for p in past
        if p.job_id != job_id
        and 0 <= at - p.at <= cfg.window_s
        and (p.node == suspicion.node or serials & set(p.gpu_serials))
    ]
    users = {user, *(p.user for p in others)}
    if len(users) >= cfg.min_users:
        named = ", ".join(
            f"{p.user} job {p.job_id}" for p in sorted(others, key=lambda p: p.at)[-4:]
        )
        return DrainDecision(
            True,
            f"{len(others) + 1} incidents from {len(users)} users ({named}, {user} job {job_id})",
        )
    checked = (
        "root checks found nothing that corroborates it"
        if suspicion.root_checked
        else "no root check on record"
    )
    seen = f"; {len(others)} earlier incident(s) here, all from {user}" if others else ""
    return DrainDecision(
        False,
        f"only the job's own evidence ({checked}{seen}): excluded from the rerun, "
        f"not drained; on the watch list",
    )


@dataclass(frozen=True)
class NodeOutcome:
    """One suspect node's outcome in one incident, as the watch list and `scout suspects` show
    it.
    """

    node: str
    gpu_serials: tuple[str, ...]
    outcome: str  # "drain", "watch", or "held" (a guard kept it from both)
    why: str
    root_checks: tuple[str, ...]  # "name: status" of each root check run on the node
    root_findings: tuple[str, ...]


@dataclass(frozen=True)
class DrainDecisions:
    """results/drain-decisions-<run>.json: who the job's user was and what became of each named
    node.
    """

    KIND: ClassVar[str] = "drain-decisions"
    job_id: int
    restart: int
    user: str
    uid: int
    kind: VerdictKind
    at: float
    drain_on: str
    nodes: tuple[NodeOutcome, ...]
    schema_version: int = 1


def choose_checkpoint(
    notes: Sequence[CheckpointNote], first_suspect_step: int
) -> CheckpointNote | None:
    """The newest checkpoint strictly before the first suspect step (any step when unknown)."""
    eligible = [n for n in notes if first_suspect_step < 0 or n.step < first_suspect_step]
    return max(eligible, key=lambda n: (n.step, n.saved_at), default=None)


def build_plan(
    verdict: Verdict,
    job: JobFacts,
    cfg: RemediationConfig,
    *,
    evidence_path: str,
    checkpoint: CheckpointNote | None = None,
    checkpoint_reason: str = "",
    checkpoint_status: CheckpointStatus | None = None,
    decisions: Mapping[str, DrainDecision] | None = None,
    earlier: Sequence[Verdict] = (),
    software_retries: int = 1,
) -> Plan:
    """The actions for `verdict` and what the guards held back (pure). `checkpoint` is the one the
    recovery rule chose (`checkpoint_status`: as eligible or as candidate; `checkpoint_reason`:
    why).
    `decisions`: the drain rule's word on each suspect node (a node without one is drained, as
    before the rule); a node it does not drain is excluded from the rerun all the same.
    `earlier`: the verdicts of the job's earlier runs; a software failure is requeued at most
    `software_retries` times, and never when the run before failed the same way
    (`software_plan`)."""
    held: list[str] = []
    actions: list[PlannedAction] = []
    if verdict.kind == VerdictKind.CLEAN:
        return Plan((), ("the run was clean: nothing to do",))
    if verdict.kind == VerdictKind.UNCHECKED:
        return Plan(
            (), ("no rank failed and no state vote or replay ran (unchecked): nothing to do",)
        )
    if verdict.kind == VerdictKind.TAINTED:
        return Plan(
            (),
            (
                "the run trained from a checkpoint scout had rejected (tainted): its results are "
                "suspect; nothing is drained and the job is not requeued",
            ),
        )
    ended = ended_by_slurm(job.state)
    if ended:
        return Plan(
            (),
            (
                f"{ended}: the verdict ({verdict.kind.value}) is kept for the record; nothing "
                "is drained "
                "and the job is not requeued",
            ),
        )
    if verdict.kind == VerdictKind.INCONCLUSIVE:
        return Plan(
            (),
            (
                "inconclusive verdict: nothing is drained and the job is not requeued "
                "(the verdict's reasoning says why: a failure most ranks share would fail "
                "again anywhere, "
                "a failure at exit came after the training had finished)",
            ),
        )
    if verdict.cause is Cause.SOFTWARE:
        return software_plan(
            verdict,
            job,
            cfg,
            earlier=earlier,
            software_retries=software_retries,
            checkpoint=checkpoint,
            checkpoint_reason=checkpoint_reason,
            checkpoint_status=checkpoint_status,
        )
    drains: list[str] = []
    if verdict.kind not in DRAINABLE:
        held.append(f"verdict {verdict.kind.value} never drains")
    elif verdict.kind == VerdictKind.STRAGGLER and not cfg.drain_stragglers:
        held.append(
            "a confirmed straggler is reported, not drained (site setting "
            "remediation.drain_stragglers "
            "is false)"
        )
    elif verdict.confidence < cfg.min_confidence:
        held.append(
            f"confidence {verdict.confidence:.2f} is below the site's minimum "
            f"{cfg.min_confidence:.2f}: "
            "no drain"
        )
    else:
        alloc = set(job.allocation)
        for node in verdict.suspect_nodes:
            if node not in alloc:
                held.append(
                    f"node {node!r} named by the evidence is outside the job's allocation "
                    f"({compress_hostlist(list(job.allocation)) if job.allocation else 'empty'}): "
                    "not drained"
                )
                continue
            drains.append(node)
        # one node may always go unless the fraction is 0: else a one-node job could never drain
        limit = math.floor(cfg.max_drain_fraction * len(job.allocation) + 1e-9)
        if cfg.max_drain_fraction > 0:
            limit = max(1, limit)
        if len(drains) > limit:
            held.append(
                f"{len(drains)} suspect nodes exceed the limit of {limit} "
                f"({cfg.max_drain_fraction:.0%} of {len(job.allocation)}): nothing drained"
            )
            drains = []
    decisions = decisions or {}
    watched = [n for n in drains if n in decisions and not decisions[n].drain]
    drains = [n for n in drains if n not in watched]
    only_excluded: list[str] = []
    if verdict.cause is Cause.INFRASTRUCTURE and (drains or watched):
        # storage or the network failed the rank, not the node's own hardware: another tenant
        # (a squatted port, a shared mount) may have caused it, so it never drains and never counts
        # in a node's history; the job's own rerun still avoids the node
        only_excluded, drains, watched = [*drains, *watched], [], []
        held.append(
            f"cause infrastructure ({verdict.cause_evidence})"[:300]
            + f": {', '.join(only_excluded)} excluded from the rerun, not drained, not watched"
        )
    for node in drains:
        why = decisions[node].why if node in decisions else ""
        actions.append(
            PlannedAction.of(Drain(node, drain_reason(verdict, node, evidence_path, why)))
        )
    for node in watched:
        held.append(f"node {node}: {decisions[node].why}")

    requeue = cfg.requeue
    if not cfg.requeue:
        held.append("the site config disables requeue")
    elif not job.requeue_allowed:
        held.append("the job said --no-requeue: not requeued")
        requeue = False
    elif job.restart_count >= cfg.restart_limit:
        held.append(
            f"restart limit reached ({job.restart_count} of {cfg.restart_limit}): not requeued"
        )
        requeue = False
    elif verdict.kind == VerdictKind.STRAGGLER:
        held.append(
            "a straggler slows a job but does not fail it: not requeued (resubmit it to run "
            "without "
            "a drained node)"
        )
        requeue = False
    elif (
        not drains
        and not watched
        and not only_excluded
        and verdict.kind != VerdictKind.INFRA
        and verdict.cause is not Cause.INFRASTRUCTURE
    ):
        held.append(
            "no node drained or excluded: a rerun on the same nodes would likely fail the "
            "same way; "
            "not requeued"
        )
        requeue = False
    if requeue:
        excluded = list(dict.fromkeys([*job.excluded, *drains, *watched, *only_excluded]))
        remaining = [n for n in job.usable_nodes if n not in excluded]
        if len(remaining) < len(job.allocation):
            held.append(
                f"only {len(remaining)} usable nodes would remain for a job of "
                f"{len(job.allocation)}: "
                "not requeued"
            )
            requeue = False
        else:
            actions.append(PlannedAction.of(Requeue(job.job_id)))
            if drains or watched or only_excluded:
                compress_hostlist(
                    excluded
                )  # raises, naming it, on a node name Slurm would not take
                actions.append(PlannedAction.of(Exclude(job.job_id, tuple(excluded))))
            _resume(actions, held, verdict, checkpoint, checkpoint_reason, checkpoint_status)
    return Plan(tuple(actions), tuple(held), tuple(watched))


def _resume(
    actions: list[PlannedAction],
    held: list[str],
    verdict: Verdict,
    checkpoint: CheckpointNote | None,
    reason: str,
    status: CheckpointStatus | None,
) -> None:
    if checkpoint is not None:
        actions.append(
            PlannedAction.of(
                ResumeFrom(
                    checkpoint.path, checkpoint.step, verdict.first_suspect_step, reason, status
                )
            )
        )
    else:
        held.append(
            reason
            or "no recorded checkpoint before the first suspect step: the rerun starts as the "
            "script decides"
        )


def same_failure(verdict: Verdict, earlier: Sequence[Verdict]) -> Verdict | None:
    """The latest earlier run that failed with the same software fault at the same place."""
    if verdict.cause is not Cause.SOFTWARE or not verdict.fault_site:
        return None
    same = [
        v
        for v in earlier
        if v.restart < verdict.restart
        and v.cause is Cause.SOFTWARE
        and v.fault_site == verdict.fault_site
    ]
    return max(same, key=lambda v: v.restart, default=None)


def a_bug_not_a_node(verdict: Verdict, before: Verdict) -> str:
    """'the same ValueError at train.py:73 in step, step 8, on run 0 and run 1: a bug, not a
    node'
    """
    steps = sorted({v.first_suspect_step for v in (before, verdict) if v.first_suspect_step >= 0})
    at = f", step {steps[0]}" if len(steps) == 1 else ""
    return (
        f"the same {verdict.fault_site}{at}, on run {before.restart} and run {verdict.restart}: "
        "a bug, not a node"
    )


def software_plan(
    verdict: Verdict,
    job: JobFacts,
    cfg: RemediationConfig,
    *,
    earlier: Sequence[Verdict],
    software_retries: int,
    checkpoint: CheckpointNote | None,
    checkpoint_reason: str,
    checkpoint_status: CheckpointStatus | None,
) -> Plan:
    """A failure of the job's own software (pure): no node is drained, excluded or watched; the
    job is requeued at most `software_retries` times (a transient error passes on a rerun), and
    not when the run before failed with the same exception at the same place."""
    held = [
        f"cause software ({verdict.cause_evidence}): no node is drained, excluded or watched"[:400]
    ]
    actions: list[PlannedAction] = []
    tries = sum(1 for v in earlier if v.restart < verdict.restart and v.cause is Cause.SOFTWARE)
    before = same_failure(verdict, earlier)
    if before is not None:
        held.append(f"{a_bug_not_a_node(verdict, before)}: not requeued (fix the script, resubmit)")
    elif not cfg.requeue:
        held.append("the site config disables requeue")
    elif not job.requeue_allowed:
        held.append("the job said --no-requeue: not requeued")
    elif job.restart_count >= cfg.restart_limit:
        held.append(
            f"restart limit reached ({job.restart_count} of {cfg.restart_limit}): not requeued"
        )
    elif tries >= software_retries:
        held.append(
            f"{tries} earlier run(s) of this job failed in its own software "
            f"(remediation.software_retries = {software_retries}): not requeued"
        )
    else:
        actions.append(PlannedAction.of(Requeue(job.job_id)))
        held.append(
            f"requeued once more on the same nodes in case the error was transient "
            f"(software retry {tries + 1} of {software_retries})"
        )
        _resume(actions, held, verdict, checkpoint, checkpoint_reason, checkpoint_status)
    return Plan(tuple(actions), tuple(held), ())
