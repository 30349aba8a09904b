"""The controller Epilog (EpilogSlurmctld, once per job, as SlurmUser): when the job failed or
left a finding, localise, keep the incident (verdict, report), plan and apply the remediation.

`handle_job_end` is shared with the batch host's node Epilog for sites whose controller cannot
read the evidence. Exit status is always 0: Slurm only logs a failing EpilogSlurmctld, and
scout's own failure must never be mistaken for the job's.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Mapping

from scout_slurm.config import SiteConfig, load_config
from scout_slurm.errors import EvidenceError, ScoutError, SlurmError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Finding, Verdict, VerdictKind
from scout_slurm.evidence.store import create_record_exclusive, list_records, read_record, write_record
from scout_slurm.jobenv import HookContext, hook_context
from scout_slurm.localise.gather import gather_evidence, with_full_records
from scout_slurm.localise.verdict import localise
from scout_slurm.log import configure, get_logger
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.checkfiles import assess_job
from scout_slurm.remediation.eligibility import recovery_point
from scout_slurm.remediation.plan import JobFacts, build_plan
from scout_slurm.remediation.records import ActionsRecord, PlanStatus
from scout_slurm.report.incident import render_incident_markdown
from scout_slurm.slurm import ops
from scout_slurm.slurm.hostlist import expand_hostlist

log = get_logger("scout.controller")


def _has_scout_records(folder: JobFolder, restart: int) -> bool:
    d = folder.ranks_dir(restart)
    try:
        return d.is_dir() and not d.is_symlink() and any(n.endswith(".json") for n in os.listdir(d))
    except OSError:
        return False


def _findings(folder: JobFolder, restart: int) -> list[Finding]:
    d = folder.findings_dir(restart)
    if not d.is_dir():
        return []
    try:
        records, _ = list_records(d, "*.json", Finding, root=folder.root)
    except EvidenceError:
        return []
    return records


def job_facts(ctx: HookContext, cfg: SiteConfig, env: Mapping[str, str] | None) -> JobFacts:
    t = cfg.slurm.timeout_s
    allocation = tuple(expand_hostlist(ctx.job_nodelist))
    try:
        job = ops.job_info(ctx.job_id, timeout=t, env=env, bin_dir=cfg.slurm.bin_dir)
        excluded, requeue, restarts = job.excluded_nodes, job.requeue, job.restart_count
        if not allocation:
            allocation = job.nodes  # the hook's SLURM_JOB_NODELIST is the whole allocation; this may have shrunk
    except SlurmError as exc:
        log.warning("controller.job_info_failed", job=ctx.job_id, error=str(exc))
        excluded, requeue, restarts = (), True, ctx.restart
    try:
        usable = tuple(n.name for n in ops.list_nodes(timeout=t, env=env, bin_dir=cfg.slurm.bin_dir)
                       if not n.is_drained and n.state not in ("DOWN", "FUTURE"))
    except SlurmError as exc:
        log.warning("controller.list_nodes_failed", error=str(exc))
        usable = ()
    return JobFacts(job_id=ctx.job_id, allocation=allocation, excluded=excluded, requeue_allowed=requeue,
                    restart_count=max(restarts, ctx.restart), usable_nodes=usable)


def _wait_for_node_evidence(folder: JobFolder, nodes: tuple[str, ...], wait_s: float,
                            clock: Callable[[], float], sleep: Callable[[float], None]) -> list[str]:
    deadline = clock() + wait_s
    while True:
        missing = [n for n in nodes if not (folder.node_dir(n) / "epilog.json").exists()]
        if not missing or clock() >= deadline:
            return missing
        sleep(0.2)


def handle_job_end(ctx: HookContext, cfg: SiteConfig, *, env: Mapping[str, str] | None = None,
                   clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep) -> ActionsRecord | None:
    started = clock()
    deadline = started + cfg.epilog.time_budget_s
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    restart = ctx.restart
    if not folder.root.is_dir():
        log.error("controller.no_evidence_root", job=ctx.job_id,
                  error=f"evidence root {folder.root} does not exist or is not a directory here: mount it on "
                        "this host, or set [epilog] localise_on = \"batch-host\" in the site config")
        return None
    if folder.path.is_symlink():
        log.error("controller.unsafe_job_folder", job=ctx.job_id,
                  error=f"{folder.path} is a symbolic link; the job may have planted it; not followed")
        return None
    if not folder.path.is_dir() or not _has_scout_records(folder, restart):
        log.info("controller.not_a_scout_job", job=ctx.job_id)
        return None
    actions_path = folder.actions_path(restart)
    if actions_path.exists():
        try:
            previous = read_record(actions_path, ActionsRecord, root=folder.root)
        except EvidenceError as exc:
            log.error("controller.actions_unreadable", error=str(exc))
            return None
        if previous.status in (PlanStatus.APPLIED, PlanStatus.OBSERVE_ONLY, PlanStatus.NOTHING_TO_DO):
            log.info("controller.already_handled", job=ctx.job_id, restart=restart, status=previous.status.value)
            return previous
        log.info("controller.resuming_plan", job=ctx.job_id, status=previous.status.value)
        return apply_plan(previous, actions_path, folder, timeout=cfg.slurm.timeout_s, retries=cfg.slurm.retries,
                          retry_wait_s=cfg.slurm.retry_wait_s, deadline=deadline, env=env, bin_dir=cfg.slurm.bin_dir,
                          clock=clock, wall=wall, sleep=sleep)
    findings = _findings(folder, restart)

    def wait_for(nodes: tuple[str, ...]) -> list[str]:
        return _wait_for_node_evidence(folder, nodes, min(cfg.epilog.wait_for_nodes_s,
                                                          max(0.0, deadline - clock() - 5)), clock, sleep)

    # The node Epilogs' digests (one file a node instead of three a rank) are written before their
    # epilog.json: waiting for those first makes the one reading below cheap, clean job or not.
    allocation = tuple(expand_hostlist(ctx.job_nodelist))
    missing = wait_for(allocation) if allocation else None
    evidence = None
    if not ctx.job_failed and not findings:
        evidence = gather_evidence(folder, restart, job_exit_code=ctx.exit_code_raw)
        verdict = localise(evidence, now=wall())
        if verdict.kind == VerdictKind.CLEAN:
            write_record(folder.verdict_path(restart), verdict)
            log.info("controller.clean", job=ctx.job_id, from_node_digests=len(evidence.abridged),
                     seconds=round(clock() - started, 3))
            return None
    facts = job_facts(ctx, cfg, env)
    if missing is None:   # no node list from Slurm in the hook's environment: the job's, asked of Slurm
        missing = wait_for(facts.allocation)
        evidence = None
    if evidence is None:
        evidence = gather_evidence(folder, restart, job_exit_code=ctx.exit_code_raw)
    if evidence.problems:
        log.warning("controller.evidence_ignored", job=ctx.job_id, count=len(evidence.problems),
                    problems=list(evidence.problems[:50]))
    verdict = localise(evidence, now=wall())
    # the report quotes the suspects' records whole, not as the node digests abridged them
    evidence = with_full_records(evidence, folder, [s.rank for s in verdict.suspects])
    log.info("controller.evidence", job=ctx.job_id, ranks=evidence.world_size, from_node_digests=len(evidence.abridged),
             seconds=round(clock() - started, 3))
    if missing:
        verdict = _with_note(verdict, f"node epilog evidence missing from: {', '.join(missing)}")
    write_record(folder.verdict_path(restart), verdict)
    assessments = [a for a in assess_job(folder, current_verdict=verdict) if a.note.restart <= restart]
    chosen, why = recovery_point(assessments, verdict.first_suspect_step)
    plan = build_plan(verdict, facts, cfg.remediation, evidence_path=str(folder.path),
                      checkpoint=chosen.note if chosen else None, checkpoint_reason=why)
    status = (PlanStatus.NOTHING_TO_DO if not plan.actions else
              PlanStatus.OBSERVE_ONLY if cfg.remediation.observe_only else PlanStatus.PLANNED)
    record = ActionsRecord(job_id=ctx.job_id, restart=restart, verdict_kind=verdict.kind, status=status,
                           actions=plan.actions, held_back=plan.held_back, results=(), created_at=wall(),
                           updated_at=wall())
    if not create_record_exclusive(actions_path, record):
        log.info("controller.raced", job=ctx.job_id)  # another instance planned first; it applies
        return read_record(actions_path, ActionsRecord, root=folder.root)
    _write_report(folder, restart, verdict, evidence, record)
    if status == PlanStatus.PLANNED:
        record = apply_plan(record, actions_path, folder, timeout=cfg.slurm.timeout_s, retries=cfg.slurm.retries,
                            retry_wait_s=cfg.slurm.retry_wait_s, deadline=deadline, env=env,
                            bin_dir=cfg.slurm.bin_dir, clock=clock, wall=wall, sleep=sleep)
        _write_report(folder, restart, verdict, evidence, record)
    log.info("controller.done", job=ctx.job_id, verdict=verdict.kind.value, status=record.status.value,
             suspects=[(s.rank, s.node) for s in verdict.suspects], seconds=round(clock() - started, 3))
    return record


def _with_note(verdict: Verdict, note: str) -> Verdict:
    import dataclasses
    return dataclasses.replace(verdict, reasoning=(*verdict.reasoning, note))


def _write_report(folder: JobFolder, restart: int, verdict: Verdict, evidence, record: ActionsRecord) -> None:
    from scout_slurm.evidence.store import atomic_write_bytes
    # the pictures (latency, hardware, the HTML page) come from the bundle; failing to build or draw
    # them must never cost the Markdown report, the plan or the Epilog
    bundle = None
    try:
        from scout_slurm.report.bundleread import load_incident_bundle
        bundle = load_incident_bundle(folder, restart, evidence=evidence, verdict=verdict, actions=record)
    except Exception as exc:  # noqa: BLE001
        log.warning("controller.report_bundle_failed", job=folder.job_id, error=repr(exc))
    try:
        text = render_incident_markdown(verdict, evidence, record, bundle=bundle)
    except Exception as exc:  # noqa: BLE001
        log.warning("controller.report_bundle_failed", job=folder.job_id, error=repr(exc))
        bundle, text = None, render_incident_markdown(verdict, evidence, record)
    atomic_write_bytes(folder.report_path(restart), text.encode("utf-8"))
    if bundle is None:
        return
    try:
        from scout_slurm.report.html import render_incident_html
        atomic_write_bytes(folder.report_html_path(restart), render_incident_html(bundle).encode("utf-8"))
    except Exception as exc:  # noqa: BLE001
        log.warning("controller.report_html_failed", job=folder.job_id, error=repr(exc))


def main() -> int:
    configure()
    try:
        ctx = hook_context(os.environ)
        cfg = load_config(os.environ)
        if cfg.epilog.localise_on != "controller":
            return 0
        handle_job_end(ctx, cfg)
    except ScoutError as exc:
        log.error("controller.failed", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - never let scout's bug look like the job's failure
        log.exception("controller.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
