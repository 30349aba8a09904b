"""Nodes' wall clocks differ by seconds. The first failing rank is named by progress order, never by
comparing timestamps written on different nodes; within one node, wall time breaks ties.

World of 4 on two nodes: n1 runs ranks 0 and 1, n2 runs ranks 2 and 3. The true culprit dies first
(in real time) at an earlier point of progress; the clock of one node is shifted by `skew` seconds,
so that its records' `at` and `published_at` can say the opposite of what happened.
"""

from __future__ import annotations

import dataclasses

import pytest

from scout_slurm.evidence.records import (
    ChildState,
    CollectiveEntry,
    ExitRecord,
    FindingKind,
    ProgressSnapshot,
    RankPlace,
    VerdictKind,
)
from scout_slurm.localise.stall import decide_stall
from scout_slurm.localise.verdict import JobEvidence, localise

T = 1_700_000_000.0  # real time of the culprit's death
NODE = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
SKEWS = (-30.0, -5.0, -1.5, 1.5, 5.0, 30.0)


def snap(
    rank: int,
    *,
    entered: int,
    completed: int,
    published_at: float,
    state=ChildState.RUNNING,
    idle_s: float = 0.0,
    mono_offset_ns: int = 0,
) -> ProgressSnapshot:
    # the ring's times are CLOCK_MONOTONIC of the rank's node: another base on every node
    recent = tuple(
        CollectiveEntry(
            seq=s,
            op="all_reduce",
            nbytes=4096,
            group_size=4,
            entered_ns=mono_offset_ns + s * 1_000_000,
            left_ns=mono_offset_ns + s * 1_000_000 + 500 if s <= completed else 0,
        )
        for s in range(max(1, entered - 3), entered + 1)
    )
    return ProgressSnapshot(
        rank=rank,
        node=NODE[rank],
        pid=100 + rank,
        published_at=published_at,
        child_state=state,
        coll_entered=entered,
        coll_completed=completed,
        in_collective=entered > completed,
        current_op="all_reduce" if entered > completed else "",
        opt_steps=completed // 2,
        pg_seq=completed,
        idle_s=idle_s,
        step_time_s=0.5,
        recent=recent,
        publish_seq=40 + rank,
    )


def place(rank: int) -> RankPlace:
    return RankPlace(
        job_id=7,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=4,
        node=NODE[rank],
        hostname=NODE[rank],
        task_pid=10 + rank,
        child_pid=100 + rank,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="",
        master_addr="n1",
        master_port=29500,
        started_at=T - 100,
    )


def died(
    rank: int,
    at: float,
    progress: ProgressSnapshot | None,
    *,
    cascade: bool = False,
    stderr: str = "RuntimeError: CUDA error: an illegal memory access was encountered",
) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node=NODE[rank],
        pid=100 + rank,
        exit_code=1,
        signal=0,
        core_dumped=False,
        at=at,
        killed_by_scout=False,
        last_progress=progress,
        stderr_tail=("RuntimeError: [../gloo/transport/tcp/pair.cc:598] Connection closed by peer",)
        if cascade
        else (stderr,),
    )


def evidence(exits: dict[int, ExitRecord]) -> JobEvidence:
    return JobEvidence(
        job_id=7,
        restart=0,
        world_size=4,
        places={r: place(r) for r in range(4)},
        exits=exits,
        job_exit_code=256,
    )


def clock(node: str, skewed_node: str, skew: float):
    """The wall clock of `node`: real time, shifted when it is the skewed one."""
    return lambda real: real + (skew if node == skewed_node else 0.0)


def crash_with_a_second_primary(
    skew: float, skewed_node: str, culprit: int, other: int
) -> JobEvidence:
    """`culprit` dies first, before entering collective 10; `other` (on the other node) then fails
    on
    its own, with an error that is no known cascade, while waiting inside collective 10; the
    remaining ranks report the peer's death."""
    exits = {}
    for r in range(4):
        wall = clock(NODE[r], skewed_node, skew)
        if r == culprit:
            s = snap(r, entered=9, completed=9, published_at=wall(T - 0.2))
            exits[r] = died(r, wall(T), s)
        elif r == other:
            s = snap(r, entered=10, completed=9, published_at=wall(T + 0.4))
            exits[r] = died(
                r, wall(T + 1.0), s, stderr="RuntimeError: unexpected error in the data loader"
            )
        else:
            s = snap(r, entered=10, completed=9, published_at=wall(T + 0.5))
            exits[r] = died(r, wall(T + 1.2), s, cascade=True)
    return evidence(exits)


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("culprit,other", [(1, 2), (2, 1), (0, 3), (3, 0)])
@pytest.mark.parametrize("which", ["culprit's node", "other node"])
def test_progress_order_names_the_culprit_whatever_the_clocks_say(skew, culprit, other, which):
    skewed_node = NODE[culprit] if which == "culprit's node" else NODE[other]
    ev = crash_with_a_second_primary(skew, skewed_node, culprit, other)
    verdict = localise(ev, now=T + 60)
    assert verdict.kind == VerdictKind.CRASH
    assert [(s.rank, s.node) for s in verdict.suspects] == [(culprit, NODE[culprit])], (
        verdict.reasoning
    )
    assert verdict.first_failure_at == ev.exits[culprit].at
    assert any(f"later in progress: ranks [{other}]" in line for line in verdict.reasoning), (
        verdict.reasoning
    )


def test_the_timestamps_alone_would_have_named_the_wrong_rank():
    """The case above is a real trap: with the culprit's clock 30 s ahead, its exit looks last."""
    ev = crash_with_a_second_primary(30.0, "n1", culprit=1, other=2)
    assert min(ev.exits, key=lambda r: ev.exits[r].at) != 1
    assert [s.rank for s in localise(ev, now=T + 60).suspects] == [1]


@pytest.mark.parametrize("skew", SKEWS)
def test_progress_read_from_the_snapshots_when_the_exit_has_none(skew):
    ev = crash_with_a_second_primary(skew, "n1", culprit=1, other=2)
    snapshots = {r: e.last_progress for r, e in ev.exits.items()}
    exits = {r: dataclasses.replace(e, last_progress=None) for r, e in ev.exits.items()}
    ev = dataclasses.replace(ev, exits=exits, snapshots=snapshots)
    assert [(s.rank, s.node) for s in localise(ev, now=T + 60).suspects] == [(1, "n1")]


@pytest.mark.parametrize("first", [0, 1])
@pytest.mark.parametrize("gap", [0.001, 0.5, 20.0])
def test_within_one_node_wall_time_breaks_a_tie_in_progress(first, gap):
    """Ranks 0 and 1 share n1's clock: both failed on their own at the same point of progress; the
    one whose exit is earlier on that clock is named."""
    second = 1 - first
    exits = {}
    for r in range(4):
        if r in (0, 1):
            s = snap(r, entered=9, completed=9, published_at=T - 0.2)
            exits[r] = died(r, T + (0.0 if r == first else gap), s)
        else:
            s = snap(r, entered=10, completed=9, published_at=T + 90)  # n2's clock 90 s ahead
            exits[r] = died(r, T + 91, s, cascade=True)
    verdict = localise(evidence(exits), now=T + 60)
    assert [(s.rank, s.node) for s in verdict.suspects] == [(first, "n1")]
    assert any(f"later in progress: ranks [{second}]" in line for line in verdict.reasoning)


@pytest.mark.parametrize("skew", SKEWS)
def test_across_nodes_a_tie_in_progress_is_not_broken_by_the_clocks(skew):
    """Ranks 1 (n1) and 2 (n2) failed at the same point of progress: their clocks cannot say which
    came first, so both are named, with less confidence."""
    exits = {}
    for r in range(4):
        wall = clock(NODE[r], "n2", skew)
        if r in (1, 2):
            exits[r] = died(
                r, wall(T + 0.01 * r), snap(r, entered=9, completed=9, published_at=wall(T))
            )
        else:
            exits[r] = died(
                r,
                wall(T + 1),
                snap(r, entered=10, completed=9, published_at=wall(T + 0.5)),
                cascade=True,
            )
    verdict = localise(evidence(exits), now=T + 60)
    assert sorted((s.rank, s.node) for s in verdict.suspects) == [(1, "n1"), (2, "n2")]
    assert verdict.confidence < 0.8  # below the default minimum to drain


# -------------------------------------------------------------------------------------------
# The watchdogs' stall rule
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("culprit", range(4))
@pytest.mark.parametrize("which", ["culprit's node", "other node"])
def test_decide_stall_names_the_rank_behind_whatever_the_clocks_say(skew, culprit, which):
    """The culprit hangs before collective 10; the others wait inside it. With the culprit's clock
    ahead, its snapshot looks the freshest; with it behind, the stalest: neither matters."""
    skewed = (
        NODE[culprit] if which == "culprit's node" else ({"n1": "n2", "n2": "n1"}[NODE[culprit]])
    )
    snapshots = {}
    for r in range(4):
        wall = clock(NODE[r], skewed, skew)
        offset = 10**12 if NODE[r] == "n2" else 0  # another boot, another monotonic base
        if r == culprit:
            snapshots[r] = snap(
                r,
                entered=9,
                completed=9,
                published_at=wall(T + 12),
                idle_s=12.0,
                mono_offset_ns=offset,
            )
        else:
            snapshots[r] = snap(
                r,
                entered=10,
                completed=9,
                published_at=wall(T + 11.5),
                idle_s=11.5,
                mono_offset_ns=offset,
            )
    call = decide_stall(snapshots, 4)
    assert call.culprits == (culprit,) and call.kind == FindingKind.HANG, call.reasoning


@pytest.mark.parametrize("skew", SKEWS)
def test_decide_stall_is_the_same_call_on_every_node(skew):
    """Every watchdog reads the same snapshots with its own clock; the call does not depend on it:
    re-stamping all snapshots by a node's offset changes nothing."""
    base = {
        r: snap(r, entered=9 if r == 3 else 10, completed=9, published_at=T + r) for r in range(4)
    }
    shifted = {
        r: dataclasses.replace(s, published_at=s.published_at + skew) for r, s in base.items()
    }
    assert decide_stall(base, 4) == decide_stall(shifted, 4)
    assert decide_stall(base, 4).culprits == (3,)


@pytest.mark.parametrize("skew", SKEWS)
def test_a_stopped_rank_is_named_whatever_its_clock(skew):
    """Everyone at the same point, one process SIGSTOPped: its node's clock is no evidence."""
    snapshots = {
        r: snap(
            r,
            entered=10,
            completed=9,
            published_at=T + (skew if NODE[r] == "n2" else 0.0),
            state=ChildState.STOPPED if r == 2 else ChildState.RUNNING,
        )
        for r in range(4)
    }
    call = decide_stall(snapshots, 4)
    assert call.culprits == (2,)
