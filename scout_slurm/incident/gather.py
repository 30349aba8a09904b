"""Stage 1, gather (rim): what the incident is decided from, read from the job's evidence folder
(the ranks' records, the node Epilogs' evidence and root checks, the checkpoint checks, the
drain rule's history) and from Slurm (`job_facts`, through slurm/ops.py). Writes nothing."""

from __future__ import annotations

import os
from collections.abc import Sequence

from scout_slurm.errors import EvidenceError, SlurmError
from scout_slurm.evidence.checkfiles import find_checkpoint_checks
from scout_slurm.evidence.gather import cycle_collector_paused, gather_evidence, with_full_records
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Finding, Verdict, VerdictKind
from scout_slurm.evidence.store import list_records, read_record
from scout_slurm.hooks.rootcheck import RootChecks, corroborating
from scout_slurm.incident.decide import NamedNode
from scout_slurm.incident.incident import Incident
from scout_slurm.localise.verdict import JobEvidence
from scout_slurm.log import get_logger
from scout_slurm.remediation.checkpoint_assessment import assess_job
from scout_slurm.remediation.plan import DRAINABLE, JobFacts, NodeSuspicion, PastIncident
from scout_slurm.slurm import ops
from scout_slurm.slurm.hostlist import expand_hostlist

log = get_logger("scout.controller")


def has_scout_records(folder: JobFolder, restart: int) -> bool:
    """Whether the run left scout's rank records (a job that never ran under scout-srun did not)."""
    d = folder.ranks_dir(restart)
    try:
        return d.is_dir() and not d.is_symlink() and any(n.endswith(".json") for n in os.listdir(d))
    except OSError:
        return False


def findings(folder: JobFolder, restart: int) -> list[Finding]:
    d = folder.findings_dir(restart)
    if not d.is_dir():
        return []
    try:
        records, _ = list_records(d, "*.json", Finding, root=folder.root)
    except EvidenceError:
        return []
    return records


def allocation(incident: Incident) -> tuple[str, ...]:
    """The job's nodes as the hook's environment names them (empty when Slurm did not say)."""
    return tuple(expand_hostlist(incident.ctx.job_nodelist))


def wait_for_node_evidence(incident: Incident, nodes: Sequence[str]) -> list[str]:
    """The nodes whose Epilog has not written epilog.json when the wait ends ([epilog]
    wait_for_nodes_s, within the budget less 5 s)."""
    folder = incident.folder
    return incident.budget.wait_until(
        lambda: [n for n in nodes if not folder.node_epilog_path(n).exists()],
        lambda missing: not missing,
        seconds=min(incident.cfg.epilog.wait_for_nodes_s, incident.budget.left(5.0)),
    )


def evidence(incident: Incident) -> JobEvidence:
    """The run's evidence, the node digests taken where they stand for the ranks' files."""
    with cycle_collector_paused():  # this hook owns its process (evidence/gather.py says why)
        return gather_evidence(
            incident.folder, incident.restart, job_exit_code=incident.ctx.exit_code_raw
        )


def say_ignored(incident: Incident, found: JobEvidence) -> None:
    if found.problems:
        log.warning(
            "controller.evidence_ignored",
            job=incident.job_id,
            count=len(found.problems),
            problems=list(found.problems[:50]),
        )


def suspects_whole(incident: Incident, found: JobEvidence, verdict: Verdict) -> JobEvidence:
    """The report quotes the suspects' records whole, not as the node digests abridged them."""
    return with_full_records(found, incident.folder, [s.rank for s in verdict.suspects])


def job_facts(incident: Incident) -> JobFacts:
    """What Slurm says of the job and the cluster; what it could not say is logged and assumed
    (requeue allowed, no node known usable)."""
    ctx, slurm, env = incident.ctx, incident.cfg.slurm, incident.env
    t = slurm.timeout_s
    nodes = allocation(incident)
    try:
        job = ops.job_info(ctx.job_id, timeout=t, env=env, bin_dir=slurm.bin_dir)
        excluded, requeue, restarts, state = (
            job.excluded_nodes,
            job.requeue,
            job.restart_count,
            job.state,
        )
        if not nodes:
            # the hook's SLURM_JOB_NODELIST is the whole allocation; Slurm's may have shrunk
            nodes = job.nodes
        if not job.is_finished:  # COMPLETING while the Epilogs run: the base state is accounting's
            state = (
                ops.job_end_state(ctx.job_id, timeout=t, env=env, bin_dir=slurm.bin_dir) or state
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
            for n in ops.list_nodes(timeout=t, env=env, bin_dir=slurm.bin_dir)
            if not n.is_drained and n.state not in ("DOWN", "FUTURE")
        )
    except SlurmError as exc:
        log.warning("controller.list_nodes_failed", error=str(exc))
        usable = ()
    return JobFacts(
        job_id=ctx.job_id,
        allocation=nodes,
        excluded=excluded,
        requeue_allowed=requeue,
        restart_count=max(restarts, ctx.restart),
        usable_nodes=usable,
        state=state,
    )


def checkpoint_assessments(incident: Incident, verdict: Verdict) -> list:
    """The run's checkpoints as the batch host's Epilog found them on storage, as the job's own
    user (its root-owned record), assessed against the verdict; none of a later run."""
    folder, restart = incident.folder, incident.restart
    checks = find_checkpoint_checks(folder, restart)
    return [
        a
        for a in assess_job(folder, current_verdict=verdict, checks=checks)
        if a.note.restart <= restart
    ]


def named_nodes(
    incident: Incident, verdict: Verdict, found: JobEvidence, facts: JobFacts
) -> dict[str, NamedNode]:
    """Each node of the allocation the verdict names, with the GPU serials of its suspect ranks
    (the Prolog's map) and, on a site that asks for corroboration, the root checks its Epilog ran
    (waited for within the budget). Empty for a verdict that never drains."""
    if verdict.kind not in DRAINABLE:
        return {}
    nodes = [n for n in verdict.suspect_nodes if n in set(facts.allocation)]
    checks: dict[str, RootChecks] = {}
    if incident.cfg.drain.drain_on == "corroborated" and nodes:
        checks = _root_checks(incident, nodes, verdict.restart)
    out = {}
    for n in nodes:
        rc = checks.get(n)
        suspicion = NodeSuspicion(
            node=n,
            gpu_serials=_gpu_serials(rc),
            corroborated_by=tuple(
                f"{f.category}: {f.detail}"[:120] for f in corroborating(rc, verdict.kind)
            ),
            root_checked=rc is not None,
        )
        out[n] = NamedNode(
            suspicion,
            root_checks=tuple(f"{o.name}: {o.status}" for o in rc.outcomes) if rc else (),
            root_findings=tuple(f"{f.category}: {f.detail}"[:200] for f in rc.findings)
            if rc
            else (),
        )
    return out


def _root_checks(incident: Incident, nodes: list[str], restart: int) -> dict[str, RootChecks]:
    folder = incident.folder
    paths = {n: folder.rootcheck_path(restart, n) for n in nodes}
    wait_s = min(incident.cfg.drain.wait_for_root_checks_s, incident.budget.left(10.0))
    missing = incident.budget.wait_until(
        lambda: {p for p in paths.values() if not p.exists()},
        lambda left: not left,
        seconds=wait_s,
    )
    checks = {}
    for n, path in paths.items():
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
    return checks


def _gpu_serials(checks: RootChecks | None) -> tuple[str, ...]:
    """The board serials of the GPUs the node's root checks found at fault (an Xid's PCI address
    in the Prolog's map, NVML's errors): root's evidence only. The job's own place record says
    which GPU a rank used, but a job could name another tenant's GPU there, so it charges none."""
    if checks is None:
        return ()
    return tuple(dict.fromkeys(f.gpu_serial for f in checks.findings if f.gpu_serial))


def past_incidents(incident: Incident, *, at: float) -> list[PastIncident]:
    """The drain rule's history on this cluster within its window (read only where the rule
    counts it: drain_on = "corroborated")."""
    from scout_slurm.incident.history import past_incidents as read_past

    drain = incident.cfg.drain
    if drain.drain_on != "corroborated":
        return []
    folder = incident.folder
    return read_past(folder.root, folder.cluster, since=at - drain.window_s)


def earlier_verdicts(incident: Incident) -> list[Verdict]:
    """The verdicts of the job's runs before this one (those on record and readable)."""
    folder, out = incident.folder, []
    for run in range(max(0, incident.restart - 16), incident.restart):
        path = folder.verdict_path(run)
        if not path.exists():
            continue
        try:
            out.append(read_record(path, Verdict, root=folder.root))
        except EvidenceError as exc:
            log.warning("controller.earlier_verdict_unreadable", run=run, error=str(exc))
    return out


def suspect_stacks(incident: Incident, verdict: Verdict) -> list[tuple[int, tuple[str, ...]]]:
    """The hung suspects' dumped main threads (the job's files, read bounded and no-follow)."""
    if verdict.kind is not VerdictKind.HANG:
        return []
    from scout_slurm.evidence.stacks import load_stacks

    return load_stacks(incident.folder, incident.restart, [s.rank for s in verdict.suspects])
