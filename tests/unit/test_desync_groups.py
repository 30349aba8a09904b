"""find_desync counts ranks with equal rings as one group: the same answers, word for word, as
the rank-by-rank count it replaced (kept here as the reference)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.records import CollectiveEntry
from scout_slurm.localise.stall import find_desync


def reference(rings):
    if len(rings) < 3:
        return (), ""
    by_seq = {}
    for rank, ring in rings.items():
        for e in ring:
            by_seq.setdefault(e.seq, {})[rank] = (e.op, e.nbytes)
    for seq in sorted(by_seq):
        ops = by_seq[seq]
        if len(ops) < len(rings):
            continue
        counts = Counter(ops.values())
        ((common, n),) = counts.most_common(1)
        if n == len(ops):
            continue
        if n * 2 > len(ops):
            minority = tuple(sorted(r for r, sig in ops.items() if sig != common))
            theirs = ", ".join(f"rank {r}: {ops[r][0]} of {ops[r][1]} B" for r in minority)
            return minority, (
                f"collective #{seq}: {n} of {len(ops)} ranks ran {common[0]} of {common[1]} B; "
                f"{theirs}"
            )
        return (), f"collective #{seq}: ranks disagree with no strict majority ({dict(counts)})"
    return (), ""


entry = st.builds(
    lambda seq, op, nbytes: CollectiveEntry(
        seq=seq, op=op, nbytes=nbytes, group_size=4, entered_ns=1, left_ns=2
    ),
    st.integers(0, 6),
    st.sampled_from(["all_reduce", "broadcast"]),
    st.sampled_from([4, 8]),
)
ring = st.lists(entry, max_size=6).map(tuple)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(ring, min_size=0, max_size=9), st.lists(st.integers(0, 8), max_size=9), st.randoms()
)
def test_same_answer_as_rank_by_rank(distinct, picks, rnd):
    # few distinct rings shared by many ranks, as in a real job, in a shuffled rank order
    pool = distinct or [()]
    ranks = list(range(len(picks) + 3))
    rnd.shuffle(ranks)
    rings = {r: pool[(picks[i] if i < len(picks) else i) % len(pool)] for i, r in enumerate(ranks)}
    assert find_desync(rings) == reference(rings)


def test_a_large_world_with_one_outlier():
    base = tuple(
        CollectiveEntry(seq=s, op="all_reduce", nbytes=8, group_size=9, entered_ns=1, left_ns=2)
        for s in range(10, 26)
    )
    odd = base[:-1] + (
        CollectiveEntry(seq=25, op="broadcast", nbytes=8, group_size=9, entered_ns=1, left_ns=2),
    )
    rings = {r: base for r in range(20_000)}
    rings[12_345] = odd
    assert (
        find_desync(rings)
        == reference(rings)
        == (
            (12_345,),
            "collective #25: 19999 of 20000 ranks ran all_reduce of 8 B; rank 12345: "
            "broadcast of 8 B",
        )
    )
