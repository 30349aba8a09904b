"""`scout-epilog`, the node Epilog (root, every node): node-local evidence into the job's
`nodes/<node>/epilog.json`. Exits 0 (a failing Epilog drains the node) unless the site asks to
drain on local hardware errors. On sites whose controller cannot read the evidence, the batch
host's Epilog also runs the incident's stages (incident/run.py), as the controller would.

Root-side confirmation on suspicion ([drain] drain_on = "corroborated"): after epilog.json, the
Epilog of a failed job waits for the controller's verdict; if it names this node, it runs the
bounded root checks of hooks/rootcheck.py into `nodes/<node>/rootcheck-<run>.json`, which the
controller waits for before it decides whether to drain. A node the verdict does not name is
never checked."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from scout_slurm.config import EpilogConfig, SiteConfig, load_hook_config
from scout_slurm.errors import ScoutError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.hooks.nodefolder import ensure_node_dir
from scout_slurm.jobenv import hook_context
from scout_slurm.log import configure, configure_hook, get_logger
from scout_slurm.slurm.hostlist import expand_hostlist

log = get_logger("scout.epilog")


def _job_started(folder: JobFolder, node: str) -> float:
    """When the Prolog wrote this node's map; 0 if absent or not to be trusted. No component below
    the evidence root is followed if it is a link (the job may have planted one where the Prolog did
    not lay out its folders), and only a regular file owned by root counts: the time bounds which
    kernel log lines are attached, so a job must not be able to choose it."""
    import stat as stat_mod

    from scout_slurm.evidence.safeio import DIR_PATH, open_below, split_under

    path = os.fspath(folder.hardware_map_path(node))
    try:
        base, parts = split_under(path, folder.root, path)
        dir_fd = open_below(base, parts[:-1], path, DIR_PATH)
    except (ScoutError, OSError):
        return 0.0
    try:
        st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return 0.0
    finally:
        os.close(dir_fd)
    if not stat_mod.S_ISREG(st.st_mode) or st.st_uid != 0:
        return 0.0
    return st.st_mtime


def _write_digest(folder: JobFolder, restart: int, node: str) -> None:
    """This node's ranks' records, abridged into one file for the controller (evidence/digest.py).
    Whatever goes wrong here costs only the controller's time: it then reads the ranks' files."""
    import time

    from scout_slurm.evidence.digest import build_node_digest

    started = time.monotonic()
    try:
        digest, note = build_node_digest(folder, restart, node, now=time.time())
        if digest is not None:
            write_record(folder.node_digest_path(restart, node), digest)
    except (ScoutError, OSError) as exc:
        log.warning("epilog.digest_failed", node=node, error=str(exc))
        return
    except Exception as exc:
        log.exception("epilog.digest_bug", node=node, error=repr(exc))
        return
    log.info(
        "epilog.digest",
        node=node,
        restart=restart,
        note=note,
        seconds=round(time.monotonic() - started, 3),
    )


def _is_batch_host(ctx) -> bool:
    nodes = expand_hostlist(ctx.job_nodelist)
    return bool(nodes) and nodes[0] == ctx.node


def _json_names_below(folder: JobFolder, path: Path) -> bool:
    """Whether the job-owned folder `path` holds a `.json` name, listed through no-follow
    directory fds (a link the job planted anywhere below the evidence root is not followed)."""
    from scout_slurm.evidence.safeio import list_names_below

    try:
        return any(n.endswith(".json") for n in list_names_below(path, folder.root))
    except (ScoutError, OSError):
        return False


def _has_findings(folder: JobFolder, restart: int) -> bool:
    return _json_names_below(folder, folder.findings_dir(restart))


def _ran_under_scout(folder: JobFolder, restart: int) -> bool:
    """Whether the run left scout's rank records (the controller writes a verdict only then): a
    failed job that never ran under scout-srun must not hold its nodes waiting for one."""
    return _json_names_below(folder, folder.ranks_dir(restart))


def _check_checkpoints(folder: JobFolder, ctx, cfg: EpilogConfig) -> None:
    """The job's checkpoints, checked as the job's own user within the budget, into a root-owned
    record the controller decides from (hooks/ckptcheck.py): no privileged code opens a path a job
    named. Before epilog.json, which the controller waits for. Failing here costs only
    eligibility."""
    from scout_slurm.hooks.ckptcheck import write_checkpoint_checks

    try:
        write_checkpoint_checks(
            folder,
            ctx.restart,
            ctx.node,
            uid=ctx.job_uid,
            gid=ctx.job_gid,
            time_budget_s=cfg.checkpoint_check_s,
            byte_budget=cfg.checkpoint_check_bytes,
        )
    except (ScoutError, OSError) as exc:
        log.warning(
            "epilog.checkpoint_checks_failed",
            node=ctx.node,
            error=str(exc),
            consequence="no checkpoint is eligible as a recovery point for this run",
        )
    except Exception as exc:
        log.exception("epilog.checkpoint_checks_bug", node=ctx.node, error=repr(exc))


def root_check_if_named(
    folder: JobFolder, node: str, verdict, cfg: SiteConfig, *, deadline: float
) -> None:
    """The root checks on this node when `verdict` names it, within what is left until `deadline`
    (time.monotonic) and the site's [drain] root_check_s; recorded whatever their outcome."""
    import time

    from scout_slurm.hooks.rootcheck import (
        CORROBORATES,
        IbBaseline,
        run_checks,
    )

    if node not in verdict.suspect_nodes:
        log.info(
            "epilog.root_checks_not_named",
            node=node,
            verdict=verdict.kind.value,
            why="the verdict does not name this node: no root checks",
        )
        return
    if verdict.kind not in CORROBORATES:
        log.info("epilog.root_checks_not_needed", node=node, verdict=verdict.kind.value)
        return
    budget = min(cfg.drain.root_check_s, deadline - time.monotonic() - 1.0)
    if budget <= 0:
        log.warning("epilog.root_checks_no_time", node=node, budget_s=cfg.epilog.time_budget_s)
        return
    started_wall = _job_started(folder, node)
    since_boot = max(0.0, _uptime() - (time.time() - started_wall)) if started_wall else 0.0
    baseline = None
    if folder.ib_baseline_path(verdict.restart, node).exists():
        try:
            read = read_record(
                folder.ib_baseline_path(verdict.restart, node), IbBaseline, root=folder.root
            )
            baseline = {c.key: c.value for c in read.counters}
        except ScoutError as exc:
            log.warning("epilog.ib_baseline_unreadable", error=str(exc))
    source = (
        cfg.drain.test_kernel_log.replace("{node}", node)
        if cfg.drain.test_kernel_log
        else "/dev/kmsg"
    )
    gpus = ()
    try:  # the Prolog's map of the node (root-written): an Xid's PCI address names its GPU
        from scout_slurm.hwmap.join import read_node_map

        gpus = tuple(read_node_map(folder, node).gpus)
    except ScoutError as exc:
        log.info("epilog.no_hardware_map", node=node, error=str(exc))
    checks = run_checks(
        node,
        verdict,
        budget_s=budget,
        kernel_source=source,
        since_boot_s=since_boot,
        ib_baseline=baseline,
        gpus=gpus,
    )
    write_record(folder.rootcheck_path(verdict.restart, node), checks)
    log.info(
        "epilog.root_checks",
        node=node,
        job=verdict.job_id,
        restart=verdict.restart,
        seconds=checks.seconds,
        outcomes=[(o.name, o.status) for o in checks.outcomes],
        findings=[f.category for f in checks.findings],
    )


def _uptime() -> float:
    from scout_slurm.hooks.nodeevidence import _uptime as uptime

    return uptime()


def _root_check_on_suspicion(folder: JobFolder, ctx, cfg: SiteConfig, *, started: float) -> None:
    """Wait for the controller's verdict of a failed run, then check this node if it is named.
    Failing here costs only the corroboration: the node is then excluded, not drained."""
    import time

    from scout_slurm.hooks.rootcheck import wait_for_verdict

    deadline = started + cfg.epilog.time_budget_s
    wait = min(cfg.drain.verdict_wait_s, deadline - time.monotonic() - cfg.drain.root_check_s - 2.0)

    def check() -> None:
        verdict = wait_for_verdict(folder.verdict_path(ctx.restart), folder.root, max(0.0, wait))
        if verdict is None:
            log.info(
                "epilog.no_verdict",
                node=ctx.node,
                waited_s=round(max(0.0, wait), 1),
                consequence="no root checks on this node for this run",
            )
            return
        root_check_if_named(folder, ctx.node, verdict, cfg, deadline=deadline)

    _guarded(ctx.node, check)


def _guarded(node: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except (ScoutError, OSError) as exc:
        log.warning(
            "epilog.root_checks_failed",
            node=node,
            error=str(exc),
            consequence="no root corroboration from this node: it is excluded, not drained",
        )
    except Exception as exc:
        log.exception("epilog.root_checks_bug", node=node, error=repr(exc))


def _localise_here(folder: JobFolder, ctx, cfg: SiteConfig, *, started: float) -> None:
    """The controller's job-end handling on the batch host ([epilog] localise_on = "batch-host"):
    the same incident stages (incident/run.py), with this host's own root checks between the
    verdict and the plan."""
    from scout_slurm.incident import run
    from scout_slurm.incident.incident import Incident

    incident = Incident.begin(ctx, cfg, started=started, holder=f"batch-host {ctx.node}")
    here = None
    if cfg.drain.drain_on == "corroborated":

        def here(verdict) -> None:
            _guarded(
                ctx.node,
                lambda: root_check_if_named(
                    folder, ctx.node, verdict, cfg, deadline=incident.budget.deadline
                ),
            )

    try:
        run.handle(incident, root_check_here=here)
    finally:
        run.complete_pending(incident)


def exit_status(hardware_error: bool, cfg: EpilogConfig) -> int:
    """Slurm drains a node whose Epilog exits non-zero: only a local hardware error, on a site that
    asked for it, does that (pure)."""
    return 1 if hardware_error and cfg.drain_on_local_hardware_error else 0


# How long the look at the evidence root before anything else may take (the Prolog's map's
# time): past it the root is taken as hung, and only the node's own evidence is collected.
PROBE_S = 5.0


def run(environ: Mapping[str, str], *, collect: Callable | None = None) -> int:
    """The hook: configuration and logging here, every access to the evidence root in bounded
    child processes (hooks/bounded.py), so the Epilog exits within its budget whatever the
    evidence root does."""
    import time

    from scout_slurm.hooks.bounded import TIMED_OUT, margin_s, run_bounded

    started = time.monotonic()  # the budget includes reading the config
    ctx = hook_context(environ)
    hook_cfg = load_hook_config(environ)
    cfg = hook_cfg.config
    configure_hook("epilog", cfg.evidence.hook_log_dir)
    if hook_cfg.refused:
        log.error(
            "epilog.config_refused",
            reason=hook_cfg.refused,
            consequence="safe defaults (observe only, the default evidence root); exit 0",
        )
    if not ctx.node:
        raise ScoutError("scout-epilog runs on a node: SLURMD_NODENAME is not set")
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    if collect is None:
        from scout_slurm.hooks.nodeevidence import collect_node_evidence as collect
    budget = cfg.epilog.time_budget_s
    # the inner steps aim at the same end as the parent's cut-off: the budget less the margin
    inner_started = started - margin_s(budget)
    cutoff = started + budget - margin_s(budget)

    probe = run_bounded(
        lambda report: _job_started(folder, ctx.node),
        min(PROBE_S, budget / 4),
        name="evidence root probe",
        log=log,
        patience_s=budget / 4,  # a loaded node's slow look is not a hung root (only D state is)
    )
    root_hung = probe.status == TIMED_OUT
    if root_hung:
        log.error(
            "epilog.evidence_root_hung",
            root=str(folder.root),
            node=ctx.node,
            job=ctx.job_id,
            waited_s=probe.seconds,
            consequence="only this node's own evidence is collected; nothing is written to the "
            "evidence root; exit 0 unless a local hardware error drains",
        )
    started_wall = float(probe.result or 0.0) if probe.done else 0.0

    def work(report) -> None:
        evidence = collect(ctx.node, ctx.job_id, job_started_wall=started_wall)
        report(hardware_error=bool(evidence.hardware_error))
        log.info(
            "epilog.node_evidence",
            job=ctx.job_id,
            node=ctx.node,
            kernel_lines=len(evidence.kernel_lines),
            hardware_error=evidence.hardware_error,
            problems=list(evidence.problems),
        )
        if not root_hung:
            _write_evidence(folder, ctx, cfg, evidence, report, started=inner_started)

    out = run_bounded(work, cutoff - time.monotonic(), name="epilog evidence", log=log)
    if not out.done:
        log.error(
            "epilog.evidence_hung" if out.status == TIMED_OUT else "epilog.evidence_failed",
            root=str(folder.root),
            node=ctx.node,
            job=ctx.job_id,
            stage=out.last("stage", "collecting this node's evidence"),
            error=out.error,
            abandoned=out.abandoned,
            seconds=round(time.monotonic() - started, 3),
            budget_s=budget,
            consequence="what was not written is lost for this run; exit 0 unless a local "
            "hardware error drains",
        )
    code = exit_status(bool(out.last("hardware_error", False)), cfg.epilog)
    if code:
        log.error(
            "epilog.hardware_error_drain",
            node=ctx.node,
            action="exit 1: Slurm drains this node ([epilog] drain_on_local_hardware_error = true)",
        )
    return code


def _write_evidence(folder: JobFolder, ctx, cfg: SiteConfig, evidence, report, *, started) -> None:
    """In the bounded child: this node's evidence into the job's folder, then the batch host's
    incident stages or the root checks on suspicion. `report(stage=...)` tells the parent where
    it is, for its log if the evidence root hangs here."""
    # from here on the node's own verdict stands whatever happens to the shared evidence
    try:
        report(stage="laying out this node's folder")
        ensure_node_dir(folder, ctx.node)
        report(stage="writing the node digest")
        _write_digest(folder, ctx.restart, ctx.node)
        if _is_batch_host(ctx) and (ctx.job_failed or _has_findings(folder, ctx.restart)):
            report(stage="checking the job's checkpoints")
            _check_checkpoints(folder, ctx, cfg.epilog)
        # epilog.json last: the controller waits for it, and then finds the digest there too
        report(stage="writing epilog.json")
        write_record(folder.node_epilog_path(ctx.node), evidence)
        if cfg.epilog.localise_on == "batch-host" and _is_batch_host(ctx):
            report(stage="localising on the batch host")
            _localise_here(folder, ctx, cfg, started=started)
        elif (
            cfg.drain.drain_on == "corroborated"
            and _ran_under_scout(folder, ctx.restart)
            and (ctx.job_failed or _has_findings(folder, ctx.restart))
        ):
            report(stage="root checks on suspicion")
            _root_check_on_suspicion(folder, ctx, cfg, started=started)
        report(stage="done")
    except ScoutError as exc:
        log.error("epilog.failed", error=str(exc))
    except Exception as exc:
        log.exception("epilog.bug", error=repr(exc))


def main(*, environ: Mapping[str, str] | None = None, collect: Callable | None = None) -> int:
    """0 unless `[epilog] drain_on_local_hardware_error` is set and this node logged a hardware
    error (then 1). The keyword arguments are test seams; Slurm runs it with none."""
    from scout_slurm.entry import answered

    if environ is None and answered("scout-epilog"):
        return 0
    configure()
    try:
        return run(os.environ if environ is None else environ, collect=collect)
    except ScoutError as exc:
        log.error("epilog.failed", error=str(exc))
    except Exception as exc:
        log.exception("epilog.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
