"""Where non-finite numbers began (scout_slurm.bootstrap.finite.first_nonfinite), pure."""

from __future__ import annotations

from scout_slurm.bootstrap.finite import NONE, first_nonfinite


def test_nobody_non_finite_is_none():
    assert first_nonfinite([NONE] * 4).outcome == "none"


def test_one_rank_first_is_named_even_when_the_others_followed():
    v = first_nonfinite([8, 7, 8, 8])
    assert (v.outcome, v.step, v.ranks) == ("named", 7, (1,))
    assert "rank(s) [1] only" in v.explanation


def test_one_rank_first_at_the_vote_step_is_named_before_the_others_follow():
    v = first_nonfinite([NONE, NONE, NONE, 3])
    assert (v.outcome, v.step, v.ranks) == ("named", 3, (3,))


def test_everyone_at_the_same_step_is_divergence_and_names_nobody():
    v = first_nonfinite([5, 5, 5, 5])
    assert (v.outcome, v.ranks) == ("inconclusive", (0, 1, 2, 3))
    assert "diverged" in v.explanation


def test_half_is_not_a_strict_minority():
    v = first_nonfinite([5, 5, 6, NONE])
    assert (v.outcome, v.step, v.ranks) == ("inconclusive", 5, (0, 1))


def test_a_minority_of_several_is_named_together():
    v = first_nonfinite([4, 4, 9, 9, 9, NONE, NONE, NONE])
    assert (v.outcome, v.ranks) == ("named", (0, 1))


def test_two_ranks_one_first_is_named():
    assert first_nonfinite([NONE, 2]).ranks == (1,)
    assert first_nonfinite([2, 2]).outcome == "inconclusive"
