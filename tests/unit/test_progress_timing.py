"""The progress writer's timing split: time outside collectives (compute) and inside (collectives),
overlapping collectives counted once, scout's own work left out. A fake monotonic clock drives
it."""

from __future__ import annotations

import pytest

import scout_slurm.task.progress as progress
from scout_slurm.task.progress import ProgressWriter, create


class FakeTime:
    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def monotonic_ns(self) -> int:
        return self.ns

    def advance(self, ms: float) -> None:
        self.ns += int(ms * 1_000_000)


@pytest.fixture()
def clocked(tmp_path, monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(progress, "time", fake)
    path = tmp_path / "rank-0.bin"
    create(path)
    return ProgressWriter(path, rank=0, world_size=2), fake


def _ms(pair):
    return tuple(round(x / 1e6, 3) for x in pair)


def test_nothing_counts_before_timing_starts(clocked):
    w, t = clocked
    t.advance(500)  # start-up: model building, first forward
    s = w.enter("all_reduce", 4, 2)
    t.advance(7)
    w.leave(s)
    t.advance(20)
    # compute began to count only at the end of the collective; collectives count from the start
    assert _ms(w.take_timing(resume=True)) == (20.0, 7.0)


def test_compute_between_collectives_and_overlap_counted_once(clocked):
    w, t = clocked
    w.take_timing(resume=True)
    t.advance(10)  # compute
    a = w.enter("ddp_bucket_all_reduce", 8, 2)
    t.advance(3)
    b = w.enter("ddp_bucket_all_reduce", 8, 2)  # second bucket while the first is in flight
    t.advance(4)
    w.leave(a)
    t.advance(2)
    w.leave(b)
    t.advance(5)  # compute again
    assert _ms(w.take_timing(resume=True)) == (15.0, 9.0)
    t.advance(1)
    assert _ms(w.take_timing(resume=True)) == (1.0, 0.0)  # zeroed by the take


def test_pause_leaves_scouts_own_work_out(clocked):
    w, t = clocked
    w.take_timing(resume=True)
    t.advance(10)
    w.pause_timing()
    t.advance(100)  # a vote on the side group, waiting for a slow peer
    w.resume_timing()
    t.advance(4)
    assert _ms(w.take_timing(resume=False)) == (14.0, 0.0)
    t.advance(50)  # not resumed: nothing counts
    assert _ms(w.take_timing(resume=True)) == (0.0, 0.0)


def test_scout_collectives_while_paused_count_as_neither_compute_nor_collective(clocked):
    # votes and replay use scout's side group inside pause/resume: in the progress record (so a rank
    # that never arrives is seen behind), but their time is not the job's
    w, t = clocked
    w.take_timing(resume=True)
    t.advance(10)  # compute
    w.pause_timing()
    s = w.enter("scout_vote", 8, 2)
    t.advance(30)  # waiting for the peers in scout's vote
    w.leave(s)
    t.advance(5)  # scout's own work after the vote
    w.resume_timing()
    t.advance(4)  # compute again
    s = w.enter("all_reduce", 4, 2)
    t.advance(2)
    w.leave(s)
    assert _ms(w.take_timing(resume=True)) == (14.0, 2.0)
