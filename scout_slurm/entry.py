"""`--version` and `--help` for the entry points that take no options of their own (scout-task
reads its command line as the training command; the hooks take none): answered only when the
whole argument list is that one flag, so a training command is never taken for one."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from scout_slurm import __version__

HELP = {
    "scout-task": (
        "usage: scout-task -- COMMAND [ARGS...]\n\n"
        "The per-task shim scout-srun starts in each Slurm task (you do not run it yourself):\n"
        "sets the torch environment, records the rank's place, runs COMMAND with scout's\n"
        "bootstrap in its Python and watches it from outside; exits with COMMAND's status.\n\n"
        "Example (what scout-srun runs): srun -N2 --ntasks-per-node=2 scout-task -- python "
        "train.py\n"
        "Documentation: docs/USERS.md"
    ),
    "scout-prolog": (
        "usage: scout-prolog   (slurm.conf: Prolog=, through the wrapper `scout site install` "
        "lays out)\n\n"
        "Slurm's Prolog, as root on every allocated node: records the node's hardware map\n"
        "(GPUs by UUID, NICs) and prepares the job's evidence folder. Reads SLURM_JOB_ID and the\n"
        "site config (SCOUT_CONFIG); exits 0 on its own errors.\n\n"
        "Example (as Slurm runs it): SLURM_JOB_ID=42 SCOUT_CONFIG=/etc/scout/scout.toml "
        "scout-prolog\n"
        "Documentation: docs/SITE-ADMIN.md"
    ),
    "scout-epilog": (
        "usage: scout-epilog   (slurm.conf: Epilog=, through the wrapper `scout site install` "
        "lays out)\n\n"
        "Slurm's Epilog, as root on every node of the job: gathers the node's evidence (kernel\n"
        "log, GPU errors) into the job's folder and, where the controller cannot see the\n"
        "evidence, localises on the batch host. Exits 0 on its own errors.\n\n"
        "Example (as Slurm runs it): SLURM_JOB_ID=42 SCOUT_CONFIG=/etc/scout/scout.toml "
        "scout-epilog\n"
        "Documentation: docs/SITE-ADMIN.md"
    ),
    "scout-epilog-slurmctld": (
        "usage: scout-epilog-slurmctld   (slurm.conf: EpilogSlurmctld=, through the wrapper "
        "`scout site install` lays out)\n\n"
        "Slurm's EpilogSlurmctld, as SlurmUser once per job: for a failed job, runs the\n"
        "localiser, saves the incident bundle, drains the suspect nodes and requeues the job\n"
        "without them, from the newest eligible checkpoint. Always exits 0.\n\n"
        "Example (as Slurm runs it): SLURM_JOB_ID=42 SLURM_CONF=/etc/slurm/slurm.conf "
        "scout-epilog-slurmctld\n"
        "Documentation: docs/SITE-ADMIN.md, docs/OPERATORS.md"
    ),
}


def answered(name: str, argv: Sequence[str] | None = None) -> bool:
    """Print the version or the help of `name` when the arguments are exactly `--version` or
    `--help`/`-h`; True when it did (the caller exits 0)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        print(f"{name} (scout-slurm) {__version__}")
        return True
    if args in (["--help"], ["-h"]):
        print(HELP[name])
        return True
    return False
