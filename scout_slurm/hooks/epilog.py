"""`scout-epilog`, the node Epilog (root, every node): node-local evidence into the job's
`nodes/<node>/epilog.json`. Exits 0 (a failing Epilog drains the node) unless the site asks to
drain on local hardware errors. On sites whose controller cannot read the evidence, the batch
host's Epilog also runs the controller's job-end handling."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from scout_slurm.config import load_config
from scout_slurm.errors import ScoutError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import write_record
from scout_slurm.jobenv import hook_context
from scout_slurm.log import configure, get_logger
from scout_slurm.slurm.hostlist import expand_hostlist

log = get_logger("scout.epilog")


def _job_started(folder: JobFolder, node: str) -> float:
    """When the Prolog wrote this node's map (root-owned, so trusted); 0 if absent."""
    try:
        st = os.lstat(folder.node_dir(node) / "hardware-map.json")
        return st.st_mtime
    except OSError:
        return 0.0


def run(environ) -> int:
    ctx = hook_context(environ)
    cfg = load_config(environ)
    if not ctx.node:
        raise ScoutError("scout-epilog runs on a node: SLURMD_NODENAME is not set")
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    from scout_slurm.hooks.nodeevidence import collect_node_evidence
    evidence = collect_node_evidence(ctx.node, ctx.job_id, job_started_wall=_job_started(folder, ctx.node))
    node_dir = folder.node_dir(ctx.node)
    node_dir.mkdir(parents=True, exist_ok=True)
    if node_dir.is_symlink():
        raise ScoutError(f"{node_dir} is a symbolic link: refusing to write node evidence through it")
    write_record(node_dir / "epilog.json", evidence)
    log.info("epilog.node_evidence", job=ctx.job_id, node=ctx.node, kernel_lines=len(evidence.kernel_lines),
             hardware_error=evidence.hardware_error, problems=list(evidence.problems))
    if cfg.epilog.localise_on == "batch-host":
        nodes = expand_hostlist(ctx.job_nodelist)
        if nodes and nodes[0] == ctx.node:
            from scout_slurm.hooks.controller import handle_job_end
            handle_job_end(ctx, cfg)
    if evidence.hardware_error and cfg.epilog.drain_on_local_hardware_error:
        log.error("epilog.hardware_error_drain", node=ctx.node)
        return 1
    return 0


def main() -> int:
    configure()
    try:
        return run(os.environ)
    except ScoutError as exc:
        log.error("epilog.failed", error=str(exc))
    except Exception as exc:  # noqa: BLE001 - a failing Epilog would drain this node
        log.exception("epilog.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
