"""Build the remediation plan from a verdict (pure). Every guard of the site config is applied
here, and what it held back is written into the plan with the reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from scout_slurm.config import RemediationConfig
from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.remediation.records import (CheckpointNote, CheckpointStatus, Drain, Exclude, PlannedAction, Requeue,
                                             ResumeFrom)
from scout_slurm.slurm.hostlist import compress_hostlist

DRAINABLE = frozenset({VerdictKind.HANG, VerdictKind.CRASH, VerdictKind.SDC, VerdictKind.STRAGGLER,
                       VerdictKind.INFRA})


@dataclass(frozen=True)
class JobFacts:
    """What Slurm says of the job (trusted), gathered by the caller."""
    job_id: int
    allocation: tuple[str, ...]
    excluded: tuple[str, ...]
    requeue_allowed: bool
    restart_count: int
    usable_nodes: tuple[str, ...]     # nodes of the cluster that are up and not drained
    state: str = ""                   # Slurm's JobState when the hook ran ("" when Slurm did not say)


# How the job ended, by Slurm's own word, where that alone decides that scout must not act. A rank
# that failed in such a job failed because Slurm or a person ended the job, or Slurm already acted:
# the verdict is kept for the record, nothing is drained, the job is not requeued.
ENDED_BY_SLURM = {
    "CANCELLED": "the job was cancelled (scancel, by its user or an administrator)",
    "TIMEOUT": "the job reached its time limit and Slurm ended it (a rerun would reach it again)",
    "DEADLINE": "the job reached its deadline and Slurm ended it",
    "PREEMPTED": "Slurm preempted the job for another; its PreemptMode decides whether it is requeued",
    "NODE_FAIL": "Slurm saw a node of the job fail: it set that node down and requeues the job itself where allowed",
    "BOOT_FAIL": "a node of the job failed to boot: Slurm set it down and handles the job itself",
}


def ended_by_slurm(state: str) -> str:
    """Why scout must not act on a job that ended this way, or "" (pure)."""
    return ENDED_BY_SLURM.get(state.split()[0].upper() if state else "", "")


@dataclass(frozen=True)
class Plan:
    actions: tuple[PlannedAction, ...]
    held_back: tuple[str, ...]


# What every drain reason of scout's starts with: Slurm keeps only the text, and `scout undrain`,
# the acceptance test and the benchmarks tell scout's drains from others' by it.
DRAIN_REASON_PREFIX = "scout:"


def is_scout_drain(reason: str, job_id: int | None = None) -> bool:
    """Whether a node's Slurm reason is one `drain_reason` wrote (for `job_id`, when given)."""
    if not reason.startswith(DRAIN_REASON_PREFIX):
        return False
    return job_id is None or f" job {int(job_id)} " in reason


def drain_reason(verdict: Verdict, node: str, evidence_path: str) -> str:
    ranks = ",".join(str(s.rank) for s in verdict.suspects if s.node == node)
    return (f"{DRAIN_REASON_PREFIX} {verdict.kind.value} rank {ranks} job {verdict.job_id} run {verdict.restart} "
            f"conf {verdict.confidence:.2f} see {evidence_path}")


def choose_checkpoint(notes: Sequence[CheckpointNote], first_suspect_step: int) -> CheckpointNote | None:
    """The newest checkpoint strictly before the first suspect step (any step when unknown)."""
    eligible = [n for n in notes if first_suspect_step < 0 or n.step < first_suspect_step]
    return max(eligible, key=lambda n: (n.step, n.saved_at), default=None)


def build_plan(verdict: Verdict, job: JobFacts, cfg: RemediationConfig, *, evidence_path: str,
               checkpoint: CheckpointNote | None = None, checkpoint_reason: str = "",
               checkpoint_status: CheckpointStatus | None = None) -> Plan:
    """The actions for `verdict` and what the guards held back (pure). `checkpoint` is the one the
    recovery rule chose (`checkpoint_status`: as eligible or as candidate; `checkpoint_reason`: why)."""
    held: list[str] = []
    actions: list[PlannedAction] = []
    if verdict.kind == VerdictKind.CLEAN:
        return Plan((), ("the run was clean: nothing to do",))
    if verdict.kind == VerdictKind.UNCHECKED:
        return Plan((), ("no rank failed and none of scout's checks ran (unchecked): nothing to do",))
    ended = ended_by_slurm(job.state)
    if ended:
        return Plan((), (f"{ended}: the verdict ({verdict.kind.value}) is kept for the record; nothing is drained "
                         "and the job is not requeued",))
    if verdict.kind == VerdictKind.INCONCLUSIVE:
        return Plan((), ("inconclusive verdict: nothing is drained and the job is not requeued "
                         "(the verdict's reasoning says why: a failure most ranks share would fail again anywhere, "
                         "a failure at exit came after the training had finished)",))
    drains: list[str] = []
    if verdict.kind not in DRAINABLE:
        held.append(f"verdict {verdict.kind.value} never drains")
    elif verdict.kind == VerdictKind.STRAGGLER and not cfg.drain_stragglers:
        held.append("a confirmed straggler is reported, not drained (site setting remediation.drain_stragglers "
                    "is false)")
    elif verdict.confidence < cfg.min_confidence:
        held.append(f"confidence {verdict.confidence:.2f} is below the site's minimum {cfg.min_confidence:.2f}: "
                    "no drain")
    else:
        alloc = set(job.allocation)
        for node in verdict.suspect_nodes:
            if node not in alloc:
                held.append(f"node {node!r} named by the evidence is outside the job's allocation "
                            f"({compress_hostlist(list(job.allocation)) if job.allocation else 'empty'}): not drained")
                continue
            drains.append(node)
        # one node may always go unless the fraction is 0: else a one-node job could never drain
        limit = math.floor(cfg.max_drain_fraction * len(job.allocation) + 1e-9)
        if cfg.max_drain_fraction > 0:
            limit = max(1, limit)
        if len(drains) > limit:
            held.append(f"{len(drains)} suspect nodes exceed the limit of {limit} "
                        f"({cfg.max_drain_fraction:.0%} of {len(job.allocation)}): nothing drained")
            drains = []
    for node in drains:
        actions.append(PlannedAction.of(Drain(node, drain_reason(verdict, node, evidence_path))))

    requeue = cfg.requeue
    if not cfg.requeue:
        held.append("the site config disables requeue")
    elif not job.requeue_allowed:
        held.append("the job said --no-requeue: not requeued")
        requeue = False
    elif job.restart_count >= cfg.restart_limit:
        held.append(f"restart limit reached ({job.restart_count} of {cfg.restart_limit}): not requeued")
        requeue = False
    elif verdict.kind == VerdictKind.STRAGGLER:
        held.append("a straggler slows a job but does not fail it: not requeued (resubmit it to run without "
                    "a drained node)")
        requeue = False
    elif not drains and verdict.kind != VerdictKind.INFRA:
        held.append("no node drained: a rerun on the same nodes would likely fail the same way; not requeued")
        requeue = False
    if requeue:
        excluded = list(dict.fromkeys([*job.excluded, *drains]))
        remaining = [n for n in job.usable_nodes if n not in excluded]
        if len(remaining) < len(job.allocation):
            held.append(f"only {len(remaining)} usable nodes would remain for a job of {len(job.allocation)}: "
                        "not requeued")
            requeue = False
        else:
            actions.append(PlannedAction.of(Requeue(job.job_id)))
            if drains:
                compress_hostlist(excluded)   # raises, naming it, on a node name Slurm would not take
                actions.append(PlannedAction.of(Exclude(job.job_id, tuple(excluded))))
            if checkpoint is not None:
                actions.append(PlannedAction.of(ResumeFrom(checkpoint.path, checkpoint.step,
                                                           verdict.first_suspect_step, checkpoint_reason,
                                                           checkpoint_status)))
            else:
                held.append(checkpoint_reason or "no recorded checkpoint before the first suspect step: the rerun "
                            "starts as the script decides")
    return Plan(tuple(actions), tuple(held))
