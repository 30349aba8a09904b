"""When a watchdog writes its rank's progress snapshot to the evidence folder (pure).

The in-job shared-memory record is the fast path; the evidence folder copy is only read by peer
watchdogs once a stall is suspected, and by the localiser at the end. So a rank that plainly
advances publishes every `steady_publish_interval_s` (a heartbeat), and a rank that is
*watchful* (idle for half its stall threshold, or its process not running) every
`publish_interval_s`. In a job-wide stall every live rank stops advancing together and turns
watchful at half the threshold, so by the time a watchdog suspects a stall (at the threshold)
its live peers have been publishing fast for half a threshold: detection latency is unchanged.
At 10k ranks and the defaults this is 1,000 instead of 10,000 snapshot writes a second.

A peer that stays silent is one whose watchdog (or node) is gone. A watchful peer is silent
after `confirm_s` without a new publication, as before; a peer whose last word was a steady
heartbeat only after a whole steady interval more.
"""

from __future__ import annotations

from scout_slurm.evidence.records import ChildState, ProgressSnapshot


def is_watchful(*, idle_s: float, threshold_s: float, state: ChildState) -> bool:
    """Should this rank's progress be published at the fast rate?"""
    return state != ChildState.RUNNING or idle_s >= threshold_s / 2


def published_watchful(snapshot: ProgressSnapshot) -> bool:
    """Was this snapshot published at the fast rate (the same rule, read back from the record)?"""
    return is_watchful(
        idle_s=snapshot.idle_s, threshold_s=snapshot.threshold_s, state=snapshot.child_state
    )


def next_interval(any_watchful: bool, *, fast_s: float, steady_s: float) -> float:
    return fast_s if any_watchful else max(fast_s, steady_s)


def silent_after(
    last: ProgressSnapshot, *, confirm_s: float, fast_s: float, steady_s: float
) -> float:
    """Seconds without a new publication after which a peer whose last snapshot is `last` is
    taken for gone."""
    return confirm_s if published_watchful(last) else confirm_s + max(fast_s, steady_s)
