"""Replica groups from meshes, group votes (two replicas: inconclusive), the replay rotation, and
recurring fault specs: pure code with plain inputs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scout_slurm.bootstrap.replicas import (
    coverage,
    pairs_disagreeing,
    replay_plan,
    replica_groups,
    shard_group,
    vote_group,
    vote_groups,
)
from scout_slurm.errors import ConfigError
from scout_slurm.inject.spec import parse_fault


@pytest.mark.parametrize(
    "mesh,dims,groups",
    [
        ([0, 1, 2, 3], [0], [(0, 1, 2, 3)]),  # DDP: everyone replicates
        ([0, 1, 2, 3], [], [(0,), (1,), (2,), (3,)]),  # pure FSDP: nobody holds another's shard
        ([[0, 1], [2, 3]], [0], [(0, 2), (1, 3)]),  # HSDP 2x2: same shard coordinate
        ([[0, 1, 2, 3], [4, 5, 6, 7]], [0], [(0, 4), (1, 5), (2, 6), (3, 7)]),
        (
            [[0, 1], [2, 3], [4, 5]],
            [0],
            [(0, 2, 4), (1, 3, 5)],
        ),  # 3 replicas: a strict majority exists
        ([[0, 1], [2, 3]], [0, 1], [(0, 1, 2, 3)]),
        ([[3, 1], [0, 2]], [0], [(0, 3), (1, 2)]),  # mesh order is not rank order
    ],
)
def test_replica_groups(mesh, dims, groups):
    assert replica_groups(mesh, dims) == groups


def test_replica_groups_refuses_a_dim_outside_the_mesh():
    with pytest.raises(ValueError, match=r"dimension\(s\) \[2\] outside a 2-D mesh"):
        replica_groups([[0, 1], [2, 3]], [2])


@pytest.mark.parametrize("rank,group", [(0, (0, 1)), (1, (0, 1)), (2, (2, 3)), (3, (2, 3))])
def test_shard_group_is_the_row_along_the_shard_dim(rank, group):
    assert shard_group([[0, 1], [2, 3]], 1, rank) == group


def test_shard_group_of_a_1d_mesh_is_everyone_in_mesh_order():
    assert shard_group([2, 0, 1, 3], 0, 1) == (2, 0, 1, 3)


@pytest.mark.parametrize(
    "values,outcome,outliers",
    [
        ([5, 5, 5, 5], "agree", ()),
        ([5, 5, 7, 5], "sdc", (2,)),
        ([7, 5, 5, 5], "sdc", (0,)),
        ([5, 7, 7, 5], "inconclusive", ()),
        ([1, 2, 3, 4], "inconclusive", ()),
    ],
)
def test_vote_group_of_four(values, outcome, outliers):
    v = vote_group("output", (0, 1, 2, 3), values)
    assert (v.outcome, v.outliers) == (outcome, outliers)


def test_two_replicas_that_differ_are_inconclusive_and_say_which_pair():
    v = vote_group("weights", (0, 2), [9, 0, 8, 0])
    assert v.outcome == "inconclusive" and v.outliers == ()
    assert (
        "ranks 0 and 2 disagree on weights" in v.explanation and "cannot say which" in v.explanation
    )


def test_votes_per_group_ignore_lone_ranks():
    # HSDP 2x2 with rank 2 corrupt: its pair (0, 2) cannot decide; (1, 3) agree
    votes = vote_groups("weights", [(0, 2), (1, 3)], [4, 6, 5, 6])
    assert [(v.group, v.outcome) for v in votes] == [((0, 2), "inconclusive"), ((1, 3), "agree")]
    assert vote_groups("weights", [(0,), (1,), (2,), (3,)], [1, 2, 3, 4]) == []
    assert pairs_disagreeing([4, 6, 5, 6], (0, 1, 2, 3)) == [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3)]


@given(st.lists(st.integers(0, 3), min_size=3, max_size=9), st.integers(0, 8))
def test_vote_group_names_a_strict_minority_only(values, _):
    group = tuple(range(len(values)))
    v = vote_group("x", group, values)
    if v.outcome == "sdc":
        assert 2 * len(v.outliers) < len(values)
        kept = {values[r] for r in group if r not in v.outliers}
        assert len(kept) == 1 and all(values[r] not in kept for r in v.outliers)
    elif v.outcome == "agree":
        assert len(set(values)) == 1


@pytest.mark.parametrize("layers,world", [(2, 4), (3, 4), (4, 2), (1, 4), (4, 4), (5, 3)])
def test_replay_rotation_covers_every_layer_from_every_source(layers, world):
    assert coverage(3, layers, world) == [
        (lay, src) for lay in range(layers) for src in range(world)
    ]


def test_replay_plan_steps():
    assert replay_plan(1, 2, 2, 4) is None and replay_plan(0, 2, 2, 4) is None
    assert replay_plan(4, 0, 2, 4) is None and replay_plan(4, 2, 0, 4) is None
    p = replay_plan(6, 2, 2, 4)
    assert (p.step, p.layer_index, p.source) == (6, 0, 1)
    assert [
        (q.layer_index, q.source) for q in (replay_plan(s, 2, 3, 4) for s in (2, 4, 6, 8, 10))
    ] == [(0, 0), (1, 1), (2, 2), (0, 1), (1, 2)]


@pytest.mark.parametrize(
    "text,fires",
    [
        ("bitflip,rank=1,step=3", [3]),
        ("scale,rank=1,step=3,every=2", [3, 5, 7, 9]),
        ("scale,rank=1,step=3,every=2,until=6", [3, 5]),
        ("noise,rank=1,step=3,until=5,target=activations", [3, 4, 5]),
        ("sign,rank=1,step=4,every=3,until=10,target=gradients", [4, 7, 10]),
    ],
)
def test_recurring_faults(text, fires):
    spec = parse_fault(text)
    assert [s for s in range(1, 11) if spec.applies(1, s, 0)] == fires
    assert not any(spec.applies(0, s, 0) for s in range(1, 11))


def test_compute_targets_and_their_keys():
    spec = parse_fault("noise,rank=2,step=4,every=1,target=gradients,layer=net.0,sigma=0.01")
    assert (spec.kind, spec.target, spec.layer, spec.sigma, spec.every, spec.is_compute) == (
        "noise",
        "gradients",
        "net.0",
        0.01,
        1,
        True,
    )
    assert not parse_fault("scale,target=weights").is_compute


@pytest.mark.parametrize(
    "text,reason",
    [
        ("sleep,target=activations", "takes a numerical kind"),
        ("scale,step=5,until=4", "until=4 is before step=5"),
        ("scale,every=-1", "every must be >= 0"),
        ("noise,sigma=-1", "sigma must be >= 0"),
        ("noise,target=logits", "target must be one of weights, optimizer, activations, gradients"),
    ],
)
def test_bad_compute_specs_are_refused(text, reason):
    with pytest.raises(ConfigError, match=reason):
        parse_fault(text)
