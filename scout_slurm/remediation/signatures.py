"""Pure rules over the state signatures recorded with a checkpoint: the replicas' agreement at save
time, and the comparison of a resumed run's restored state with the record. No torch here: the
signatures are computed in the job (scout_slurm.bootstrap.ckptstate) and arrive as hex strings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scout_slurm.evidence.records import CheckpointNote, StateSignature

COMPONENTS = (
    "model",
    "optimizer",
    "scheduler",
    "rng_cpu",
    "rng_cuda",
    "rng_python",
    "rng_numpy",
    "data",
)
# Replicas must hold these identically; a difference rejects the checkpoint. RNG streams may differ
# between ranks on purpose (per-rank seeds for dropout or augmentation): recorded, never a
# rejection.
REPLICATED = ("model", "optimizer", "scheduler", "data")


def agree(
    per_rank: Sequence[str], groups: Sequence[Sequence[int]] | None = None
) -> tuple[str, bool, tuple[int, ...]]:
    """(majority value, whether every replica group held one value, ranks that differ from their
    group's majority). Ranks with no value ("") take no part. The majority is that of the first
    group with one; "" when none has a strict majority."""
    groups = groups or [range(len(per_rank))]
    majority, agreed, differ = "", True, []
    for group in groups:
        values = [(r, per_rank[r]) for r in group if r < len(per_rank) and per_rank[r]]
        if len(values) < 2:
            if values and not majority:
                majority = values[0][1]
            continue
        counts: dict[str, int] = {}
        for _, v in values:
            counts[v] = counts.get(v, 0) + 1
        best, n = max(counts.items(), key=lambda kv: kv[1])
        if len(counts) > 1:
            agreed = False
        if n * 2 > len(values):
            majority = majority or best
            differ += [r for r, v in values if v != best]
        else:
            differ += [r for r, _ in values]
    return majority, agreed, tuple(sorted(differ))


def agreement_text(
    signatures: Sequence[StateSignature], groups: Sequence[Sequence[int]] | None = None
) -> str:
    """'agreed', or 'disagreed: ...' naming the replicated components and ranks that differ
    (RNG differences are mentioned but do not make it a disagreement)."""
    bad, rng = [], []
    for s in signatures:
        if s.agreed:
            continue
        _, _, differ = agree(s.per_rank, groups)
        where = (
            f"{s.component} differs on rank{'s' if len(differ) != 1 else ''} "
            f"{', '.join(map(str, differ))}"
        )
        (bad if s.component in REPLICATED else rng).append(where)
    if bad:
        return "disagreed: " + "; ".join(bad)
    return "agreed" + (f" (per-rank RNG streams: {'; '.join(rng)})" if rng else "")


def expected(note: CheckpointNote, rank: int, component: str) -> str:
    """The value rank `rank` should hold for `component` right after restoring this checkpoint
    ("" when the record cannot say). DCP: every rank signed its own state inside the save. One
    saving rank: its value at the save, for every rank when the replicas agreed on it."""
    sig = next((s for s in note.signatures if s.component == component), None)
    if sig is None:
        return ""
    if note.exchanged_at_save:
        return sig.per_rank[rank] if rank < len(sig.per_rank) else ""
    if sig.agreed or rank == note.rank:
        return sig.saved or sig.majority
    return ""


def compare(
    note: CheckpointNote, rank: int, restored: Mapping[str, str]
) -> tuple[list[str], list[str], list[str]]:
    """(components that match, mismatches in words, components the record cannot check)."""
    same, bad, unchecked = [], [], []
    for component in COMPONENTS:
        want = expected(note, rank, component)
        have = restored.get(component, "")
        if not want and not have:
            continue
        if not want:
            unchecked.append(component)
        elif have == want:
            same.append(component)
        else:
            bad.append(f"{component}: restored {have or 'nothing'}, recorded {want}")
    return same, bad, unchecked


def short(signatures: Sequence[StateSignature]) -> str:
    """'model=1a2b3c4d optimizer=... ' with 8 hex digits each, '!' after a disagreement."""
    return " ".join(
        f"{s.component}={(s.saved or s.majority)[:8] or '-'}{'' if s.agreed else '!'}"
        for s in signatures
    )
