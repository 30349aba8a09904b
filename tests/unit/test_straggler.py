"""Timing votes (pure): robust outliers, round decisions, confirmation, the pairing schedule,
settings.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.errors import ConfigError
from scout_slurm.localise.straggler import (
    Confirmation,
    LinkProbe,
    RankTiming,
    RoundDecision,
    TimingRules,
    confirm,
    decide_round,
    link_rounds,
    node_link_scores,
    pairing_rounds,
    robust_outliers,
    rules_from_environment,
)

RULES = TimingRules(every=5, rel_floor=0.2, abs_floor_s=0.05, mad_factor=5.0, confirm_rounds=2)


def _spread(values):
    return robust_outliers(
        values, rel_floor=RULES.rel_floor, abs_floor=RULES.abs_floor_s, mad_factor=RULES.mad_factor
    )


def _timings(compute, comm=None):
    comm = comm or [0.01] * len(compute)
    return [RankTiming(r, c, m, 5) for r, (c, m) in enumerate(zip(compute, comm))]


NODES4 = ["n1", "n1", "n2", "n2"]


# -- robust_outliers ------------------------------------------------------------------------------


def test_one_slow_rank_of_four_is_named():
    s = _spread([0.02, 0.021, 0.019, 0.30])
    assert (s.outcome, s.high) == ("named", (3,))


def test_one_slow_rank_of_eight_with_noise_is_named():
    s = _spread([0.10, 0.11, 0.095, 0.105, 0.40, 0.10, 0.098, 0.102])
    assert (s.outcome, s.high) == ("named", (4,))


def test_noise_names_nobody():
    assert _spread([0.020, 0.024, 0.019, 0.031]).outcome == "clean"
    assert _spread([1.00, 1.10, 0.90, 1.12]).outcome == "clean"


def test_all_slow_together_names_nobody():
    assert _spread([0.5, 0.5, 0.5, 0.5]).outcome == "clean"
    assert _spread([0.52, 0.5, 0.49, 0.51]).outcome == "clean"


def test_two_of_four_slow_is_inconclusive():
    s = _spread([0.02, 0.30, 0.02, 0.31])
    assert s.outcome == "inconclusive"
    assert s.high == (1, 3)


def test_three_of_four_slow_is_inconclusive():
    assert _spread([0.3, 0.3, 0.02, 0.3]).outcome == "inconclusive"


def test_two_ranks_cannot_name_either():
    assert _spread([0.02, 0.5]).outcome == "inconclusive"


def test_below_absolute_floor_is_clean_even_if_relatively_large():
    # 3x slower, but only 20 ms a step: below the absolute floor of 50 ms
    assert _spread([0.01, 0.01, 0.01, 0.03]).outcome == "clean"


def test_below_relative_floor_is_clean_even_if_absolutely_large():
    # 0.1 s more on a 2 s step (5 %): below the 20 % floor
    assert _spread([2.0, 2.0, 2.0, 2.1]).outcome == "clean"


def test_wide_spread_raises_the_bar():
    # ranks spread widely: one a little beyond the others is not named (MAD term)
    assert _spread([0.1, 0.3, 0.5, 0.7, 0.9, 1.2]).outcome == "clean"


def test_empty_and_single():
    assert _spread([]).outcome == "clean"
    assert _spread([5.0]).outcome == "clean"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0.001, 10.0), min_size=4, max_size=32),
    st.integers(0, 31),
    st.floats(2.0, 20.0),
)
def test_property_one_far_slower_rank_is_always_named(base, idx, factor):
    # every rank the same up to 1 %, one rank factor times slower and at least 0.1 s more
    ref = base[0]
    values = [ref * (1 + 0.01 * (b / 10.0)) for b in base]
    i = idx % len(values)
    values[i] = max(ref * factor, ref + 0.1)
    s = _spread(values)
    assert (s.outcome, s.high) == ("named", (i,))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=2, max_size=32), st.floats(0.001, 5.0))
def test_property_equal_within_floors_is_clean(noise, base):
    # every value within the absolute floor of the others: nobody, never inconclusive
    values = [base + 0.049 * x for x in noise]
    assert _spread(values).outcome == "clean"


# -- decide_round ---------------------------------------------------------------------------------


def test_round_compute_straggler_named_with_node():
    d = decide_round(
        _timings([0.02, 0.02, 0.02, 0.30], [0.3, 0.3, 0.3, 0.01]), NODES4, None, 0.02, RULES
    )
    assert (d.outcome, d.ranks, d.nodes) == ("compute", (3,), ("n2",))


def test_round_whole_group_slow_names_nobody():
    d = decide_round(_timings([0.3, 0.31, 0.3, 0.29]), NODES4, None, 0.02, RULES)
    assert d.outcome == "group_slow" and d.ranks == () and d.nodes == ()


def test_round_whole_group_within_floor_of_best_is_clean():
    assert (
        decide_round(_timings([0.03, 0.03, 0.03, 0.03]), NODES4, None, 0.02, RULES).outcome
        == "clean"
    )


def test_round_two_slow_is_inconclusive():
    d = decide_round(_timings([0.3, 0.02, 0.3, 0.02]), NODES4, None, 0.02, RULES)
    assert d.outcome == "inconclusive" and d.ranks == ()


def _probe(n, slow_node_ranks, fast=0.001, slow=0.2):
    small = [[-1.0] * n for _ in range(n)]
    medium = [[-1.0] * n for _ in range(n)]
    for a, b in itertools.combinations(range(n), 2):
        hit = a in slow_node_ranks or b in slow_node_ranks
        small[a][b] = fast
        medium[a][b] = slow if hit else fast * 3
    return LinkProbe(tuple(map(tuple, small)), tuple(map(tuple, medium)))


def test_round_slow_link_names_the_node_as_communication():
    nodes = ["n1", "n2", "n3", "n4"]
    d = decide_round(_timings([0.02] * 4, [0.2] * 4), nodes, _probe(4, {1}), 0.02, RULES)
    assert (d.outcome, d.ranks, d.nodes) == ("communication", (1,), ("n2",))


def test_round_slow_link_with_two_ranks_per_node():
    nodes = ["n1", "n1", "n2", "n2", "n3", "n3"]
    d = decide_round(_timings([0.02] * 6, [0.2] * 6), nodes, _probe(6, {4, 5}), 0.02, RULES)
    assert (d.outcome, d.ranks, d.nodes) == ("communication", (4, 5), ("n3",))


def test_round_slow_link_between_two_nodes_cannot_be_placed():
    d = decide_round(_timings([0.02] * 4, [0.2] * 4), NODES4, _probe(4, {2, 3}), 0.02, RULES)
    assert d.outcome == "clean" and d.ranks == ()
    assert any("cannot be placed" in r for r in d.reasons)


def test_round_compute_straggler_wins_over_link_probe():
    # a slow rank also answers the probe late: its compute decides, not the link
    nodes = ["n1", "n2", "n3", "n4"]
    d = decide_round(_timings([0.02, 0.02, 0.5, 0.02]), nodes, _probe(4, {2}), 0.02, RULES)
    assert (d.outcome, d.ranks) == ("compute", (2,))


def test_round_probe_noise_names_nobody():
    rng = random.Random(7)
    n = 4
    small = [[-1.0] * n for _ in range(n)]
    medium = [[-1.0] * n for _ in range(n)]
    for a, b in itertools.combinations(range(n), 2):
        small[a][b] = 0.0005 + rng.random() * 0.002
        medium[a][b] = 0.002 + rng.random() * 0.004
    probe = LinkProbe(tuple(map(tuple, small)), tuple(map(tuple, medium)))
    assert (
        decide_round(_timings([0.02] * 4), ["n1", "n2", "n3", "n4"], probe, 0.02, RULES).outcome
        == "clean"
    )


def test_node_link_scores_ignore_pairs_on_one_node():
    probe = _probe(4, {0, 1})  # ranks 0 and 1 share n1: their pair is not a link
    scores = node_link_scores(probe, NODES4)
    assert set(scores) == {"n1", "n2"}


# -- confirm ---------------------------------------------------------------------------------------


def _named(rank):
    return RoundDecision("compute", (rank,), ("n",))


def test_confirmed_only_after_two_rounds_and_reported_once():
    s = Confirmation()
    r1 = confirm(s, _named(3), RULES)
    assert r1.confirmed == ()
    r2 = confirm(r1.state, _named(3), RULES)
    assert r2.confirmed == ("compute:rank:3",)
    r3 = confirm(r2.state, _named(3), RULES)
    assert r3.confirmed == ()  # said once


def test_one_round_outlier_is_transient():
    r1 = confirm(Confirmation(), _named(0), RULES)
    r2 = confirm(r1.state, _named(3), RULES)
    assert r2.confirmed == () and r2.transient == ("compute:rank:0",)
    r3 = confirm(r2.state, _named(3), RULES)
    assert r3.confirmed == ("compute:rank:3",) and r3.transient == ()


def test_streak_broken_by_a_clean_round_starts_over():
    s = confirm(Confirmation(), _named(1), RULES).state
    s = confirm(s, RoundDecision("clean"), RULES).state
    r = confirm(s, _named(1), RULES)
    assert r.confirmed == ()


def test_confirm_rounds_one_names_at_once_and_three_waits():
    assert confirm(Confirmation(), _named(2), TimingRules(confirm_rounds=1)).confirmed == (
        "compute:rank:2",
    )
    rules3 = TimingRules(confirm_rounds=3)
    s = Confirmation()
    got = []
    for _ in range(3):
        out = confirm(s, _named(2), rules3)
        s = out.state
        got.append(out.confirmed)
    assert got == [(), (), ("compute:rank:2",)]


def test_group_slow_and_communication_keys():
    s = confirm(Confirmation(), RoundDecision("group_slow"), RULES).state
    assert confirm(s, RoundDecision("group_slow"), RULES).confirmed == ("group_slow",)
    s = confirm(Confirmation(), RoundDecision("communication", (2, 3), ("n2",)), RULES).state
    assert confirm(s, RoundDecision("communication", (2, 3), ("n2",)), RULES).confirmed == (
        "communication:node:n2",
    )


# -- pairing_rounds
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(0, 12))
def test_pairing_rounds_cover_every_pair_once_and_no_rank_twice_per_round(n):
    rounds = pairing_rounds(n)
    seen = [p for r in rounds for p in r]
    assert sorted(seen) == sorted(itertools.combinations(range(n), 2))
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))
    assert len(rounds) <= max(n, 1)


@pytest.mark.parametrize(
    "nodes",
    [
        ["a"] * 4,
        ["a", "a", "b", "b"],
        ["a", "b", "a", "b", "c"],
        ["a", "b", "c"],
        ["a"] * 8 + ["b"] * 8,
        [],
    ],
)
def test_link_rounds_probe_each_pair_across_nodes_once_and_no_pair_within_one(nodes):
    rounds = link_rounds(nodes)
    seen = [p for r in rounds for p in r]
    across = [
        (a, b) for a, b in itertools.combinations(range(len(nodes)), 2) if nodes[a] != nodes[b]
    ]
    assert sorted(seen) == across
    assert all(r for r in rounds)  # no empty round left for the ranks to walk through
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))


def test_link_rounds_leave_no_link_between_two_nodes_unprobed_that_scores_read():
    nodes = ["n1", "n1", "n2", "n2", "n3", "n3"]
    probe = _probe(6, {4, 5})
    kept = {p for r in link_rounds(nodes) for p in r}
    # the probe with only the scheduled pairs measured reads the same scores as the full one
    small = [[probe.small[a][b] if (a, b) in kept else -1.0 for b in range(6)] for a in range(6)]
    medium = [[probe.medium[a][b] if (a, b) in kept else -1.0 for b in range(6)] for a in range(6)]
    assert node_link_scores(
        LinkProbe(tuple(map(tuple, small)), tuple(map(tuple, medium))), nodes
    ) == node_link_scores(probe, nodes)


# -- settings --------------------------------------------------------------------------------------


def test_rules_from_environment_reads_and_ignores_others():
    r = rules_from_environment(
        {
            "SCOUT_TIMING_EVERY": "5",
            "SCOUT_TIMING_ABS_FLOOR_S": "0.01",
            "SCOUT_TIMING_PROBE": "false",
            "SCOUT_TIMING_POLICY": "exit",
            "PATH": "/bin",
        }
    )
    assert (r.every, r.abs_floor_s, r.probe, r.policy) == (5, 0.01, False, "exit")
    assert rules_from_environment({}) == TimingRules()


@pytest.mark.parametrize(
    "env, words",
    [
        ({"SCOUT_TIMING_EVRY": "5"}, ["SCOUT_TIMING_EVRY", "SCOUT_TIMING_EVERY"]),
        ({"SCOUT_TIMING_EVERY": "five"}, ["SCOUT_TIMING_EVERY", "'five'"]),
        ({"SCOUT_TIMING_PROBE": "maybe"}, ["SCOUT_TIMING_PROBE"]),
        ({"SCOUT_TIMING_POLICY": "drain"}, ["POLICY", "report"]),
        ({"SCOUT_TIMING_CONFIRM_ROUNDS": "0"}, ["CONFIRM_ROUNDS"]),
        ({"SCOUT_TIMING_REL_FLOOR": "nan"}, ["REL_FLOOR"]),
        ({"SCOUT_TIMING_PROBE_BYTES": "0"}, ["PROBE_BYTES"]),
    ],
)
def test_rules_from_environment_errors_name_the_variable(env, words):
    with pytest.raises(ConfigError) as exc:
        rules_from_environment(env)
    for w in words:
        assert w in str(exc.value)


def test_probe_max_world_reads_and_refuses_negative():
    assert rules_from_environment({"SCOUT_TIMING_PROBE_MAX_WORLD": "8"}).probe_max_world == 8
    with pytest.raises(ConfigError, match="PROBE_MAX_WORLD"):
        rules_from_environment({"SCOUT_TIMING_PROBE_MAX_WORLD": "-1"})
