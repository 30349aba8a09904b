"""When a watchdog publishes its rank's snapshot, and when a quiet peer counts as gone (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from scout_slurm.evidence.records import ChildState
from scout_slurm.task.publishing import is_watchful, next_interval, published_watchful, silent_after
from tests.unit.test_verdict import snap

FAST, STEADY, CONFIRM = 1.0, 10.0, 4.0


@pytest.mark.parametrize(
    "idle,threshold,state,expected",
    [
        (0.05, 60.0, ChildState.RUNNING, False),  # advancing
        (29.9, 60.0, ChildState.RUNNING, False),
        (30.0, 60.0, ChildState.RUNNING, True),  # half the threshold without progress
        (0.0, 60.0, ChildState.STOPPED, True),  # SIGSTOP: at once
        (0.0, 60.0, ChildState.DISK_SLEEP, True),
        (0.0, 600.0, ChildState.STARTING, True),
        (0.0, 60.0, ChildState.EXITED, True),
    ],
)
def test_watchful(idle, threshold, state, expected):
    assert is_watchful(idle_s=idle, threshold_s=threshold, state=state) is expected


def test_a_snapshot_says_which_rate_it_was_published_at():
    s = dataclasses.replace(snap(3), idle_s=0.2, threshold_s=8.0, child_state=ChildState.RUNNING)
    assert not published_watchful(s)
    assert published_watchful(dataclasses.replace(s, idle_s=4.0))
    assert published_watchful(dataclasses.replace(s, child_state=ChildState.STOPPED))


def test_interval_fast_only_when_watchful_and_never_slower_than_fast():
    assert next_interval(True, fast_s=FAST, steady_s=STEADY) == FAST
    assert next_interval(False, fast_s=FAST, steady_s=STEADY) == STEADY
    assert (
        next_interval(False, fast_s=FAST, steady_s=0.1) == FAST
    )  # a steady rate below the fast one


def test_a_heartbeat_peer_gets_a_steady_interval_more_before_it_is_gone():
    stalled = dataclasses.replace(snap(1), idle_s=5.0, threshold_s=8.0)
    healthy = dataclasses.replace(snap(1), idle_s=0.1, threshold_s=8.0)
    assert silent_after(stalled, confirm_s=CONFIRM, fast_s=FAST, steady_s=STEADY) == CONFIRM
    assert (
        silent_after(healthy, confirm_s=CONFIRM, fast_s=FAST, steady_s=STEADY) == CONFIRM + STEADY
    )
