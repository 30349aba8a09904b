"""What scout's own work costs the training process, measured there (per rank) and kept in the
rank's evidence (ScoutCost: runs/N/ranks/cost-R.json), so that `scout show` can tell a job's
users what scout cost them. The clock is the calling thread's CPU time (a wall clock there would
count the time a thread waits for the GIL while another runs): around the optimizer hooks (votes,
replay, timing, checkpoint records; the gloo threads' share of scout's own collectives is not in
it), and around the collective wrappers' own lines with the collective itself left out. That clock
costs a few microseconds a read on some machines, so the wrappers, which run for every collective,
are timed on one call in SAMPLE_EVERY and their total scaled from those."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

COST_EVERY = 100  # steps between rewrites of the record (one small file write)
SAMPLE_EVERY = 16  # wrapper calls per timed one
clock = time.thread_time_ns


class Meter:
    def __init__(self) -> None:
        self.hooks_cpu_ns = 0
        self.wrapper_calls = 0
        self.sampled_ns = 0  # CPU of the timed wrapper calls
        self.samples = 0
        self.steps = 0
        self.first_step_ns = 0
        self.last_step_ns = 0
        # times scout's Python ran on a communication thread (gloo's), taking the GIL there: a
        # bucket's
        # record left as it completed. Over the whole run; none where DDP's own final callback
        # waited.
        self.comm_thread_calls = 0

    def sample(self) -> bool:
        """Count a wrapper call; true when this one is to be timed."""
        n = self.wrapper_calls
        self.wrapper_calls = n + 1
        if n % SAMPLE_EVERY:
            return False
        self.samples += 1
        return True

    @property
    def wrapper_ns(self) -> int:
        return self.sampled_ns * self.wrapper_calls // self.samples if self.samples else 0

    def stepped(self, now: int | None = None) -> None:
        """An optimizer step ended (at `now`, monotonic ns, when the caller read it). The window
        starts at the end of the first: the first step's one-off work (DDP's and scout's set-up) is
        not a step's cost; what follows counts."""
        now = time.monotonic_ns() if now is None else now
        if not self.first_step_ns:
            self.first_step_ns = now
            self.hooks_cpu_ns = self.wrapper_calls = self.sampled_ns = self.samples = 0
        else:
            self.steps += 1
        self.last_step_ns = now


COST = Meter()


def timed(fn: Callable) -> Callable:
    """`fn` (an optimizer hook of scout's) with its CPU added to the meter."""

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

    return ScoutCost(
        rank=rank,
        restart=restart,
        steps=COST.steps,
        hooks_cpu_ns=COST.hooks_cpu_ns,
        wrapper_ns=COST.wrapper_ns,
        wrapper_calls=COST.wrapper_calls,
        step_wall_ns=COST.last_step_ns - COST.first_step_ns,
        comm_thread_calls=COST.comm_thread_calls,
    )


def write(run_dir: Path | None, rank: int, restart: int) -> None:
    """The rank's record of what scout cost it so far (a write from the step hook is in the hook's
    time; the last one, at the end of training, is not in any step)."""
    if run_dir is None or rank < 0:
        return
    try:
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.layout import RunFolder

        write_record(RunFolder(run_dir).rank_cost_path(rank), record(rank, restart))
    except Exception as exc:
        sys.stderr.write(f"scout: the record of scout's own cost not written: {exc!r}\n")
