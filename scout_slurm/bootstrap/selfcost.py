"""What scout's own work costs the training process, measured there (per rank) and kept in the
rank's evidence (ScoutCost: runs/N/ranks/cost-R.json), so that `scout show` can tell a job's
users what scout cost them. Two clocks: process CPU around the optimizer hooks (votes, replay,
timing, checkpoint records: gloo's threads on scout's own collectives count, nothing of the job's
runs then), and the wall time of the collective wrappers' own lines (never blocking: wall is
CPU there) with the collective itself left out. Each measure costs about a microsecond."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any, Callable

COST_EVERY = 100  # steps between rewrites of the record (one small file write)


class Meter:
    def __init__(self) -> None:
        self.hooks_cpu_ns = 0
        self.wrapper_ns = 0
        self.wrapper_calls = 0
        self.steps = 0
        self.first_step_ns = 0
        self.last_step_ns = 0

    def stepped(self) -> None:
        now = time.monotonic_ns()
        if not self.steps:
            self.first_step_ns = now
        self.last_step_ns = now
        self.steps += 1


COST = Meter()


def timed(fn: Callable) -> Callable:
    """`fn` (an optimizer hook of scout's) with its process CPU added to the meter."""
    clock = time.process_time_ns

    @functools.wraps(fn)
    def metered(*args, **kwargs):
        t0 = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            COST.hooks_cpu_ns += clock() - t0
    return metered


def record(rank: int, restart: int) -> Any:
    from scout_slurm.evidence.records import ScoutCost
    return ScoutCost(rank=rank, restart=restart, steps=COST.steps, hooks_cpu_ns=COST.hooks_cpu_ns,
                     wrapper_ns=COST.wrapper_ns, wrapper_calls=COST.wrapper_calls,
                     step_wall_ns=COST.last_step_ns - COST.first_step_ns)


def write(run_dir: Path | None, rank: int, restart: int) -> None:
    """The rank's record of what scout cost it so far (a write from the step hook is in the hook's
    time; the last one, at the end of training, is not in any step)."""
    if run_dir is None or rank < 0:
        return
    try:
        from scout_slurm.evidence.store import write_record
        write_record(run_dir / "ranks" / f"cost-{rank}.json", record(rank, restart))
    except Exception as exc:  # noqa: BLE001 - evidence of scout's cost is never a reason to fail the job
        sys.stderr.write(f"scout: the record of scout's own cost not written: {exc!r}\n")
