"""The local lab: a real Slurm cluster (slurmctld, several slurmd, private munge) on this machine.

Only the name of its default folder lives here: `scout` imports it for its options' help, and the
cluster itself (`lab.cluster`) is imported only by the commands that start or read a lab."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_PORT_BASE = 16800  # slurmctld listens here, node i on port base + i


def default_state_dir() -> Path:
    """$SCOUT_LAB_DIR, else /tmp/scout-lab."""
    return Path(os.environ.get("SCOUT_LAB_DIR", "/tmp/scout-lab"))
