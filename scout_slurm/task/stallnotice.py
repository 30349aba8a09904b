"""The one `scout:` line a job's output gets when scout ends a step's ranks after a stall (pure).

Said once a job step, by the watchdog whose stall decision was the one recorded (the exclusive
create in task/watchdog.py), before any rank is signalled: without it the output shows only
`Exited with exit code 86/87` and the collective library's errors from the ranks scout ended.
It names the rank that stalled first (node, phase, where in its collectives, its step), says that
scout ended the others, the exit codes used (task/exitcodes.py), and where the evidence is.
"""

from __future__ import annotations

from collections.abc import Mapping

from scout_slurm.evidence.records import ChildState, ProgressSnapshot, StallDecision
from scout_slurm.task import exitcodes


def where(s: ProgressSnapshot) -> str:
    """Where a rank stood: before init, inside a collective, or after its last one."""
    if not s.entered_init:
        return "before init_process_group"
    if s.in_collective:
        return f"inside {s.current_op} (collective #{s.coll_entered})"
    if s.recent:
        last = s.recent[-1]
        return f"outside any collective, after {last.op} (collective #{last.seq})"
    return "outside any collective, before its first"


def _rank_detail(s: ProgressSnapshot) -> str:
    parts = [where(s)]
    if s.opt_steps > 0:
        parts.append(f"optimizer step {s.opt_steps}")
    if s.child_state not in (ChildState.RUNNING, ChildState.STARTING):
        parts.append(f"process {s.child_state.value}")
    parts.append(f"idle {s.idle_s:.1f} s")
    return ", ".join(parts)


def ending_line(
    decision: StallDecision,
    snapshots: Mapping[int, ProgressSnapshot],
    *,
    job_id: int,
    world_size: int,
) -> str:
    """The line, from the recorded decision and the snapshots it was decided on."""
    phase = "startup hang" if decision.phase == "startup" else f"{decision.kind.value} in training"
    evidence = f"see `scout show {job_id}` for the evidence (verdict, stacks, progress)"
    culprits = [r for r in decision.culprits]
    if not culprits:
        why = decision.reasoning[-1] if decision.reasoning else "no rank was behind"
        return (
            f"scout: job {job_id}: every rank stopped making progress ({phase}) and no rank "
            "could be named "
            f"({why}); scout ended all {world_size} ranks of this step (exit code "
            f"{exitcodes.STALL_PEER}); "
            f"{evidence}"
        )
    first = culprits[0]
    snap = snapshots.get(first)
    named = f"rank {first} on {snap.node}" if snap is not None else f"rank {first}"
    detail = f"{phase}: {_rank_detail(snap)}" if snap is not None else phase
    also = ""
    if len(culprits) > 1:
        also = f" (with rank(s) {', '.join(map(str, culprits[1:]))})"
    others = max(0, world_size - len(culprits))
    ended = (
        (
            f"scout ended it (exit code {exitcodes.STALL_CULPRIT}) and the step's other "
            f"{others} rank(s) "
            f"(exit code {exitcodes.STALL_PEER})"
        )
        if len(culprits) == 1
        else (
            f"scout ended them (exit code {exitcodes.STALL_CULPRIT}) and the step's other "
            f"{others} rank(s) "
            f"(exit code {exitcodes.STALL_PEER})"
        )
    )
    return f"scout: job {job_id}: {named} stalled first{also} ({detail}); {ended}; {evidence}"
