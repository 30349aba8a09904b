"""Start-up is never taken for a hang: when the stall clock arms, which limit a rank gets in each
phase, and two-rank jobs where only direct process evidence can name a rank (pure)."""

from __future__ import annotations

import pytest

from scout_slurm.evidence.records import ChildState, FindingKind, ProgressSnapshot
from scout_slurm.localise.stall import decide_stall
from scout_slurm.task import stallclock


@pytest.mark.parametrize(
    "steps,completed,arm_after,expected",
    [
        (0, 0, 1000, False),  # nothing yet
        (0, 4, 1000, False),  # deepspeed.initialize made 4 collectives: still starting
        (0, 999, 1000, False),
        (0, 1000, 1000, True),  # a job whose optimizer scout cannot see arms on collectives
        (1, 4, 1000, True),  # the first optimizer step
        (0, 50_000, 0, False),  # 0: collectives alone never arm
        (3, 0, 0, True),
    ],
)
def test_stall_clock_arms_at_first_step_or_after_n_collectives(
    steps, completed, arm_after, expected
):
    assert (
        stallclock.armed(opt_steps=steps, coll_completed=completed, arm_after_collectives=arm_after)
        is expected
    )


@pytest.mark.parametrize(
    "armed,busy,phase",
    [
        (False, False, stallclock.PHASE_STARTUP),
        (False, True, stallclock.PHASE_STARTUP),  # a checkpoint load after a resume: still start-up
        (True, True, stallclock.PHASE_CHECKPOINT),
        (True, False, stallclock.PHASE_TRAINING),
    ],
)
def test_phase(armed, busy, phase):
    assert stallclock.phase(armed_=armed, busy=busy) == phase


def test_each_phase_gets_its_limit():
    kw = dict(floor_s=4.0, factor=10.0, startup_limit_s=600.0)
    assert (
        stallclock.threshold_s(phase_=stallclock.PHASE_STARTUP, typical_step_s=0.0, **kw) == 600.0
    )
    assert stallclock.threshold_s(phase_=stallclock.PHASE_TRAINING, typical_step_s=0.0, **kw) == 4.0
    assert (
        stallclock.threshold_s(phase_=stallclock.PHASE_TRAINING, typical_step_s=2.0, **kw) == 20.0
    )
    # a save never gets less than training would, nor less than the start-up limit
    assert (
        stallclock.threshold_s(phase_=stallclock.PHASE_CHECKPOINT, typical_step_s=0.0, **kw)
        == 600.0
    )
    assert (
        stallclock.threshold_s(phase_=stallclock.PHASE_CHECKPOINT, typical_step_s=100.0, **kw)
        == 1000.0
    )


def snap(
    rank: int,
    *,
    entered: int,
    completed: int,
    state: ChildState = ChildState.RUNNING,
    in_collective: bool = True,
) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=f"n{rank + 1}",
        pid=100 + rank,
        published_at=1.0,
        child_state=state,
        coll_entered=entered,
        coll_completed=completed,
        in_collective=in_collective,
        current_op="all_reduce" if in_collective else "none",
        opt_steps=5,
        pg_seq=completed,
        idle_s=10.0,
        step_time_s=0.1,
    )


@pytest.mark.parametrize("state", [ChildState.STOPPED, ChildState.DISK_SLEEP, ChildState.EXITED])
def test_two_ranks_direct_process_evidence_names_the_rank(state):
    waiting = snap(0, entered=11, completed=10)
    culprit = snap(1, entered=10, completed=10, state=state, in_collective=False)
    call = decide_stall({0: waiting, 1: culprit}, 2)
    assert call.culprits == (1,) and call.kind == FindingKind.HANG, call


def test_two_ranks_stopped_inside_the_same_collective_is_named():
    # both entered collective 11; one of them cannot move: the process state says which
    call = decide_stall(
        {
            0: snap(0, entered=11, completed=10),
            1: snap(1, entered=11, completed=10, state=ChildState.STOPPED),
        },
        2,
    )
    assert call.culprits == (1,)


def test_two_ranks_progress_tie_without_process_evidence_is_inconclusive():
    call = decide_stall(
        {
            0: snap(0, entered=11, completed=10),
            1: snap(1, entered=10, completed=10, in_collective=False),
        },
        2,
    )
    assert call.culprits == (), call
    assert "no strict majority ahead" in call.reasoning[0]


def test_two_ranks_both_stopped_names_nobody():
    call = decide_stall(
        {
            0: snap(0, entered=11, completed=10, state=ChildState.STOPPED),
            1: snap(1, entered=11, completed=10, state=ChildState.STOPPED),
        },
        2,
    )
    assert call.culprits == ()


def test_four_ranks_half_stopped_are_named_the_rest_waiting():
    snaps = {r: snap(r, entered=11, completed=10) for r in range(4)}
    for r in (2, 3):  # one node's two ranks SIGSTOPped
        snaps[r] = snap(r, entered=11, completed=10, state=ChildState.STOPPED)
    assert decide_stall(snaps, 4).culprits == (2, 3)


# --- the watchdog's view of one rank --------------------------------------------------------

from pathlib import Path  # noqa: E402

from scout_slurm.config import WatchdogConfig  # noqa: E402
from scout_slurm.task.progress import ProgressView  # noqa: E402
from scout_slurm.task.watchdog import RankTracker  # noqa: E402

CFG = WatchdogConfig(stall_floor_s=4.0, startup_grace_s=300.0, arm_after_collectives=1000)


def view(
    *, steps: int = 0, completed: int = 0, busy: bool = False, changed_ns: int = 1
) -> ProgressView:
    return ProgressView(
        pid=10,
        rank=0,
        world_size=2,
        active=True,
        coll_entered=completed,
        coll_completed=completed,
        in_collective=False,
        current_op="none",
        current_nbytes=0,
        opt_steps=steps,
        pg_seq=-1,
        last_change_ns=changed_ns,
        last_step_ns=0,
        recent=(),
        busy=busy,
    )


def test_after_deepspeed_initialize_collectives_a_rank_still_has_the_startup_limit():
    t = RankTracker(0, Path("/nonexistent"))
    t.observe(view(completed=4), now=1.0)
    assert t.phase(CFG) == stallclock.PHASE_STARTUP and t.threshold_s(CFG) == 300.0


def test_first_step_arms_the_floor_and_a_save_gets_the_startup_limit():
    t = RankTracker(0, Path("/nonexistent"))
    t.observe(view(steps=1, completed=6), now=1.0)
    assert t.threshold_s(CFG) == 4.0
    t.observe(view(steps=1, completed=6, busy=True, changed_ns=2), now=2.0)
    assert t.phase(CFG) == stallclock.PHASE_CHECKPOINT and t.threshold_s(CFG) == 300.0


def test_a_forward_without_collectives_restarts_the_idle_clock():
    t = RankTracker(0, Path("/nonexistent"))
    t.observe(view(steps=3, completed=9, changed_ns=100), now=1.0)
    t.observe(view(steps=3, completed=9, changed_ns=100), now=5.0)
    assert t.last_change == 1.0  # nothing moved
    t.observe(view(steps=3, completed=9, changed_ns=200), now=6.0)
    assert t.last_change == 6.0  # a beat (an evaluation forward) moved the record


def test_progress_record_carries_busy_and_beats(tmp_path):
    from scout_slurm.task import progress

    path = tmp_path / "rank-0.bin"
    progress.create(path)
    w = progress.ProgressWriter(path, rank=0, world_size=2)
    before = progress.read(path)
    assert before is not None and not before.busy
    w.set_busy(True)
    busy = progress.read(path)
    assert (
        busy.busy
        and busy.position == before.position
        and busy.last_change_ns >= before.last_change_ns
    )
    w.set_busy(False)
    w.beat()
    after = progress.read(path)
    assert not after.busy and after.active and after.position == before.position
    assert after.last_change_ns > busy.last_change_ns
