"""When a watchdog opens its confirmation window, may call a stall, and wakes up (pure)."""

from __future__ import annotations

import pytest

from scout_slurm.config import WatchdogConfig
from scout_slurm.task.stallclock import (
    MIN_SLEEP_S,
    confirm_from_s,
    confirming,
    may_decide,
    next_sleep_s,
    stalled,
)
from scout_slurm.task.watchdog import confirm_window_s


def test_the_window_is_four_fast_publications_and_at_least_two_seconds():
    assert confirm_window_s(WatchdogConfig(publish_interval_s=1.0)) == 4.0  # the defaults
    assert confirm_window_s(WatchdogConfig(publish_interval_s=0.5)) == 2.0  # the lab
    assert confirm_window_s(WatchdogConfig(publish_interval_s=0.1)) == 2.0


@pytest.mark.parametrize(
    "threshold,confirm,opens_at",
    [
        (60.0, 4.0, 56.0),  # defaults: the window runs its course as the threshold passes
        (8.0, 2.0, 6.0),
        (4.0, 2.0, 2.0),  # the lab: from half the threshold, when peers publish fast
        (3.0, 2.0, 1.5),  # a threshold shorter than twice the window: never before half of it
        (600.0, 4.0, 596.0),  # startup grace
    ],
)
def test_the_window_opens_before_the_threshold_but_not_before_half_of_it(
    threshold, confirm, opens_at
):
    assert confirm_from_s(threshold, confirm) == opens_at
    assert not confirming(opens_at, threshold, confirm)
    assert confirming(opens_at + 0.01, threshold, confirm)


def test_the_stall_rule_itself_is_unchanged():
    assert not stalled(4.0, 4.0) and stalled(4.01, 4.0)
    assert not stalled(56.5, 60.0)  # in the window, not yet past the threshold


def _call_time(
    threshold: float, confirm: float, advances_every: float | None, step: float = 0.01
) -> float | None:
    """Replays the rule for one rank that stops at t = 0 (and, if given, advances once every
    `advances_every` seconds): when is a stall called, if ever (within 3 thresholds)?"""
    window_since = None
    t = 0.0
    last_change = 0.0
    while t < 3 * threshold:
        if advances_every is not None and t - last_change >= advances_every:
            last_change = t
        idle = t - last_change
        if not confirming(idle, threshold, confirm):
            window_since = None
        else:
            if window_since is None:
                window_since = t
            elif may_decide(
                now=t,
                window_since=window_since,
                confirm_s=confirm,
                any_stalled=stalled(idle, threshold),
            ):
                return t
        t = round(t + step, 6)
    return None


@pytest.mark.parametrize("threshold,confirm", [(4.0, 2.0), (8.0, 2.0), (60.0, 4.0), (3.0, 2.0)])
def test_a_rank_that_stays_idle_is_called_at_its_threshold_not_threshold_plus_window(
    threshold, confirm
):
    called = _call_time(threshold, confirm, None)
    assert called is not None
    # the window (>= confirm_s) still ran in full before the call
    assert called - confirm_from_s(threshold, confirm) >= confirm - 1e-9
    # at the threshold (or at the window's end when the threshold is shorter than two windows)
    assert called == pytest.approx(
        max(threshold, confirm_from_s(threshold, confirm) + confirm), abs=0.03
    )
    assert called < threshold + confirm  # where the old rule called it


@pytest.mark.parametrize("threshold,confirm", [(4.0, 2.0), (60.0, 4.0), (3.0, 2.0)])
def test_a_rank_slow_but_under_its_threshold_is_never_called(threshold, confirm):
    # idle for almost the whole threshold each time, then it advances: each window closes unused
    assert _call_time(threshold, confirm, advances_every=threshold - 0.05) is None
    # idle just past the call time (the threshold, or the window's end for short thresholds): called
    call_at = max(threshold, confirm_from_s(threshold, confirm) + confirm)
    assert _call_time(threshold, confirm, advances_every=call_at + 0.1) is not None


def test_past_the_threshold_but_the_window_not_over_waits_for_the_window():
    # e.g. a rank whose window opened late (the watchdog just started watching it)
    assert not may_decide(now=10.0, window_since=9.0, confirm_s=2.0, any_stalled=True)
    assert may_decide(now=11.0, window_since=9.0, confirm_s=2.0, any_stalled=True)
    assert not may_decide(now=30.0, window_since=9.0, confirm_s=2.0, any_stalled=False)


def test_sleeps_the_poll_interval_unless_something_is_due_sooner():
    assert next_sleep_s(now=100.0, poll_s=0.2, due=[]) == 0.2
    assert next_sleep_s(now=100.0, poll_s=0.2, due=[105.0]) == 0.2
    assert next_sleep_s(now=100.0, poll_s=0.2, due=[100.07, 100.15]) == pytest.approx(0.07)
    assert next_sleep_s(now=100.0, poll_s=0.2, due=[99.0]) == 0.2  # already past: not a reason
    assert next_sleep_s(now=100.0, poll_s=0.2, due=[100.001]) == MIN_SLEEP_S  # never a busy loop
