"""The Prolog (root, on every allocated node, `PrologFlags=Alloc`): lays out the job's evidence
folder and records this node's hardware map in `nodes/<node>/hardware-map.json`.

Slurm drains a node whose Prolog exits non-zero, so it exits 0 whatever goes wrong (bad
environment, unreadable config, full disk, timeout, unsafe folder), logging why, unless the site
set `[prolog] fail_on_broken_gpu` and NVML reported a GPU error. `main` is the rim.
"""

from __future__ import annotations

import os
import pwd
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scout_slurm import log as scout_log
from scout_slurm.config import load_hook_config
from scout_slurm.errors import ConfigError, EvidenceError, ScoutError
from scout_slurm.evidence import store
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.safeio import Owner, UnsafeFolder, ensure_dir
from scout_slurm.hooks.bounded import TIMED_OUT, BoundedChild, margin_s, run_bounded
from scout_slurm.hwmap.collect import MapBuilder
from scout_slurm.hwmap.records import HardwareMap
from scout_slurm.jobenv import HookContext, hook_context

ROOT_DIR_MODE = 0o755
# The job's own folders: the job's uid, SlurmUser's group, setgid so that what the job creates in
# them keeps that group: the controller Epilog (SlurmUser) reads them, nobody else does.
JOB_DIR_MODE = 0o2750
RESULTS_DIR_MODE = 0o755  # SlurmUser's: verdicts, actions, reports, resume instructions
PENDING_DIR_MODE = 0o750  # SlurmUser's: markers of incidents whose handling has not ended

# Of the time budget: past this share no further part of the map is started, past the next the
# collection is abandoned (what it has is written), and the rest is for writing.
STAGE_SHARE = 0.5
COLLECT_SHARE = 0.75


def slurm_user_owner(name: str, log: Any) -> Owner:
    """SlurmUser (the site config's `[evidence] slurm_user`) as the owner of the results and
    pending folders; root when that user does not exist here (then only root hooks write them)."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        log.warning(
            "prolog.no_slurm_user",
            slurm_user=name,
            using="root",
            consequence="a controller Epilog that does not run as root cannot read or write this "
            "job's evidence",
        )
        return Owner(0, 0, RESULTS_DIR_MODE)
    return Owner(pw.pw_uid, pw.pw_gid, RESULTS_DIR_MODE)


def _job_owner(uid: int, slurm: Owner) -> Owner:
    """The job's folders: the job's uid, SlurmUser's group (read access for the controller)."""
    return Owner(uid, slurm.gid, JOB_DIR_MODE)


def prepare_job_folder(
    folder: JobFolder,
    node: str,
    restart: int,
    job_owner: Owner,
    log: Any,
    slurm_owner: Owner | None = None,
) -> Path | None:
    """Create the job's folders; returns this node's folder (root-owned), or None if unsafe.

    The evidence root is the site's own (it may be a link the administrator made); every folder
    below it is opened without following links. The job's own folders failing does not stop
    the node's map from being written.
    """
    root_owner = Owner(0, 0, ROOT_DIR_MODE)
    fds: list[int] = []
    try:
        try:
            root_fd = os.open(folder.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise UnsafeFolder(
                f"evidence root {folder.root} does not exist: create it on storage every "
                f"node sees, or fix [evidence] root in the site config"
            ) from None
        fds.append(root_fd)
        cluster_fd = ensure_dir(root_fd, folder.cluster, root_owner, folder.cluster_dir)
        fds.append(cluster_fd)
        job_fd = ensure_dir(cluster_fd, str(folder.job_id), root_owner, folder.path)
        fds.append(job_fd)
        nodes_fd = ensure_dir(job_fd, folder.nodes_dir.name, root_owner, folder.nodes_dir)
        fds.append(nodes_fd)
        fds.append(
            ensure_dir(nodes_fd, folder.node_dir(node).name, root_owner, folder.node_dir(node))
        )
        slurm = slurm_owner or root_owner
        try:
            fds.append(ensure_dir(job_fd, folder.results_dir.name, slurm, folder.results_dir))
            fds.append(
                ensure_dir(
                    cluster_fd,
                    folder.pending_dir.name,
                    Owner(slurm.uid, slurm.gid, PENDING_DIR_MODE),
                    folder.pending_dir,
                )
            )
        except (OSError, EvidenceError) as exc:
            log.error(
                "prolog.results_folder_failed",
                reason=str(exc),
                consequence="the controller Epilog may be unable to write its verdict",
            )
        try:
            run_fd = ensure_dir(
                job_fd, folder.run_dir(restart).name, job_owner, folder.run_dir(restart)
            )
            fds.append(run_fd)
            for sub in folder.run(restart).subdirs:
                fds.append(ensure_dir(run_fd, sub.name, job_owner, sub))
            fds.append(
                ensure_dir(job_fd, folder.checkpoints_dir.name, job_owner, folder.checkpoints_dir)
            )
        except (OSError, EvidenceError) as exc:
            log.error(
                "prolog.job_folders_failed",
                reason=str(exc),
                consequence="the job may be unable to write its evidence",
            )
        return folder.node_dir(node)
    except (OSError, EvidenceError) as exc:
        log.error(
            "prolog.folder_failed", reason=str(exc), consequence="the hardware map is not written"
        )
        return None
    finally:
        for fd in fds:
            os.close(fd)


class _Outcome:
    def __init__(self) -> None:
        self.value: Any = None


def _run(
    ctx: HookContext,
    environ: Mapping[str, str],
    log: Any,
    *,
    sysfs_root: Path,
    proc_root: Path,
    nvml_loader: Any,
    clock: Callable[[], float],
) -> int:
    start = (
        time.monotonic()
    )  # the budget includes reading the config (a FIFO or a hung mount there)
    hook_cfg = load_hook_config(environ)
    # the node's own disk first: a hung evidence root is then still said somewhere
    scout_log.configure_hook("prolog", hook_cfg.config.evidence.hook_log_dir)
    log = scout_log.get_logger("scout.prolog").bind(
        job_id=ctx.job_id, node=ctx.node, restart=ctx.restart
    )
    if hook_cfg.refused:
        log.error(
            "prolog.config_refused",
            reason=hook_cfg.refused,
            consequence="safe defaults (observe only, the default evidence root); exit 0",
        )
    cfg = hook_cfg.config
    budget = cfg.prolog.time_budget_s
    builder = MapBuilder(
        ctx.node,
        sysfs_root=sysfs_root,
        proc_root=proc_root,
        nvml_loader=nvml_loader,
        clock=clock,
        deadline_s=budget * STAGE_SHARE,
    )
    slurm = slurm_user_owner(cfg.evidence.slurm_user, log)
    owner = _job_owner(ctx.job_uid, slurm)
    folders: BoundedChild | None = None
    try:
        folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    except EvidenceError as exc:
        log.error("prolog.folder_failed", reason=str(exc))
    else:
        # Every access to the evidence root in a bounded child (hooks/bounded.py), forked before
        # the collector thread starts: a hung root costs its bound, never a thread in D state.
        folders = BoundedChild(
            lambda report: _path_text(
                prepare_job_folder(folder, ctx.node, ctx.restart, owner, log, slurm)
            ),
            name="prolog folders",
        )
    collecting = _Outcome()
    collector = threading.Thread(
        target=lambda: setattr(collecting, "value", builder.run()),
        name="scout-prolog-collect",
        daemon=True,
    )
    collector.start()

    node_dir: Path | None = None
    if folders is not None:
        out = folders.wait(start + budget * COLLECT_SHARE - time.monotonic(), log=log)
        if out.status == TIMED_OUT:
            log.error(
                "prolog.folder_timeout",
                root=cfg.evidence.root,
                budget_s=budget,
                abandoned=out.abandoned,
                consequence="the hardware map is not written (evidence storage hung?)",
            )
        elif not out.done:
            log.error("prolog.folder_failed", reason=out.error)
        elif out.result:
            node_dir = Path(out.result)

    collector.join(max(0.0, start + budget * COLLECT_SHARE - time.monotonic()))
    if collector.is_alive() or collecting.value is None:
        why = (
            f"timed out after {time.monotonic() - start:.1f} s (budget {budget:g} s) while "
            f"collecting {builder.stage}"
        )
        hwmap = builder.snapshot((why,))
        log.error("prolog.collect_timeout", reason=why)
    else:
        hwmap = collecting.value

    if node_dir is not None:
        path = folder.hardware_map_path(ctx.node)

        def write(report) -> None:
            store.write_record(path, hwmap, mode=0o644)
            report(stage="map written")
            _write_ib_baseline(folder, ctx, log)

        out = run_bounded(
            write,
            start + budget - margin_s(budget) - time.monotonic(),
            name="prolog write",
            log=log,
        )
        if out.status == TIMED_OUT and out.last("stage") is None:
            log.error(
                "prolog.write_timeout", path=str(path), budget_s=budget, abandoned=out.abandoned
            )
        elif not out.done and out.last("stage") is None:
            log.error(
                "prolog.write_failed",
                path=str(path),
                reason=out.error,
                consequence="no hardware map for this node",
            )
        else:
            log.info(
                "prolog.map_written",
                path=str(path),
                gpus=len(hwmap.gpus),
                nics=len(hwmap.nics),
                ib_ports=len(hwmap.ib_ports),
                nvml_status=hwmap.nvml_status,
                problems=len(hwmap.problems),
                duration_s=round(time.monotonic() - start, 3),
            )
            if not out.done:
                log.warning("prolog.ib_counters_failed", reason=out.error)
    for problem in hwmap.problems[:20]:
        log.warning("prolog.map_problem", problem=problem)

    return _exit_code(hwmap, cfg.prolog.fail_on_broken_gpu, log)


def _path_text(path: Path | None) -> str | None:
    return None if path is None else os.fspath(path)


def _write_ib_baseline(folder: JobFolder, ctx: HookContext, log: Any) -> None:
    """The InfiniBand error counters at the job's start, for the root checks' deltas
    (hooks/rootcheck.py);
    nothing on a node without InfiniBand."""
    from scout_slurm.hooks.rootcheck import IbBaseline, IbCounter, ib_counters

    counters = ib_counters()
    if not counters:
        return
    try:
        store.write_record(
            folder.ib_baseline_path(ctx.restart, ctx.node),
            IbBaseline(ctx.node, time.time(), tuple(IbCounter(k, v) for k, v in counters.items())),
            mode=0o644,
        )
    except (ScoutError, OSError) as exc:
        log.warning(
            "prolog.ib_counters_failed",
            reason=str(exc),
            consequence="no InfiniBand deltas for this job",
        )


def _exit_code(hwmap: HardwareMap, fail_on_broken_gpu: bool, log: Any) -> int:
    if hwmap.nvml_failed:
        if fail_on_broken_gpu:
            log.error(
                "prolog.broken_gpu",
                nvml_status=hwmap.nvml_status,
                action="exit 1: Slurm drains this node ([prolog] fail_on_broken_gpu = true)",
            )
            return 1
        log.warning(
            "prolog.broken_gpu",
            nvml_status=hwmap.nvml_status,
            action="exit 0 ([prolog] fail_on_broken_gpu = false)",
        )
    return 0


def main(
    *,
    environ: Mapping[str, str] | None = None,
    sysfs_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    nvml_loader: Any = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """0 unless `[prolog] fail_on_broken_gpu` is set and NVML reported a GPU error (then 1).

    The keyword arguments are test seams; Slurm runs it with none.
    """
    from scout_slurm.entry import answered

    if environ is None and answered("scout-prolog"):
        return 0
    environ = os.environ if environ is None else environ
    scout_log.configure()
    log = scout_log.get_logger("scout.prolog")
    try:
        ctx = hook_context(environ)
    except ConfigError as exc:
        log.error("prolog.bad_environment", reason=str(exc), consequence="nothing recorded; exit 0")
        return 0
    if not ctx.node:
        log.error(
            "prolog.bad_environment",
            reason="SLURMD_NODENAME is not set: is this the node Prolog?",
            consequence="nothing recorded; exit 0",
        )
        return 0
    log = log.bind(job_id=ctx.job_id, node=ctx.node, restart=ctx.restart)
    try:
        return _run(
            ctx,
            environ,
            log,
            sysfs_root=sysfs_root,
            proc_root=proc_root,
            nvml_loader=nvml_loader,
            clock=clock,
        )
    except Exception as exc:
        log.exception(
            "prolog.unexpected_error",
            reason=f"{type(exc).__name__}: {exc}",
            consequence="exit 0; please report this",
        )
        return 0


if __name__ == "__main__":
    sys.exit(main())
