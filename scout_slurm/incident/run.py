"""Runs one incident's stages in the order data flows, under the run's lock: gather -> localise ->
decide -> plan -> apply -> report (each stage's module says what it owns). `handle` is the entry
for the hook's own run; `complete_pending` for the runs of the cluster that a killed hook left
unfinished (incident/pending.py), each through `handle`, so nothing is done twice."""

from __future__ import annotations

import os
from collections.abc import Callable

from scout_slurm.errors import EvidenceError, ScoutError
from scout_slurm.evidence.records import Verdict
from scout_slurm.incident import apply, decide, gather, localise, plan, report
from scout_slurm.incident.incident import Incident
from scout_slurm.incident.pending import (
    Busy,
    PendingIncident,
    abandon,
    due,
    held_lock,
    list_markers,
    remove_marker,
    write_marker,
)
from scout_slurm.localise.verdict import JobEvidence
from scout_slurm.log import get_logger
from scout_slurm.remediation.eligibility import rerun_checkpoints
from scout_slurm.remediation.plan import JobFacts
from scout_slurm.remediation.records import ActionKind, ActionsRecord, PlanStatus

log = get_logger("scout.controller")
FINAL = (PlanStatus.APPLIED, PlanStatus.OBSERVE_ONLY, PlanStatus.NOTHING_TO_DO)

RootCheckHere = Callable[[Verdict], None]


def handle(
    incident: Incident, *, root_check_here: RootCheckHere | None = None
) -> ActionsRecord | None:
    """Run the incident under its lock; None when there was none (or another hook has it).
    `root_check_here`: the batch host's own root checks, run once the verdict is written (the
    other nodes' Epilogs wait for that verdict themselves)."""
    if not _readable(incident):
        return None
    folder, restart = incident.folder, incident.restart
    try:
        with held_lock(folder, restart):
            record = _stages(incident, root_check_here)
    except Busy:
        log.info(
            "controller.busy",
            job=incident.job_id,
            restart=restart,
            why="another live hook holds this incident's lock; it completes it",
        )
        return None
    if record is None or record.status in FINAL:
        remove_marker(folder, restart)
    return record


def _stages(incident: Incident, root_check_here: RootCheckHere | None) -> ActionsRecord | None:
    ctx, folder, restart = incident.ctx, incident.folder, incident.restart
    try:
        previous = apply.previous(incident)
    except EvidenceError as exc:
        log.error("controller.actions_unreadable", error=str(exc))
        return None
    if previous is not None:
        return _resume(incident, previous)
    findings = gather.findings(folder, restart)
    # The node Epilogs' digests (one file a node instead of three a rank) are written before their
    # epilog.json: waiting for those first makes the one reading below cheap, clean job or not.
    nodes = gather.allocation(incident)
    missing = gather.wait_for_node_evidence(incident, nodes) if nodes else None
    found = None
    if not ctx.job_failed and not findings:
        found = gather.evidence(incident)
        if _clean(incident, found):
            return None
    # from here on an incident: if this hook dies, the next controller run on the cluster completes
    # it
    write_marker(
        folder, PendingIncident.of(ctx, since=incident.clock.wall(), holder=incident.holder)
    )
    facts = gather.job_facts(incident)
    if missing is None:  # no node list in the hook's environment: the job's, asked of Slurm
        missing, found = gather.wait_for_node_evidence(incident, facts.allocation), None
    if found is None:
        found = gather.evidence(incident)
    verdict, found = _localise(incident, found, missing)
    assessments = gather.checkpoint_assessments(incident, verdict)
    if root_check_here is not None:
        root_check_here(verdict)
    named = gather.named_nodes(incident, verdict, found, facts)
    stacks = gather.suspect_stacks(incident, verdict)
    judged = decide.with_root_cause(decide.with_stack_cause(verdict, stacks), named)
    if judged is not verdict:
        verdict = judged
        report.write_verdict(folder, restart, verdict)
    if not decide.counts_against_nodes(verdict):
        named = {}  # the job's own software or the infrastructure: no node decided, no history
    record = _decide_and_plan(incident, verdict, facts, named, assessments)
    if any(a.kind is ActionKind.REQUEUE for a in record.actions):
        chosen, _ = decide.recovery(assessments, verdict)
        report.write_rerun_checkpoints(
            folder, rerun_checkpoints(ctx.job_id, restart + 1, assessments, chosen)
        )
    return _apply_and_report(incident, verdict, found, record)


def _clean(incident: Incident, found: JobEvidence) -> bool:
    """Whether a run that neither failed nor left a finding is clean: then its verdict is
    written and there is nothing more to do."""
    verdict = localise.verdict_of(found, now=incident.clock.wall())
    if localise.is_incident(verdict):
        return False
    report.write_verdict(incident.folder, incident.restart, verdict)
    log.info(
        "controller.clean",
        kind=verdict.kind.value,
        job=incident.job_id,
        from_node_digests=len(found.abridged),
        seconds=incident.budget.elapsed(),
    )
    return True


def _localise(
    incident: Incident, found: JobEvidence, missing: list[str]
) -> tuple[Verdict, JobEvidence]:
    """The verdict, written; and the evidence with the suspects' records whole (for the report)."""
    gather.say_ignored(incident, found)
    verdict = localise.verdict_of(found, now=incident.clock.wall(), missing_nodes=missing)
    found = gather.suspects_whole(incident, found, verdict)
    log.info(
        "controller.evidence",
        job=incident.job_id,
        ranks=found.world_size,
        from_node_digests=len(found.abridged),
        seconds=incident.budget.elapsed(),
    )
    report.write_verdict(incident.folder, incident.restart, verdict)
    return verdict, found


def _decide_and_plan(
    incident: Incident,
    verdict: Verdict,
    facts: JobFacts,
    named: dict[str, decide.NamedNode],
    assessments: list,
) -> ActionsRecord:
    """The drain rule's decisions (recorded for the next incident) and the plan, as the run's
    actions record, nothing applied yet."""
    ctx, cfg, wall = incident.ctx, incident.cfg, incident.clock.wall
    at = wall()
    past = gather.past_incidents(incident, at=at) if named else []
    decisions = decide.drain_decisions(ctx, named, past, at=at, cfg=cfg.drain)
    if named:
        log.info(
            "controller.drain_rule",
            job=ctx.job_id,
            drain_on=cfg.drain.drain_on,
            past_incidents=len(past),
            decisions={n: (d.drain, d.why) for n, d in decisions.items()},
        )
    planned = plan.remediation_plan(
        verdict,
        facts,
        cfg.remediation,
        evidence_path=str(incident.folder.path),
        recovery=decide.recovery(assessments, verdict),
        decisions=decisions,
        earlier=gather.earlier_verdicts(incident),
    )
    report.write_decisions(
        incident.folder,
        plan.decisions_record(
            ctx, verdict, named, decisions, planned, drain_on=cfg.drain.drain_on, at=wall()
        ),
    )
    observe_only = cfg.remediation.observe_only
    return plan.actions_record(
        ctx.job_id, incident.restart, verdict, planned, observe_only=observe_only, at=wall()
    )


def _apply_and_report(
    incident: Incident, verdict: Verdict, found: JobEvidence, record: ActionsRecord
) -> ActionsRecord:
    """The record claimed, the report written, the plan applied, the report written again (so
    that a report stands even if applying is cut short)."""
    folder, restart = incident.folder, incident.restart
    claimed = apply.claim(incident, record)
    if claimed is not record:
        return claimed
    report.write_report(folder, restart, verdict, found, record)
    if record.status == PlanStatus.PLANNED:
        record = apply.apply(incident, record)
        report.write_report(folder, restart, verdict, found, record)
    log.info(
        "controller.done",
        job=incident.job_id,
        verdict=verdict.kind.value,
        status=record.status.value,
        suspects=[(s.rank, s.node) for s in verdict.suspects],
        seconds=incident.budget.elapsed(),
    )
    return record


def _resume(incident: Incident, previous: ActionsRecord) -> ActionsRecord:
    """A run a hook before this one planned: its record when final, else applied to the end."""
    if previous.status in FINAL:
        log.info(
            "controller.already_handled",
            job=incident.job_id,
            restart=incident.restart,
            status=previous.status.value,
        )
        return previous
    log.info("controller.resuming_plan", job=incident.job_id, status=previous.status.value)
    record = apply.apply(incident, previous)
    log.info(
        "controller.done",
        job=incident.job_id,
        status=record.status.value,
        resumed=True,
        seconds=incident.budget.elapsed(),
    )
    return record


def _readable(incident: Incident) -> bool:
    """Whether the run left scout's evidence where this hook can read it, and a results folder
    it can write to; why not is logged in words a site administrator can act on."""
    folder, ctx = incident.folder, incident.ctx
    if not folder.root.is_dir():
        log.error(
            "controller.no_evidence_root",
            job=ctx.job_id,
            error=f"evidence root {folder.root} does not exist or is not a directory here: mount "
            'it on this host, or set [epilog] localise_on = "batch-host" in the site config',
        )
        return False
    if folder.path.is_symlink():
        log.error(
            "controller.unsafe_job_folder",
            job=ctx.job_id,
            error=f"{folder.path} is a symbolic link; the job may have planted it; not followed",
        )
        return False
    if not folder.path.is_dir() or not gather.has_scout_records(folder, ctx.restart):
        _say_not_a_scout_job(incident)
        return False
    return _results_dir_ready(incident)


def _say_not_a_scout_job(incident: Incident) -> None:
    """A job that never ran under scout-srun is the common case; a run folder SlurmUser cannot
    read is a site problem."""
    run = incident.folder.run_dir(incident.restart)
    if run.is_dir() and not os.access(run, os.R_OK | os.X_OK):
        log.error(
            "controller.cannot_read_job_evidence",
            job=incident.job_id,
            folder=str(run),
            uid=os.geteuid(),
            fix="the Prolog gives the job's folders SlurmUser's group: set [evidence] slurm_user "
            "in the site config to slurm.conf's SlurmUser",
        )
    else:
        log.info("controller.not_a_scout_job", job=incident.job_id)


def _results_dir_ready(incident: Incident) -> bool:
    """The results folder, laid out by the Prolog as SlurmUser's; created here only where this
    hook may (root, or a job folder of SlurmUser's). Never a link."""
    d = incident.folder.results_dir
    if d.is_symlink():
        log.error(
            "controller.unsafe_results_folder", folder=str(d), error="a symbolic link; not followed"
        )
        return False
    if d.is_dir():
        return True
    try:
        os.mkdir(d, 0o755)
        return True
    except FileExistsError:
        return d.is_dir() and not d.is_symlink()
    except OSError as exc:
        log.error(
            "controller.no_results_folder",
            folder=str(d),
            error=exc.strerror,
            fix="the Prolog lays it out as SlurmUser's: is scout-prolog the site's Prolog, with "
            "[evidence] slurm_user set to slurm.conf's SlurmUser?",
        )
        return False


def complete_pending(incident: Incident) -> list[tuple[int, int]]:
    """Complete the cluster's incidents that a killed hook left unfinished, within what is left of
    `incident`'s budget (the hook's own); returns the (job, run) pairs handled. Each goes through
    `handle` under its own lock, so a live hook's incident is never touched."""
    cfg, folder, wall = incident.cfg, incident.folder, incident.clock.wall
    markers = list(list_markers(folder))
    if not markers:
        return []
    todo, stale = due(
        markers,
        now=wall(),
        current=(incident.job_id, incident.restart),
        min_age_s=cfg.epilog.pending_min_age_s,
        max_age_s=cfg.epilog.pending_max_age_s,
    )
    for m in stale:
        abandon(folder, m, now=wall())
    handled = []
    for m in todo:
        # an incident needs its node evidence waited for, Slurm asked, a plan applied: keep a margin
        if incident.budget.left() < min(20.0, cfg.epilog.time_budget_s / 2):
            log.info(
                "controller.pending_left",
                count=len(todo) - len(handled),
                why="out of this hook's budget",
            )
            break
        log.info(
            "controller.completing_pending",
            job=m.job_id,
            restart=m.restart,
            holder=m.holder,
            age_s=round(wall() - m.since, 1),
        )
        try:
            record = handle(_pending(incident, m))
        except ScoutError as exc:
            log.error("controller.pending_failed", job=m.job_id, restart=m.restart, error=str(exc))
            continue
        handled.append((m.job_id, m.restart))
        log.info(
            "controller.pending_completed",
            job=m.job_id,
            restart=m.restart,
            status=record.status.value if record is not None else "no incident",
        )
    return handled


def _pending(current: Incident, marker: PendingIncident) -> Incident:
    """The marker's incident, handled within the current hook's budget and by its clock."""
    return Incident.begin(
        marker.context(),
        current.cfg,
        started=current.budget.started,
        clock=current.clock,
        holder=f"{current.holder} (completing)",
        env=current.env,
    )
