"""Who is behind when a synchronous job stops advancing (pure).

Every watchdog runs the same rule over the same published snapshots, so they agree without a
working collective. Progress order decides; wall clocks are never compared across nodes.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from scout_slurm.evidence.records import ChildState, CollectiveEntry, FindingKind, ProgressSnapshot


@dataclass(frozen=True)
class StallCall:
    culprits: tuple[int, ...]
    kind: FindingKind  # HANG (behind), DESYNC (collective sequence differs); empty culprits: nobody
    reasoning: tuple[str, ...]


def position(s: ProgressSnapshot) -> int:
    """Monotone progress: entering a collective and leaving it each count one."""
    return s.coll_entered + s.coll_completed


_SEQ_OP_BYTES = operator.attrgetter("seq", "op", "nbytes")  # (seq, op, nbytes) of an entry, in C


def find_desync(rings: Mapping[int, tuple[CollectiveEntry, ...]]) -> tuple[tuple[int, ...], str]:
    """The first collective sequence number at which a strict majority of ranks agree on
    (op, bytes) and a minority differ; returns (minority ranks, explanation)."""
    if len(rings) < 3:
        return (), ""
    # Ranks whose rings hold the same (seq, op, bytes) vote alike at every seq: they are counted
    # as one group (a synchronous job has a handful of distinct rings, whatever its size; at 100k
    # ranks this is 100k small tuples instead of 1.6M dictionary entries).
    groups: dict[tuple, list[int]] = {}
    for rank, ring in rings.items():
        groups.setdefault(tuple(map(_SEQ_OP_BYTES, ring)), []).append(rank)
    by_seq: dict[int, list[tuple[tuple[str, int], list[int]]]] = {}
    for key, ranks in groups.items():
        sigs: dict[int, tuple[str, int]] = {}
        for seq, op, nbytes in key:
            sigs[seq] = (op, nbytes)  # a seq twice in one ring: the later entry counts
        for seq, sig in sigs.items():
            by_seq.setdefault(seq, []).append((sig, ranks))
    total = len(rings)
    for seq in sorted(by_seq):
        votes = by_seq[seq]
        if sum(len(ranks) for _, ranks in votes) < total:
            continue
        counts: Counter = Counter()
        for (
            sig,
            ranks,
        ) in votes:  # groups in order of their first rank: Counter's order is the ranks'
            counts[sig] += len(ranks)
        ((common, n),) = counts.most_common(1)
        if n == total:
            continue
        if n * 2 > total:
            minority = tuple(sorted(r for sig, ranks in votes if sig != common for r in ranks))
            ops = {r: sig for sig, ranks in votes if sig != common for r in ranks}
            theirs = ", ".join(f"rank {r}: {ops[r][0]} of {ops[r][1]} B" for r in minority)
            return minority, (
                f"collective #{seq}: {n} of {total} ranks ran {common[0]} of {common[1]} B; "
                f"{theirs}"
            )
        return (), f"collective #{seq}: ranks disagree with no strict majority ({dict(counts)})"
    return (), ""


def _direct(
    ranks: tuple[int, ...], present: Mapping[int, ProgressSnapshot], world_size: int
) -> bool:
    """Direct process evidence (exited, stopped, in disk sleep) names ranks without a majority of
    progress: when they are at most half of the job and some other rank does not show it."""
    return bool(ranks) and len(ranks) * 2 <= world_size and len(ranks) < len(present)


def decide_stall(
    snapshots: Mapping[int, ProgressSnapshot | None],
    world_size: int,
    silent: frozenset[int] = frozenset(),
) -> StallCall:
    """Name the ranks that stopped first.

    `snapshots` holds the latest snapshot of each rank (None: never published); `silent` are
    ranks whose watchdog stopped publishing (node or shim gone).
    """
    missing = tuple(r for r in range(world_size) if snapshots.get(r) is None)
    gone = tuple(sorted(set(missing) | set(silent)))
    present = {r: s for r, s in snapshots.items() if s is not None and r not in silent}
    if gone and len(gone) * 2 < world_size:
        return StallCall(
            gone,
            FindingKind.HANG,
            (f"rank(s) {', '.join(map(str, gone))} stopped reporting while the others waited",),
        )
    if not present:
        return StallCall((), FindingKind.HANG, ("no rank published progress",))
    exited = tuple(sorted(r for r, s in present.items() if s.child_state == ChildState.EXITED))
    if _direct(exited, present, world_size):
        return StallCall(
            exited,
            FindingKind.HANG,
            (
                f"rank(s) {', '.join(map(str, exited))} exited while the others waited in a "
                "collective",
            ),
        )
    desync, why = find_desync({r: s.recent for r, s in present.items()})
    if desync:
        return StallCall(desync, FindingKind.DESYNC, (why,))
    # a rank that never entered init_process_group is behind every rank that did: those wait for
    # it at the rendezvous (task/stallclock.py); past init, progress alone orders the ranks
    positions = {r: (s.entered_init, position(s)) for r, s in present.items()}
    lowest = min(positions.values())
    behind = tuple(sorted(r for r, p in positions.items() if p == lowest))
    reasons = []
    for r in behind:
        s = present[r]
        where = (
            (f"inside {s.current_op}" if s.in_collective else "outside any collective")
            if s.entered_init
            else "before init_process_group"
        )
        reasons.append(
            f"rank {r} on {s.node}: {s.coll_completed} collectives done, {where}, "
            f"process {s.child_state.value}, idle {s.idle_s:.1f} s"
        )
    frozen = tuple(
        sorted(
            r
            for r, s in present.items()
            if s.child_state in (ChildState.STOPPED, ChildState.DISK_SLEEP)
        )
    )
    if (len(behind) * 2 >= world_size or len(behind) == len(positions)) and _direct(
        frozen, present, world_size
    ):
        # no strict majority is ahead, but the process itself says it cannot move: stopped
        # (SIGSTOP) or in uninterruptible sleep (with two ranks, one behind is never a majority)
        return StallCall(
            frozen,
            FindingKind.HANG,
            tuple(
                f"rank {r} on {present[r].node}: process {present[r].child_state.value} while "
                "the others wait, "
                + (
                    f"inside {present[r].current_op}"
                    if present[r].in_collective
                    else "outside any collective"
                )
                for r in frozen
            ),
        )
    if len(behind) == len(positions):
        return StallCall(
            (),
            FindingKind.HANG,
            (
                "every rank stopped at the same point "
                f"({present[behind[0]].coll_completed} collectives done): no rank is behind",
            ),
        )
    if len(behind) * 2 >= world_size:
        return StallCall(
            (),
            FindingKind.HANG,
            (f"{len(behind)} of {world_size} ranks are behind: no strict majority ahead", *reasons),
        )
    others = len(positions) - len(behind)
    if not lowest[0]:
        return StallCall(
            behind,
            FindingKind.HANG,
            (
                *reasons,
                f"the other {others} rank(s) entered init_process_group and waited there "
                "(this rank had not entered it)",
            ),
        )
    return StallCall(
        behind,
        FindingKind.HANG,
        (
            *reasons,
            f"the other {others} rank(s) reached progress {max(positions.values())[1]} "
            f"(this rank {lowest[1]})",
        ),
    )
