"""The controller Epilog (EpilogSlurmctld, once per job, as SlurmUser): the entry point that
builds the job's `Incident` and runs its stages (incident/run.py), then completes the cluster's
incidents a killed hook left unfinished. The batch host's node Epilog does the same on sites whose
controller cannot read the evidence (hooks/epilog.py). Exit status is always 0: Slurm only logs a
failing EpilogSlurmctld, and scout's own failure must never be mistaken for the job's.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping

from scout_slurm.config import load_hook_config
from scout_slurm.errors import ScoutError
from scout_slurm.incident import run
from scout_slurm.incident.incident import Incident
from scout_slurm.jobenv import hook_context
from scout_slurm.log import configure, configure_hook, get_logger

log = get_logger("scout.controller")
# How long the first look at the evidence root may take before it is taken as hung.
PROBE_S = 5.0


def main(*, environ: Mapping[str, str] | None = None) -> int:
    """Always 0. The incident's stages run in a bounded child (hooks/bounded.py) cut off at the
    budget less a margin, so a hung evidence root costs the budget, never Slurm's kill. The
    keyword argument is a test seam; Slurm runs it with none."""
    from scout_slurm.entry import answered
    from scout_slurm.hooks.bounded import TIMED_OUT, margin_s, run_bounded

    if environ is None and answered("scout-epilog-slurmctld"):
        return 0
    started = time.monotonic()  # the budget includes reading the config (a FIFO or a hung mount)
    environ = os.environ if environ is None else environ
    configure()
    try:
        ctx = hook_context(environ)
        hook_cfg = load_hook_config(environ)
        cfg = hook_cfg.config
        configure_hook("controller", cfg.evidence.hook_log_dir)
        if hook_cfg.refused:
            log.error(
                "controller.config_refused",
                reason=hook_cfg.refused,
                consequence="safe defaults (observe only, the default evidence root)",
            )
        if cfg.epilog.localise_on != "controller":
            return 0
        budget = cfg.epilog.time_budget_s
        margin = margin_s(budget)
        root = cfg.evidence.root
        # A first look that reaches the file server (a listing, not cached attributes): on a hung
        # root the stages are not begun at all, and the log says why at once.
        probe = run_bounded(
            lambda report: len(os.listdir(root)),
            min(PROBE_S, budget / 4),
            name="evidence root probe",
            log=log,
            patience_s=budget / 4,  # a loaded node's slow look is not a hung root (D state is)
        )
        if probe.status == TIMED_OUT:
            log.error(
                "controller.evidence_root_hung",
                root=root,
                job=ctx.job_id,
                waited_s=probe.seconds,
                consequence="this job's evidence is not read and nothing is applied; its nodes' "
                "Epilogs exit 0; pending incidents wait for a later run",
            )
            return 0

        def work(report) -> None:
            # the stages aim at the parent's cut-off: their budget ends `margin` earlier
            incident = Incident.begin(ctx, cfg, started=started - margin)
            try:
                run.handle(incident)
            finally:
                run.complete_pending(incident)

        out = run_bounded(
            work, started + budget - margin - time.monotonic(), name="controller", log=log
        )
        if not out.done:
            log.error(
                "controller.timed_out" if out.status == TIMED_OUT else "controller.failed",
                why="the evidence root or Slurm stopped answering"
                if out.status == TIMED_OUT
                else "the stages' process ended abnormally",
                root=cfg.evidence.root,
                job=ctx.job_id,
                error=out.error,
                abandoned=out.abandoned,
                seconds=round(time.monotonic() - started, 3),
                budget_s=budget,
                consequence="this run's incident is left to the next controller run (its "
                "pending marker) if one was begun; nothing applied past this point",
            )
    except ScoutError as exc:
        log.error("controller.failed", error=str(exc))
    except Exception as exc:
        log.exception("controller.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
