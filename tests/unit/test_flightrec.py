"""torch's Flight Recorder dumps read for each rank's place in its collectives (pure), from real
dumps (tests/fixtures/flight_recorder: torch 2.13 CPU, gloo) and from what a job could plant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.flightrec import behind_in_ledger, read_dump, summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "flight_recorder"


def _real(rank: int) -> bytes:
    return (FIXTURES / f"gloo-2ranks-rank-{rank}.json").read_bytes()


def _pickled(rank: int) -> bytes:
    return (FIXTURES / f"gloo-2ranks-rank-{rank}.pickle").read_bytes()


def test_torchs_own_pickle_dump_says_the_same_and_where_the_job_called_the_collective():
    a, b = read_dump(_pickled(0), 0), read_dump(_pickled(1), 1)
    assert [(p.group, p.last_enqueued, p.last_completed, p.op, p.sizes) for p in a] == [
        ("0", 6, 5, "gloo:all_reduce", "Float[4]")
    ]
    assert not b[0].inside and b[0].last_enqueued == 5
    # the innermost frame of the job's own code (torch's all_reduce and its logger wrapper are
    # skipped)
    assert a[0].site == "frgen/gen.py:14 in train_step"
    assert a[0].describe() == (
        "rank 0: inside gloo:all_reduce #6 (completed up to #5); input Float[4], called at "
        "frgen/gen.py:14 in train_step"
    )
    behind, why = behind_in_ledger({0: a, 1: b, 2: read_dump(_pickled(0), 2)}, 3)
    assert behind == (1,) and why[0].endswith("called at frgen/gen.py:14 in train_step"), why


class _Boom:
    def __reduce__(self):
        return (print, ("a job's pickle ran this",))


@pytest.mark.parametrize(
    "obj",
    [
        _Boom(),  # a global and a reduce: what running code takes
        {"pg_status": {"0": {"last_enqueued_collective": 1}}, "entries": [Path("/etc")]},
        {"pg_status": {"0": {"last_enqueued_collective": 1}}, "entries": [{1, 2}]},
    ],
)
def test_a_pickle_naming_any_class_or_function_is_refused_whole(obj, capsys):
    import pickle

    assert read_dump(pickle.dumps(obj, protocol=2), 0) == ()
    assert "ran this" not in capsys.readouterr().out


@pytest.mark.parametrize("cut", [1, 2, 10, 200, 1000])
def test_a_truncated_pickle_is_not_a_dump(cut):
    assert read_dump(_pickled(0)[:cut], 0) == ()


def test_the_rank_blocked_inside_a_collective_and_the_one_that_never_entered_it():
    a, b = read_dump(_real(0), 0), read_dump(_real(1), 1)
    assert [(p.group, p.last_enqueued, p.last_completed, p.op) for p in a] == [
        ("0", 6, 5, "gloo:all_reduce")
    ]
    assert a[0].inside and not b[0].inside
    assert summary({0: a, 1: b}, 3) == [
        "rank 0: inside gloo:all_reduce #6 (completed up to #5); input Float[4]",
        "rank 1: outside any collective, after gloo:all_reduce #5",
        "no Flight Recorder dump from ranks 2",
    ]


@pytest.mark.parametrize(
    "data",
    [b"", b"\xff\xfe", b"[]", b'{"pg_status": 3}', b"{" * 100_000, b'{"pg_status": {"0": 7}}'],
)
def test_what_is_not_a_dump_says_nothing(data):
    assert read_dump(data, 0) == ()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=8), c),
        max_leaves=20,
    )
)
def test_any_json_a_job_plants_is_read_or_refused_never_raised(obj):
    dump = {"pg_status": {"0": obj}, "entries": [obj]}
    found = read_dump(json.dumps(dump).encode(), 3)
    assert all(p.rank == 3 for p in found)


def _positions(ranks: dict[int, int]) -> dict:
    """rank -> the positions of the recorded dump of `ranks[rank]` (0: inside #6, 1: after #5)."""
    return {r: read_dump(_real(src), r) for r, src in ranks.items()}


def test_the_rank_that_never_enqueued_what_the_others_wait_in_is_behind():
    behind, why = behind_in_ledger(_positions({0: 0, 1: 1, 2: 0}), 3)
    assert behind == (1,)
    assert why[0] == (
        "torch's Flight Recorder: 2 of 3 ranks wait inside gloo:all_reduce #6 of the default "
        "group; input Float[4]"
    ), why
    assert (
        why[1] == "rank 1: outside any collective, after gloo:all_reduce #5: it never enqueued #6"
    )
    four = _positions({0: 0, 1: 0, 2: 1, 3: 0})
    assert behind_in_ledger(four, 4)[0] == (2,)


@pytest.mark.parametrize(
    "ranks, world",
    [
        ({0: 0, 1: 1}, 2),  # one of two behind: no majority (as the progress rule)
        ({0: 0, 1: 0}, 2),  # every rank waits at the same place: nobody behind
        ({0: 1, 1: 1}, 2),  # every rank outside, equal
        ({0: 0, 1: 1}, 3),  # rank 2 left no dump: the ledger does not say
        ({0: 0, 1: 1, 2: 1}, 3),  # more than half behind
    ],
)
def test_the_ledger_names_nobody_when_it_does_not_say(ranks, world):
    assert behind_in_ledger(_positions(ranks), world) == ((), ())
