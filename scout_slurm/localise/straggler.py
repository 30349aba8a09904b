"""Timing votes (pure): who is a straggler, from per-rank step timings and a per-pair link probe.

A rank is named only when it stands out from the median by a relative floor, an absolute floor
and a multiple of the MAD, is a strict minority, and stays so for `confirm_rounds` rounds in a row.
Compute time decides compute stragglers; the link probe (pairs of ranks on different nodes)
decides communication stragglers by node; a whole group that slows down names nobody.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.errors import ConfigError
from scout_slurm.evidence.records import VoteOutcome
from scout_slurm.settings import Owner, Refused, declare, declared, parse

ENV_PREFIX = "SCOUT_TIMING_"
POLICIES = ("report", "exit")


def _job(default: object, help: str, **rule: object) -> object:
    return declare(default, help, owner=Owner.USER, **rule)  # type: ignore[arg-type]


@dataclass(frozen=True)
class TimingRules:
    """The timing vote's settings; every key can be set as SCOUT_TIMING_<KEY> in the job's
    environment.
    """

    every: int = _job(25, "steps per timing round (0: no timing votes)")
    rel_floor: float = _job(
        0.2, "a straggler exceeds the median step time by this fraction of it ..."
    )
    abs_floor_s: float = _job(0.05, "... and by this many seconds per step ...")
    mad_factor: float = _job(5.0, "... and by this many scaled MADs (robust spread) of the ranks")
    confirm_rounds: int = _job(2, "rounds in a row before a straggler is named", minimum=1)
    group_rel_floor: float = _job(
        1.0, "a whole group slower than its best round by this fraction names nobody"
    )
    probe: bool = _job(
        True, "time a small and a medium exchange per pair of ranks each round (link probe)"
    )
    probe_bytes: int = _job(
        256 * 1024, "size of the link probe's medium exchange", minimum=1, maximum=64 * 1024 * 1024
    )
    # each rank exchanges with every peer on another node in turn (up to world - 1 exchanges a
    # round): beyond this many ranks the probe is off, and a slow link is not placed (sampling
    # peers is not built)
    probe_max_world: int = _job(64, "beyond this many ranks the link probe is off")
    probe_rel_floor: float = _job(
        1.0, "a slow link exceeds the median probe time by this fraction ..."
    )
    probe_abs_floor_s: float = _job(0.01, "... and by this many seconds")
    policy: str = _job(
        "report",
        "report: the job goes on; exit: a confirmed straggler ends (exit 91)",
        choices=POLICIES,
    )
    verbose: bool = _job(False, "rank 0 says every round's reading on stderr")
    schema_version: int = 1


# SCOUT_TIMING_<KEY>, one a field of TimingRules
SETTINGS = declared(TimingRules, prefix=ENV_PREFIX, field_prefix="timing.")


def rules_from_environment(env: Mapping[str, str]) -> TimingRules:
    """Read SCOUT_TIMING_* (the job's environment, passed in) through their declarations (pure).
    Unknown keys and bad values are errors that name the variable and what is valid."""
    by_name = {s.name: s for s in SETTINGS}
    values: dict[str, object] = {}
    problems = []
    for var, text in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        if var not in by_name:
            raise ConfigError(f"{var}: unknown timing setting; valid: {', '.join(sorted(by_name))}")
        try:
            values[var[len(ENV_PREFIX) :].lower()] = parse(by_name[var], text)
        except Refused as exc:
            problems.append(f"{var}={text!r}: {exc}")
    if problems:
        raise ConfigError("timing settings: " + "; ".join(problems))
    return TimingRules(**values)  # type: ignore[arg-type]


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    if n == 0:
        return 0.0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


@dataclass(frozen=True)
class Spread:
    """One robust comparison of values (one per rank or node)."""

    outcome: VoteOutcome  # CLEAN, NAMED (a strict minority stands out) or INCONCLUSIVE
    high: tuple[int, ...]  # indexes above the threshold (named only when outcome == "named")
    median: float
    mad: float
    threshold: float  # how far above the median a value must be
    reason: str


def robust_outliers(
    values: Sequence[float], *, rel_floor: float, abs_floor: float, mad_factor: float
) -> Spread:
    """Which values stand out high. A strict minority above `median + max(rel*median, abs,
    k*1.4826*MAD)`
    is named; half or more above it, or a split into a slow and a fast half (nobody is typical), is
    inconclusive; otherwise clean."""
    n = len(values)
    if n == 0:
        return Spread(VoteOutcome.CLEAN, (), 0.0, 0.0, 0.0, "no values")
    med = median(values)
    mad = median([abs(v - med) for v in values])
    threshold = max(rel_floor * abs(med), abs_floor, mad_factor * 1.4826 * mad)
    high = tuple(i for i, v in enumerate(values) if v - med > threshold)
    if high and len(high) * 2 < n:
        return Spread(
            VoteOutcome.NAMED,
            high,
            med,
            mad,
            threshold,
            f"{len(high)} of {n} above the median {med:.4f} by more than {threshold:.4f}",
        )
    if high:
        return Spread(
            VoteOutcome.INCONCLUSIVE,
            high,
            med,
            mad,
            threshold,
            f"{len(high)} of {n} above the median {med:.4f}: no majority of typical ones",
        )
    # nobody far above the median, but the values may be two camps (e.g. two of four slow): the
    # median then sits with the slow camp and hides it. A camp split is the widest jump between
    # neighbouring sorted values, when it beats the floors and the spread inside either camp.
    order = sorted(range(n), key=lambda i: values[i])
    s = [values[i] for i in order]
    if n >= 2:
        cut = max(range(n - 1), key=lambda i: s[i + 1] - s[i])
        jump = s[cut + 1] - s[cut]
        inside = max(s[cut] - s[0], s[-1] - s[cut + 1])
        slow = tuple(sorted(order[cut + 1 :]))
        if jump > max(rel_floor * abs(s[cut]), abs_floor, inside) and len(slow) * 2 >= n:
            return Spread(
                VoteOutcome.INCONCLUSIVE,
                slow,
                med,
                mad,
                jump,
                f"{len(slow)} of {n} slower than the rest by {jump:.4f} or more: "
                "no majority of typical ones",
            )
    return Spread(
        VoteOutcome.CLEAN,
        (),
        med,
        mad,
        threshold,
        f"all within {threshold:.4f} of the median {med:.4f}",
    )


@dataclass(frozen=True)
class RankTiming:
    """One rank's averages per step over one round, in seconds."""

    rank: int
    compute_s: float  # outside any training collective (forward, backward, optimizer, data)
    comm_s: float  # inside training collectives (waiting for peers included)
    steps: int


@dataclass(frozen=True)
class LinkProbe:
    """Timed exchanges between pairs of ranks on scout's side group (seconds; min over repetitions).
    `small[i][j]` is a round trip of a few bytes, `medium[i][j]` a medium buffer sent both ways;
    negative where not measured."""

    small: tuple[tuple[float, ...], ...]
    medium: tuple[tuple[float, ...], ...]


def pairing_rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin schedule (circle method): every pair of 0..n-1 exactly once, each rank in at most
    one pair per round, pairs as (low, high)."""
    if n < 2:
        return []
    m = n + (n % 2)
    ring = list(range(m))
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = ring[i], ring[m - 1 - i]
            if a < n and b < n:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return rounds


def link_rounds(nodes: Sequence[str]) -> list[list[tuple[int, int]]]:
    """The link probe's schedule: `pairing_rounds` over every rank, keeping only pairs on different
    nodes (two ranks of one node do not cross a link, and `node_link_scores` never reads their
    pair),
    without the rounds left empty. Every rank computes it from the same gathered node names, so both
    ends of a pair agree on it; all ranks on one node: no probe at all."""
    rounds = [
        [(a, b) for a, b in pairs if nodes[a] != nodes[b]] for pairs in pairing_rounds(len(nodes))
    ]
    return [pairs for pairs in rounds if pairs]


def node_link_scores(probe: LinkProbe, nodes: Sequence[str]) -> dict[str, float]:
    """Per node: the fastest, over its pairs with ranks on OTHER nodes, of small round trip plus
    medium
    exchange. A slow link on one node slows all of its pairs, so even its fastest is slow; another
    node has fast pairs left (and a spike on one pair cannot make a node look slow)."""
    n = len(nodes)
    per: dict[str, list[float]] = {}
    for i in range(n):
        for j in range(n):
            if i == j or nodes[i] == nodes[j]:
                continue
            s, m = _pair(probe.small, i, j), _pair(probe.medium, i, j)
            if s < 0 or m < 0:
                continue
            per.setdefault(nodes[i], []).append(s + m)
    return {node: min(v) for node, v in per.items()}


def _pair(matrix: tuple[tuple[float, ...], ...], i: int, j: int) -> float:
    try:
        a, b = matrix[i][j], matrix[j][i]
    except IndexError:
        return -1.0
    return max(a, b)  # measured by one side; the other is negative


@dataclass(frozen=True)
class RoundDecision:
    outcome: str  # "clean", "compute", "communication", "group_slow", "inconclusive"
    ranks: tuple[int, ...] = ()  # named ranks (compute, or every rank on the named node)
    nodes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


def decide_round(
    timings: Sequence[RankTiming],
    nodes: Sequence[str],
    probe: LinkProbe | None,
    best_median_compute: float | None,
    rules: TimingRules,
) -> RoundDecision:
    """One round's reading. Compute first (a rank whose own work is slow makes everyone else wait,
    so its peers' collectives look slow too); then the link probe by node; then the group as a whole
    against its best round so far."""
    if len(timings) < 2:
        return RoundDecision("clean", reasons=("fewer than two ranks: nothing to compare",))
    compute = [t.compute_s for t in timings]
    spread = robust_outliers(
        compute, rel_floor=rules.rel_floor, abs_floor=rules.abs_floor_s, mad_factor=rules.mad_factor
    )
    figures = (
        "compute s/step "
        + ", ".join(f"r{t.rank}={t.compute_s:.4f}" for t in timings)
        + "; collectives s/step "
        + ", ".join(f"r{t.rank}={t.comm_s:.4f}" for t in timings)
    )
    if spread.outcome is VoteOutcome.NAMED:
        ranks = tuple(timings[i].rank for i in spread.high)
        return RoundDecision(
            "compute",
            ranks,
            tuple(dict.fromkeys(nodes[r] for r in ranks)),
            (f"compute: {spread.reason}", figures),
        )
    if spread.outcome is VoteOutcome.INCONCLUSIVE:
        return RoundDecision("inconclusive", reasons=(f"compute: {spread.reason}", figures))
    reasons = [figures]
    if probe is not None:
        scores = node_link_scores(probe, nodes)
        names = sorted(scores)
        if len(names) >= 3:
            link = robust_outliers(
                [scores[k] for k in names],
                rel_floor=rules.probe_rel_floor,
                abs_floor=rules.probe_abs_floor_s,
                mad_factor=rules.mad_factor,
            )
            probe_text = "link probe s per node " + ", ".join(f"{k}={scores[k]:.4f}" for k in names)
            if link.outcome is VoteOutcome.NAMED:
                slow = tuple(names[i] for i in link.high)
                ranks = tuple(r for r in range(len(nodes)) if nodes[r] in slow)
                return RoundDecision(
                    "communication",
                    ranks,
                    slow,
                    (
                        f"every link of node(s) {', '.join(slow)} is slow: {link.reason}",
                        probe_text,
                        figures,
                    ),
                )
            if link.outcome is VoteOutcome.INCONCLUSIVE:
                return RoundDecision(
                    "inconclusive", reasons=(f"link probe: {link.reason}", probe_text, figures)
                )
        elif len(names) == 2:
            a, b = names
            reasons.append(
                f"link probe: {a}={scores[a]:.4f} s, {b}={scores[b]:.4f} s (two nodes: a slow link "
                "between them cannot be placed at either end)"
            )
    med = median(compute)
    if best_median_compute is not None and med - best_median_compute > max(
        rules.group_rel_floor * best_median_compute, rules.abs_floor_s
    ):
        return RoundDecision(
            "group_slow",
            reasons=(
                f"every rank is slower together: median compute {med:.4f} s/step against "
                f"{best_median_compute:.4f} "
                "in the best round; no rank stands out",
                *reasons,
            ),
        )
    return RoundDecision("clean", reasons=tuple(reasons))


@dataclass(frozen=True)
class Confirmation:
    """Streaks across rounds (pure state, replaced every round)."""

    streaks: tuple[tuple[str, int], ...] = ()  # key -> rounds in a row
    reported: tuple[str, ...] = ()  # keys already confirmed (reported once)


@dataclass(frozen=True)
class RoundOutcome:
    state: Confirmation
    confirmed: tuple[str, ...]  # keys that reached confirm_rounds this round
    transient: tuple[str, ...]  # keys seen in fewer rounds than needed, now gone (a one-off stall)


def decision_keys(d: RoundDecision) -> tuple[str, ...]:
    """What a round says, as keys that must repeat: compute:rank:R, communication:node:N,
    group_slow.
    """
    if d.outcome == "compute":
        return tuple(f"compute:rank:{r}" for r in d.ranks)
    if d.outcome == "communication":
        return tuple(f"communication:node:{n}" for n in d.nodes)
    if d.outcome in ("group_slow", "inconclusive"):
        return (d.outcome,)
    return ()


def confirm(state: Confirmation, d: RoundDecision, rules: TimingRules) -> RoundOutcome:
    now = decision_keys(d)
    before = dict(state.streaks)
    streaks = {k: before.get(k, 0) + 1 for k in now}
    confirmed = tuple(
        k for k in now if streaks[k] >= rules.confirm_rounds and k not in state.reported
    )
    transient = tuple(
        k
        for k, c in before.items()
        if k not in streaks and c < rules.confirm_rounds and k not in state.reported
    )
    return RoundOutcome(
        Confirmation(tuple(sorted(streaks.items())), tuple(sorted({*state.reported, *confirmed}))),
        confirmed,
        transient,
    )
