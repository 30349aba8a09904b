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

from scout_slurm.config import SiteConfig, load_hook_config
from scout_slurm.errors import EvidenceError, ScoutError, SlurmError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Finding, Verdict, VerdictKind
from scout_slurm.evidence.store import (
    create_record_exclusive,
    list_records,
    read_record,
    write_record,
)
from scout_slurm.hooks.pending import (
    Busy,
    PendingIncident,
    abandon,
    due,
    held_lock,
    list_markers,
    remove_marker,
    write_marker,
)
from scout_slurm.jobenv import HookContext, hook_context
from scout_slurm.evidence.gather import cycle_collector_paused, gather_evidence, with_full_records
from scout_slurm.localise.verdict import localise
from scout_slurm.log import configure, get_logger
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.evidence.checkfiles import assess_job, find_checkpoint_checks
from scout_slurm.remediation.eligibility import recovery_point
from scout_slurm.remediation.plan import (
    DRAINABLE,
    DrainDecision,
    DrainDecisions,
    JobFacts,
    NodeOutcome,
    NodeSuspicion,
    build_plan,
    drain_decision,
)
from scout_slurm.remediation.records import ActionsRecord, PlanStatus
from scout_slurm.report.markdown import render_incident_markdown
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
        excluded, requeue, restarts, state = (
            job.excluded_nodes,
            job.requeue,
            job.restart_count,
            job.state,
        )
        if not allocation:
            allocation = (
                job.nodes
            )  # the hook's SLURM_JOB_NODELIST is the whole allocation; this may have shrunk
        if not job.is_finished:  # COMPLETING while the Epilogs run: the base state is accounting's
            state = (
                ops.job_end_state(ctx.job_id, timeout=t, env=env, bin_dir=cfg.slurm.bin_dir)
                or state
            )
        log.info(
            "controller.job_state",
            job=ctx.job_id,
            state=state,
            scontrol_state=job.state,
            reason=job.reason,
        )
    except SlurmError as exc:
        log.warning("controller.job_info_failed", job=ctx.job_id, error=str(exc))
        excluded, requeue, restarts, state = (), True, ctx.restart, ""
    try:
        usable = tuple(
            n.name
            for n in ops.list_nodes(timeout=t, env=env, bin_dir=cfg.slurm.bin_dir)
            if not n.is_drained and n.state not in ("DOWN", "FUTURE")
        )
    except SlurmError as exc:
        log.warning("controller.list_nodes_failed", error=str(exc))
        usable = ()
    return JobFacts(
        job_id=ctx.job_id,
        allocation=allocation,
        excluded=excluded,
        requeue_allowed=requeue,
        restart_count=max(restarts, ctx.restart),
        usable_nodes=usable,
        state=state,
    )


def _wait_for_node_evidence(
    folder: JobFolder,
    nodes: tuple[str, ...],
    wait_s: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> list[str]:
    deadline = clock() + wait_s
    while True:
        missing = [n for n in nodes if not (folder.node_dir(n) / "epilog.json").exists()]
        if not missing or clock() >= deadline:
            return missing
        sleep(0.2)


def handle_job_end(
    ctx: HookContext,
    cfg: SiteConfig,
    *,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    started: float | None = None,
    holder: str = "controller",
    root_check_here: Callable[[Verdict], None] | None = None,
) -> ActionsRecord | None:
    """Run `ctx.restart`'s incident, under its lock; None when there was none (or another hook has
    it). `started`: when the hook began, on `clock` (its budget counts from there); now if not given.
    `root_check_here`: the batch host's own root checks, run once the verdict is written (the
    other nodes' Epilogs wait for that verdict themselves)."""
    started = clock() if started is None else started
    deadline = started + cfg.epilog.time_budget_s
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    restart = ctx.restart
    if not folder.root.is_dir():
        log.error(
            "controller.no_evidence_root",
            job=ctx.job_id,
            error=f"evidence root {folder.root} does not exist or is not a directory here: mount it on "
            'this host, or set [epilog] localise_on = "batch-host" in the site config',
        )
        return None
    if folder.path.is_symlink():
        log.error(
            "controller.unsafe_job_folder",
            job=ctx.job_id,
            error=f"{folder.path} is a symbolic link; the job may have planted it; not followed",
        )
        return None
    if not folder.path.is_dir() or not _has_scout_records(folder, restart):
        _say_not_a_scout_job(folder, ctx)
        return None
    if not _results_dir_ready(folder):
        return None
    try:
        with held_lock(folder, restart):
            record = _handle_locked(
                ctx,
                cfg,
                folder,
                env=env,
                clock=clock,
                wall=wall,
                sleep=sleep,
                started=started,
                deadline=deadline,
                holder=holder,
                root_check_here=root_check_here,
            )
    except Busy:
        log.info(
            "controller.busy",
            job=ctx.job_id,
            restart=restart,
            why="another live hook holds this incident's lock; it completes it",
        )
        return None
    if record is None or record.status in FINAL:
        remove_marker(folder, restart)
    return record


FINAL = (PlanStatus.APPLIED, PlanStatus.OBSERVE_ONLY, PlanStatus.NOTHING_TO_DO)


def _say_not_a_scout_job(folder: JobFolder, ctx: HookContext) -> None:
    """Why there is nothing to read, in words a site administrator can act on (a job that never ran
    under scout-srun is the common case; a run folder SlurmUser cannot read is a site problem)."""
    run = folder.run_dir(ctx.restart)
    if run.is_dir() and not os.access(run, os.R_OK | os.X_OK):
        log.error(
            "controller.cannot_read_job_evidence",
            job=ctx.job_id,
            folder=str(run),
            uid=os.geteuid(),
            fix="the Prolog gives the job's folders SlurmUser's group: set [evidence] slurm_user in the "
            "site config to slurm.conf's SlurmUser",
        )
    else:
        log.info("controller.not_a_scout_job", job=ctx.job_id)


def _results_dir_ready(folder: JobFolder) -> bool:
    """The results folder, laid out by the Prolog as SlurmUser's; created here only where this hook
    may (root, or a job folder of SlurmUser's). Never a link."""
    d = folder.results_dir
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


def _handle_locked(
    ctx: HookContext,
    cfg: SiteConfig,
    folder: JobFolder,
    *,
    env: Mapping[str, str] | None,
    clock: Callable[[], float],
    wall: Callable[[], float],
    sleep: Callable[[float], None],
    started: float,
    deadline: float,
    holder: str,
    root_check_here: Callable[[Verdict], None] | None = None,
) -> ActionsRecord | None:
    restart = ctx.restart
    actions_path = folder.actions_path(restart)
    if actions_path.exists():
        try:
            previous = read_record(actions_path, ActionsRecord, root=folder.root)
        except EvidenceError as exc:
            log.error("controller.actions_unreadable", error=str(exc))
            return None
        if previous.status in FINAL:
            log.info(
                "controller.already_handled",
                job=ctx.job_id,
                restart=restart,
                status=previous.status.value,
            )
            return previous
        log.info("controller.resuming_plan", job=ctx.job_id, status=previous.status.value)
        record = apply_plan(
            previous,
            actions_path,
            folder,
            timeout=cfg.slurm.timeout_s,
            retries=cfg.slurm.retries,
            retry_wait_s=cfg.slurm.retry_wait_s,
            deadline=deadline,
            env=env,
            bin_dir=cfg.slurm.bin_dir,
            clock=clock,
            wall=wall,
            sleep=sleep,
        )
        log.info(
            "controller.done",
            job=ctx.job_id,
            status=record.status.value,
            resumed=True,
            seconds=round(clock() - started, 3),
        )
        return record
    findings = _findings(folder, restart)

    def wait_for(nodes: tuple[str, ...]) -> list[str]:
        return _wait_for_node_evidence(
            folder,
            nodes,
            min(cfg.epilog.wait_for_nodes_s, max(0.0, deadline - clock() - 5)),
            clock,
            sleep,
        )

    # The node Epilogs' digests (one file a node instead of three a rank) are written before their
    # epilog.json: waiting for those first makes the one reading below cheap, clean job or not.
    allocation = tuple(expand_hostlist(ctx.job_nodelist))
    missing = wait_for(allocation) if allocation else None
    evidence = None
    if not ctx.job_failed and not findings:
        with cycle_collector_paused():  # this hook owns its process (evidence/gather.py says why)
            evidence = gather_evidence(folder, restart, job_exit_code=ctx.exit_code_raw)
        verdict = localise(evidence, now=wall())
        if verdict.kind in (VerdictKind.CLEAN, VerdictKind.UNCHECKED):
            write_record(folder.verdict_path(restart), verdict)
            log.info(
                "controller.clean",
                kind=verdict.kind.value,
                job=ctx.job_id,
                from_node_digests=len(evidence.abridged),
                seconds=round(clock() - started, 3),
            )
            return None
    # from here on an incident: if this hook dies, the next controller run on the cluster completes it
    write_marker(folder, PendingIncident.of(ctx, since=wall(), holder=holder))
    facts = job_facts(ctx, cfg, env)
    if (
        missing is None
    ):  # no node list from Slurm in the hook's environment: the job's, asked of Slurm
        missing = wait_for(facts.allocation)
        evidence = None
    if evidence is None:
        with cycle_collector_paused():
            evidence = gather_evidence(folder, restart, job_exit_code=ctx.exit_code_raw)
    if evidence.problems:
        log.warning(
            "controller.evidence_ignored",
            job=ctx.job_id,
            count=len(evidence.problems),
            problems=list(evidence.problems[:50]),
        )
    verdict = localise(evidence, now=wall())
    # the report quotes the suspects' records whole, not as the node digests abridged them
    evidence = with_full_records(evidence, folder, [s.rank for s in verdict.suspects])
    log.info(
        "controller.evidence",
        job=ctx.job_id,
        ranks=evidence.world_size,
        from_node_digests=len(evidence.abridged),
        seconds=round(clock() - started, 3),
    )
    if missing:
        verdict = _with_note(verdict, f"node epilog evidence missing from: {', '.join(missing)}")
    write_record(folder.verdict_path(restart), verdict)
    # what is on storage, as the batch host's Epilog found it as the job's own user (root-owned record)
    checks = find_checkpoint_checks(folder, restart)
    assessments = [
        a
        for a in assess_job(folder, current_verdict=verdict, checks=checks)
        if a.note.restart <= restart
    ]
    chosen, why = recovery_point(assessments, verdict.first_suspect_step)
    if root_check_here is not None:
        root_check_here(verdict)
    suspicions = _suspicions(
        folder, verdict, evidence, facts, cfg, deadline=deadline, clock=clock, sleep=sleep
    )
    decisions = _decide(ctx, cfg, folder, verdict, suspicions, at=wall())
    plan = build_plan(
        verdict,
        facts,
        cfg.remediation,
        evidence_path=str(folder.path),
        checkpoint=chosen.note if chosen else None,
        checkpoint_reason=why,
        checkpoint_status=chosen.status if chosen else None,
        decisions=decisions,
    )
    _record_decisions(ctx, cfg, folder, verdict, suspicions, decisions, plan, at=wall())
    status = (
        PlanStatus.NOTHING_TO_DO
        if not plan.actions
        else PlanStatus.OBSERVE_ONLY
        if cfg.remediation.observe_only
        else PlanStatus.PLANNED
    )
    record = ActionsRecord(
        job_id=ctx.job_id,
        restart=restart,
        verdict_kind=verdict.kind,
        status=status,
        actions=plan.actions,
        held_back=plan.held_back,
        results=(),
        created_at=wall(),
        updated_at=wall(),
    )
    if not create_record_exclusive(actions_path, record):
        log.info("controller.raced", job=ctx.job_id)  # another instance planned first; it applies
        return read_record(actions_path, ActionsRecord, root=folder.root)
    _write_report(folder, restart, verdict, evidence, record)
    if status == PlanStatus.PLANNED:
        record = apply_plan(
            record,
            actions_path,
            folder,
            timeout=cfg.slurm.timeout_s,
            retries=cfg.slurm.retries,
            retry_wait_s=cfg.slurm.retry_wait_s,
            deadline=deadline,
            env=env,
            bin_dir=cfg.slurm.bin_dir,
            clock=clock,
            wall=wall,
            sleep=sleep,
        )
        _write_report(folder, restart, verdict, evidence, record)
    log.info(
        "controller.done",
        job=ctx.job_id,
        verdict=verdict.kind.value,
        status=record.status.value,
        suspects=[(s.rank, s.node) for s in verdict.suspects],
        seconds=round(clock() - started, 3),
    )
    return record


def _suspicions(
    folder: JobFolder,
    verdict: Verdict,
    evidence,
    facts: JobFacts,
    cfg: SiteConfig,
    *,
    deadline: float,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> dict[str, NodeSuspicion]:
    """What is known of each named node of the allocation beyond the job's word: the GPU serials
    of its suspect ranks (the Prolog's map) and, on a site that asks for corroboration, the root
    checks its Epilog ran (waited for within the budget). Empty for a verdict that never drains."""
    from scout_slurm.hooks.rootcheck import RootChecks, corroborating, rootcheck_path

    if verdict.kind not in DRAINABLE:
        return {}
    nodes = [n for n in verdict.suspect_nodes if n in set(facts.allocation)]
    checks: dict[str, RootChecks] = {}
    if cfg.drain.drain_on == "corroborated" and nodes:
        wait_s = min(cfg.drain.wait_for_root_checks_s, max(0.0, deadline - clock() - 10.0))
        missing = _wait_for_files(
            [rootcheck_path(folder.node_dir(n), verdict.restart) for n in nodes],
            wait_s,
            clock,
            sleep,
        )
        for n in nodes:
            path = rootcheck_path(folder.node_dir(n), verdict.restart)
            if path in missing:
                log.warning(
                    "controller.no_root_checks",
                    node=n,
                    waited_s=round(wait_s, 1),
                    consequence="no corroboration from this node: excluded, not drained",
                )
                continue
            try:  # the node's root Epilog wrote it in its root-owned folder
                checks[n] = read_record(path, RootChecks, root=folder.root)
            except EvidenceError as exc:
                log.warning("controller.root_checks_unreadable", node=n, error=str(exc))
    out = {}
    for n in nodes:
        found = corroborating(checks.get(n), verdict.kind)
        out[n] = NodeSuspicion(
            node=n,
            gpu_serials=_gpu_serials(folder, verdict, evidence, n),
            corroborated_by=tuple(f"{f.category}: {f.detail}"[:120] for f in found),
            root_checked=n in checks,
        )
    return out


def _wait_for_files(
    paths: list[Path], wait_s: float, clock: Callable[[], float], sleep: Callable[[float], None]
) -> set[Path]:
    deadline = clock() + wait_s
    while True:
        missing = {p for p in paths if not p.exists()}
        if not missing or clock() >= deadline:
            return missing
        sleep(0.2)


def _gpu_serials(folder: JobFolder, verdict: Verdict, evidence, node: str) -> tuple[str, ...]:
    """The board serials of the GPUs the node's suspect ranks used ("" serials left out)."""
    from scout_slurm.hwmap.join import read_node_map

    try:
        hwmap = read_node_map(folder, node)
    except ScoutError:
        return ()
    by_uuid = {g.uuid: g.serial for g in hwmap.gpus}
    uuids = [
        u
        for s in verdict.suspects
        if s.node == node and s.rank in evidence.places
        for u in evidence.places[s.rank].gpu_uuids
    ]
    return tuple(dict.fromkeys(by_uuid[u] for u in uuids if by_uuid.get(u)))


def _decide(
    ctx: HookContext,
    cfg: SiteConfig,
    folder: JobFolder,
    verdict: Verdict,
    suspicions: dict[str, NodeSuspicion],
    *,
    at: float,
) -> dict[str, DrainDecision]:
    from scout_slurm.report.incident_history import past_incidents

    if not suspicions:
        return {}
    past = (
        past_incidents(folder.root, folder.cluster, since=at - cfg.drain.window_s)
        if cfg.drain.drain_on == "corroborated"
        else []
    )
    decisions = {
        n: drain_decision(s, job_id=ctx.job_id, user=_user(ctx), at=at, past=past, cfg=cfg.drain)
        for n, s in suspicions.items()
    }
    log.info(
        "controller.drain_rule",
        job=ctx.job_id,
        drain_on=cfg.drain.drain_on,
        past_incidents=len(past),
        decisions={n: (d.drain, d.why) for n, d in decisions.items()},
    )
    return decisions


def _user(ctx: HookContext) -> str:
    return ctx.job_user or f"uid {ctx.job_uid}"


def _record_decisions(
    ctx: HookContext,
    cfg: SiteConfig,
    folder: JobFolder,
    verdict: Verdict,
    suspicions: dict[str, NodeSuspicion],
    decisions: dict[str, DrainDecision],
    plan,
    *,
    at: float,
) -> None:
    """The incident's word on each named node, for the watch list and the next incident's rule."""
    from scout_slurm.hooks.rootcheck import RootChecks, rootcheck_path
    from scout_slurm.remediation.records import Drain

    if not suspicions:
        return
    drained = {a.payload.node for a in plan.actions if isinstance(a.payload, Drain)}
    rows = []
    for n, s in suspicions.items():
        d = decisions[n]
        outcome = "drain" if n in drained else "watch" if n in plan.watched else "held"
        why = d.why if outcome != "held" else "; ".join(plan.held_back)[:300]
        checks, findings = (), ()
        if s.root_checked:
            try:
                rc = read_record(
                    rootcheck_path(folder.node_dir(n), verdict.restart),
                    RootChecks,
                    root=folder.root,
                )
                checks = tuple(f"{o.name}: {o.status}" for o in rc.outcomes)
                findings = tuple(f"{f.category}: {f.detail}"[:200] for f in rc.findings)
            except EvidenceError:
                pass
        rows.append(NodeOutcome(n, s.gpu_serials, outcome, why, checks, findings))
    record = DrainDecisions(
        job_id=ctx.job_id,
        restart=verdict.restart,
        user=_user(ctx),
        uid=ctx.job_uid,
        kind=verdict.kind,
        at=at,
        drain_on=cfg.drain.drain_on,
        nodes=tuple(rows),
    )
    try:
        write_record(folder.results_dir / f"drain-decisions-{verdict.restart}.json", record)
    except (ScoutError, OSError) as exc:
        log.warning(
            "controller.decisions_not_written",
            error=str(exc),
            consequence="this incident will not count towards the drain rule's history",
        )


def complete_pending(
    ctx: HookContext,
    cfg: SiteConfig,
    *,
    started: float,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    holder: str = "controller",
) -> list[tuple[int, int]]:
    """Complete the cluster's incidents that a killed hook left unfinished (hooks/pending.py), within
    what is left of this hook's budget; returns the (job, run) pairs handled. Each goes through
    `handle_job_end` under its own lock, so a live hook's incident is never touched."""
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    deadline = started + cfg.epilog.time_budget_s
    markers = list(list_markers(folder))
    if not markers:
        return []
    todo, stale = due(
        markers,
        now=wall(),
        current=(ctx.job_id, ctx.restart),
        min_age_s=cfg.epilog.pending_min_age_s,
        max_age_s=cfg.epilog.pending_max_age_s,
    )
    for m in stale:
        abandon(folder, m, now=wall())
    handled = []
    for m in todo:
        # an incident needs its node evidence waited for, Slurm asked, a plan applied: keep a margin
        if deadline - clock() < min(20.0, cfg.epilog.time_budget_s / 2):
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
            record = handle_job_end(
                m.context(),
                cfg,
                env=env,
                clock=clock,
                wall=wall,
                sleep=sleep,
                started=started,
                holder=f"{holder} (completing)",
            )
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


def _with_note(verdict: Verdict, note: str) -> Verdict:
    import dataclasses

    return dataclasses.replace(verdict, reasoning=(*verdict.reasoning, note))


def _write_report(
    folder: JobFolder, restart: int, verdict: Verdict, evidence, record: ActionsRecord
) -> None:
    from scout_slurm.evidence.store import atomic_write_bytes

    # the pictures (latency, hardware, the HTML page) come from the bundle; failing to build or draw
    # them must never cost the Markdown report, the plan or the Epilog
    bundle = None
    try:
        from scout_slurm.report.bundle_loader import load_incident_bundle

        bundle = load_incident_bundle(
            folder, restart, evidence=evidence, verdict=verdict, actions=record
        )
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

        atomic_write_bytes(
            folder.report_html_path(restart), render_incident_html(bundle).encode("utf-8")
        )
    except Exception as exc:  # noqa: BLE001
        log.warning("controller.report_html_failed", job=folder.job_id, error=repr(exc))


def main() -> int:
    started = (
        time.monotonic()
    )  # the budget includes reading the config (a FIFO or a hung mount there)
    configure()
    try:
        ctx = hook_context(os.environ)
        hook_cfg = load_hook_config(os.environ)
        if hook_cfg.refused:
            log.error(
                "controller.config_refused",
                reason=hook_cfg.refused,
                consequence="safe defaults (observe only, the default evidence root)",
            )
        cfg = hook_cfg.config
        if cfg.epilog.localise_on != "controller":
            return 0
        try:
            handle_job_end(ctx, cfg, started=started)
        finally:
            complete_pending(ctx, cfg, started=started)
    except ScoutError as exc:
        log.error("controller.failed", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - never let scout's bug look like the job's failure
        log.exception("controller.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
