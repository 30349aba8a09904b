"""Which ranks must agree, and what their votes say (pure: no torch, no environment).

Equivalent replicas come from the layout the script built: DDP replicates over its process group;
FSDP2/HSDP place each parameter on a DeviceMesh, and ranks that differ only along `Replicate`
mesh dimensions hold the same local shard. In-situ replay schedules (which layer, which source
rank, at which step) are derived from the step number alone, so every rank agrees without talking.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from scout_slurm.evidence.records import VoteOutcome


def _coords(mesh: Sequence) -> list[tuple[tuple[int, ...], int]]:
    """(coordinate, rank) for every cell of a nested-list mesh."""
    out: list[tuple[tuple[int, ...], int]] = []

    def walk(node, prefix):
        if isinstance(node, (list, tuple)):
            for i, child in enumerate(node):
                walk(child, prefix + (i,))
        else:
            out.append((prefix, int(node)))

    walk(mesh, ())
    return out


def replica_groups(mesh: Sequence, replicate_dims: Sequence[int]) -> list[tuple[int, ...]]:
    """Ranks grouped by their coordinates outside `replicate_dims`: within a group every rank holds
    the same local state. A 2x2 HSDP mesh [[0, 1], [2, 3]] replicated along dim 0 gives [(0, 2), (1,
    3)];
    pure FSDP (no replicated dim) gives one group per rank; DDP is a 1-D mesh replicated along dim
    0."""
    cells = _coords(mesh)
    if not cells:
        raise ValueError("replica_groups: the mesh has no ranks")
    ndim = len(cells[0][0])
    bad = [d for d in replicate_dims if not 0 <= d < ndim]
    if bad:
        raise ValueError(f"replica_groups: mesh dimension(s) {bad} outside a {ndim}-D mesh")
    keep = [d for d in range(ndim) if d not in set(replicate_dims)]
    groups: dict[tuple[int, ...], list[int]] = {}
    for coord, rank in cells:
        groups.setdefault(tuple(coord[d] for d in keep), []).append(rank)
    return sorted(tuple(sorted(g)) for g in groups.values())


def shard_group(mesh: Sequence, shard_dim: int, rank: int) -> tuple[int, ...]:
    """The ranks whose local shards, in mesh order along `shard_dim`, make up `rank`'s full
    parameter (its coordinates on the other dimensions fixed)."""
    cells = _coords(mesh)
    mine = next((c for c, r in cells if r == rank), None)
    if mine is None:
        raise ValueError(f"shard_group: rank {rank} is not in the mesh")
    row = [
        (c[shard_dim], r)
        for c, r in cells
        if all(c[d] == mine[d] for d in range(len(mine)) if d != shard_dim)
    ]
    return tuple(r for _, r in sorted(row))


@dataclass(frozen=True)
class GroupVote:
    """The outcome of one vote among one replica group."""

    what: str  # e.g. "weights", "optimizer state", "replay output"
    group: tuple[int, ...]  # the ranks that must agree
    outcome: VoteOutcome  # AGREE, SDC (a strict minority differs) or INCONCLUSIVE
    outliers: tuple[int, ...] = ()
    explanation: str = ""
    schema_version: int = 1


def vote_group(what: str, group: Sequence[int], values: Sequence[int]) -> GroupVote:
    """Strict majority among `group` (values indexed by rank). With two replicas a difference has
    no majority: it shows that one of the pair is wrong, not which."""
    group = tuple(group)
    mine = [values[r] for r in group]
    counts: dict[int, int] = {}
    for v in mine:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return GroupVote(what, group, VoteOutcome.AGREE)
    best, n = max(counts.items(), key=lambda kv: kv[1])
    if n * 2 <= len(group):
        if len(group) == 2:
            why = (
                f"ranks {group[0]} and {group[1]} disagree on {what}; with two replicas there "
                "is no majority: "
                "one of them is wrong, the vote cannot say which"
            )
        else:
            why = f"no strict majority for {what} among ranks {', '.join(map(str, group))}"
        return GroupVote(what, group, VoteOutcome.INCONCLUSIVE, (), why)
    outliers = tuple(r for r in group if values[r] != best)
    return GroupVote(
        what,
        group,
        VoteOutcome.SDC,
        outliers,
        f"rank(s) {', '.join(map(str, outliers))} differ from {n} of {len(group)} replicas on "
        f"{what}",
    )


def vote_groups(
    what: str, groups: Sequence[Sequence[int]], values: Sequence[int]
) -> list[GroupVote]:
    """One vote per group of two or more ranks (a lone rank has nobody to compare with)."""
    return [vote_group(what, g, values) for g in groups if len(g) >= 2]


@dataclass(frozen=True)
class ReplayPlan:
    step: int
    layer_index: int  # into the sorted list of eligible layers
    source: int  # the rank whose captured input is broadcast
    schema_version: int = 1


def replay_plan(step: int, every: int, layers: int, world: int) -> ReplayPlan | None:
    """The replay of step `step` (None: no replay then). The n-th replay takes layer n mod L and
    source rank (n // L + n mod L) mod world: over L x world replays every layer is replayed from
    every source rank, and consecutive replays change the source."""
    if every <= 0 or layers <= 0 or world <= 0 or step <= 0 or step % every:
        return None
    n = step // every - 1
    return ReplayPlan(step, n % layers, (n // layers + n % layers) % world)


def coverage(every: int, layers: int, world: int) -> list[tuple[int, int]]:
    """(layer, source) pairs of the first L x world replays: a check that the rotation covers
    all.
    """
    plans = (replay_plan(every * (n + 1), every, layers, world) for n in range(layers * world))
    return sorted({(p.layer_index, p.source) for p in plans if p is not None})


def pairs_disagreeing(values: Sequence[int], group: Sequence[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in itertools.combinations(group, 2) if values[a] != values[b]]
