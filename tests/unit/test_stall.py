"""The watchdogs' shared stall rule: who is behind, who desynced, and when nobody can be named."""

from __future__ import annotations

from scout_slurm.evidence.records import ChildState, CollectiveEntry, FindingKind, ProgressSnapshot
from scout_slurm.localise.stall import decide_stall, find_desync, position


def entry(seq: int, op: str = "all_reduce", nbytes: int = 4096) -> CollectiveEntry:
    return CollectiveEntry(
        seq=seq, op=op, nbytes=nbytes, group_size=4, entered_ns=seq * 100, left_ns=seq * 100 + 50
    )


def ring(n: int, **different: tuple[str, int]) -> tuple[CollectiveEntry, ...]:
    """Collectives 1..n, all all_reduce of 4096 B except those named s<seq>=(op, nbytes)."""
    out = []
    for seq in range(1, n + 1):
        op, nbytes = different.get(f"s{seq}", ("all_reduce", 4096))
        out.append(entry(seq, op, nbytes))
    return tuple(out)


def snap(
    rank: int,
    entered: int = 10,
    completed: int = 9,
    *,
    state: ChildState = ChildState.RUNNING,
    in_collective: bool = True,
    recent: tuple[CollectiveEntry, ...] = (),
    node: str = "",
) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=node or f"node{rank // 2 + 1}",
        pid=1000 + rank,
        published_at=100.0,
        child_state=state,
        coll_entered=entered,
        coll_completed=completed,
        in_collective=in_collective,
        current_op="all_reduce" if in_collective else "none",
        opt_steps=completed // 3,
        pg_seq=completed,
        idle_s=75.0,
        step_time_s=0.5,
        recent=recent,
    )


# --- position -----------------------------------------------------------------------------


def test_position_counts_entering_and_leaving():
    assert position(snap(0, entered=0, completed=0)) == 0
    assert position(snap(0, entered=5, completed=4)) == 9
    assert position(snap(0, entered=5, completed=5)) == 10


def test_position_inside_a_collective_is_behind_having_left_it():
    inside = snap(0, entered=7, completed=6, in_collective=True)
    left = snap(1, entered=7, completed=7, in_collective=False)
    assert position(inside) < position(left)


# --- find_desync --------------------------------------------------------------------------


def test_desync_needs_three_ranks():
    assert find_desync({}) == ((), "")
    assert find_desync({0: ring(3), 1: ring(3, s2=("broadcast", 8))}) == ((), "")


def test_agreeing_rings_have_no_desync():
    assert find_desync({r: ring(5) for r in range(4)}) == ((), "")


def test_minority_op_differs_is_named():
    rings = {r: ring(6) for r in range(4)}
    rings[2] = ring(6, s4=("broadcast", 4096))
    ranks, why = find_desync(rings)
    assert ranks == (2,)
    assert "collective #4" in why and "3 of 4" in why and "rank 2: broadcast of 4096 B" in why


def test_minority_size_differs_is_named():
    rings = {r: ring(3) for r in range(5)}
    rings[1] = ring(3, s2=("all_reduce", 8192))
    rings[4] = ring(3, s2=("all_reduce", 8192))
    ranks, why = find_desync(rings)
    assert ranks == (1, 4)
    assert "3 of 5" in why and "rank 1: all_reduce of 8192 B" in why


def test_first_disagreeing_sequence_number_decides():
    rings = {r: ring(6) for r in range(4)}
    rings[3] = ring(6, s2=("barrier", 0))
    rings[0] = ring(6, s5=("broadcast", 1))
    ranks, why = find_desync(rings)
    assert ranks == (3,)
    assert "collective #2" in why


def test_sequence_not_seen_by_every_rank_is_skipped():
    # ring buffers overlap only from seq 3: seq 1-2 of rank 0 alone cannot be compared
    rings = {
        0: ring(6, s1=("broadcast", 1), s2=("broadcast", 1)),
        1: ring(6)[2:],
        2: ring(6)[2:],
        3: ring(6)[2:],
    }
    assert find_desync(rings) == ((), "")


def test_no_strict_majority_names_nobody_but_explains():
    rings = {
        0: ring(2),
        1: ring(2),
        2: ring(2, s2=("broadcast", 8)),
        3: ring(2, s2=("broadcast", 8)),
    }
    ranks, why = find_desync(rings)
    assert ranks == ()
    assert "no strict majority" in why and "#2" in why


def test_rank_that_skipped_a_collective_is_the_desync():
    # rank 1 skipped all_reduce #3: from there its sequence is shifted against everyone else's
    normal = (entry(1), entry(2), entry(3), entry(4, "broadcast", 64))
    skipped = (entry(1), entry(2), entry(3, "broadcast", 64))
    ranks, _ = find_desync({0: normal, 1: skipped, 2: normal, 3: normal})
    assert ranks == (1,)


# --- decide_stall -------------------------------------------------------------------------


def test_one_rank_behind_is_the_culprit():
    snaps = {r: snap(r, 12, 11) for r in range(4)}
    snaps[2] = snap(2, 10, 9)
    call = decide_stall(snaps, 4)
    assert call.culprits == (2,)
    assert call.kind == FindingKind.HANG
    text = " ".join(call.reasoning)
    assert "rank 2 on node2" in text and "9 collectives done" in text and "(this rank 19)" in text


def test_rank_outside_any_collective_behind_the_rest():
    snaps = {r: snap(r, 12, 11) for r in range(4)}
    snaps[0] = snap(0, 11, 11, in_collective=False, state=ChildState.STOPPED)
    call = decide_stall(snaps, 4)
    assert call.culprits == (0,)
    assert "outside any collective" in call.reasoning[0] and "process stopped" in call.reasoning[0]


def test_ranks_that_never_published_are_the_culprits_when_a_minority():
    snaps = {0: snap(0), 1: None, 2: snap(2), 3: snap(3)}
    call = decide_stall(snaps, 4)
    assert call.culprits == (1,)
    assert call.kind == FindingKind.HANG
    assert "stopped reporting" in call.reasoning[0]


def test_rank_absent_from_the_mapping_counts_as_never_published():
    call = decide_stall({0: snap(0), 1: snap(1), 3: snap(3)}, 4)
    assert call.culprits == (2,)


def test_silent_watchdogs_are_the_culprits_when_a_minority():
    snaps = {r: snap(r) for r in range(8)}
    call = decide_stall(snaps, 8, silent=frozenset({5, 6}))
    assert call.culprits == (5, 6)


def test_half_gone_is_not_a_minority_and_the_rest_decides():
    snaps = {0: snap(0, 12, 11), 1: snap(1, 10, 9), 2: None, 3: None}
    call = decide_stall(snaps, 4)
    # 2 of 4 missing: not blamed; of the two present, neither is a strict minority of the world
    assert 2 not in call.culprits and 3 not in call.culprits


def test_nothing_published_names_nobody():
    call = decide_stall({r: None for r in range(4)}, 4)
    assert call.culprits == ()
    assert call.reasoning == ("no rank published progress",)


def test_exited_minority_is_named_before_positions():
    snaps = {r: snap(r, 10, 9) for r in range(4)}
    snaps[3] = snap(3, 20, 20, state=ChildState.EXITED, in_collective=False)
    call = decide_stall(snaps, 4)
    assert call.culprits == (3,)
    assert "exited" in call.reasoning[0]


def test_desync_is_named_before_positions():
    snaps = {r: snap(r, 6, 5, recent=ring(6)) for r in range(4)}
    snaps[1] = snap(1, 6, 6, in_collective=False, recent=ring(6, s5=("broadcast", 64)))
    snaps[0] = snap(0, 5, 4, recent=ring(5))  # behind by position, yet the desync at #5 decides
    call = decide_stall(snaps, 4)
    assert call.kind == FindingKind.DESYNC
    assert call.culprits == (1,)


def test_everyone_at_the_same_point_names_nobody():
    call = decide_stall({r: snap(r, 10, 9) for r in range(4)}, 4)
    assert call.culprits == ()
    assert call.kind == FindingKind.HANG
    assert "no rank is behind" in call.reasoning[0]


def test_half_behind_is_no_strict_majority_ahead():
    snaps = {0: snap(0, 10, 9), 1: snap(1, 10, 9), 2: snap(2, 12, 11), 3: snap(3, 12, 11)}
    call = decide_stall(snaps, 4)
    assert call.culprits == ()
    assert "2 of 4 ranks are behind" in call.reasoning[0]


def test_two_behind_of_eight_are_both_named():
    snaps = {r: snap(r, 30, 29) for r in range(8)}
    snaps[3] = snap(3, 28, 27)
    snaps[6] = snap(6, 28, 27)
    call = decide_stall(snaps, 8)
    assert call.culprits == (3, 6)


def test_every_watchdog_reaches_the_same_call_whatever_the_mapping_order():
    snaps = {r: snap(r, 12, 11) for r in range(6)}
    snaps[4] = snap(4, 9, 8)
    forward = decide_stall(snaps, 6)
    backward = decide_stall(dict(reversed(list(snaps.items()))), 6)
    assert forward == backward
    assert forward.culprits == (4,)
