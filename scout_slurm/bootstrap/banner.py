"""The one line (rank 0) saying what scout found in the job and what it checks: the framework, the
replica groups, what is voted, replayed and timed, and what is not. Said at the first optimizer
step, the first moment the models are known (they ran their first forward)."""

from __future__ import annotations

from typing import Any

from scout_slurm.bootstrap.frameworks import framework_seen, optimizer_not_voted, replica_layout


def model_banner(rt: Any) -> str:
    """Every rank computes the replica groups (the same on all, kept for the votes); rank 0's line
    ("" on the others). `rt`: the in-job runtime (bootstrap.runtime.Runtime)."""
    roots = rt.root_tracker.roots if rt.root_tracker is not None else []
    groups, how = replica_layout(roots, rt.world) if roots else ([tuple(range(rt.world))], "")
    c, r, t, a = rt.consensus, rt.replay, rt.timing, rt.atrest
    skipped = optimizer_not_voted(roots)
    if c is not None and c.groups is None and roots:
        c.groups, c.optimizer_skipped = groups, skipped
    if rt.rank != 0:
        return ""
    if c is None:
        voted = "state votes off" if rt.world >= 2 else "no state votes (one rank)"
    elif not roots:
        voted = "no state votes (no model to sign)"
    elif not any(len(g) >= 2 for g in groups):
        voted = "no state votes (no two ranks hold the same state)"
    else:
        voted = (
            f"voted every {c.every} steps: weights, "
            + ("" if skipped else "optimizer state, ")
            + "where NaN/Inf began"
            + (f" ({skipped})" if skipped else "")
        )
    compiled = r.compiled_reason() if r is not None and hasattr(r, "compiled_reason") else ""
    replayed = (
        "in-situ replay off"
        if r is None
        else "nothing replayed (no model seen)"
        if not roots
        else f"in-situ replay not run: {compiled}"
        if compiled
        else f"replayed every {r.every} steps (layers below)"
    )
    timed = (
        f"step timing voted every {t.rules.every} steps" if t is not None else "timing votes off"
    )
    rest = (
        "at-rest witness off"
        if a is None
        else "at-rest witness in its first window, then left to the state votes if they sign all "
        "the optimizer "
        f"holds ({min(len(g) for g in groups)}+ replicas)"
        if a.mode == "auto" and c is not None and rt.votes_cover_rest()
        else "each rank's own weights and optimizer state re-signed at rest across one step in "
        f"{a.every}"
    )
    return (
        f"scout: framework: {framework_seen(roots)}; replica groups {[list(g) for g in groups]}"
        + (f" ({how})" if how else " (no model seen: all ranks taken as replicas)")
        + f"; {voted}; {replayed}; {rest}; {timed}; stalls timed from this first optimizer step on "
        "(before it, the start-up limit)"
    )
