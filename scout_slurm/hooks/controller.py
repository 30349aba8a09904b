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

from scout_slurm.config import load_hook_config
from scout_slurm.errors import ScoutError
from scout_slurm.incident import run
from scout_slurm.incident.incident import Incident
from scout_slurm.jobenv import hook_context
from scout_slurm.log import configure, get_logger

log = get_logger("scout.controller")


def main() -> int:
    started = time.monotonic()  # the budget includes reading the config (a FIFO or a hung mount)
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
        incident = Incident.begin(ctx, cfg, started=started)
        try:
            run.handle(incident)
        finally:
            run.complete_pending(incident)
    except ScoutError as exc:
        log.error("controller.failed", error=str(exc))
    except Exception as exc:
        log.exception("controller.bug", error=repr(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
