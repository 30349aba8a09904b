"""The watchdog's confirmation window on the real Watchdog loop, driven by a scripted clock: a rank
idle into the window that advances again before its threshold is never called (and its stacks are
dumped once per window); a rank that stays idle is called at its threshold, after a full window,
not at threshold + window. The rank's progress goes through the real shared-memory record, its
peers' through published snapshots in a real evidence folder; the "training process" is a
`sleep` this test starts and ends by pid."""

from __future__ import annotations

import collections
import os
import signal
import subprocess

import pytest
import scriptclock

from scout_slurm.config import WatchdogConfig
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ChildState,
    ExitRecord,
    Finding,
    FindingKind,
    ProgressSnapshot,
    StallDecision,
)
from scout_slurm.evidence.store import list_records, read_record, write_record
from scout_slurm.jobenv import TaskContext
from scout_slurm.task import exitcodes, progress
from scout_slurm.task.shim import prepare_dirs
from scout_slurm.task.watchdog import STACK_SIGNAL, Watchdog, WatchState, confirm_window_s

FLOOR = 4.0
CFG = WatchdogConfig(
    stall_floor_s=FLOOR,
    poll_interval_s=0.2,
    publish_interval_s=0.5,
    steady_publish_interval_s=2.0,
    grace_s=1.0,
    startup_grace_s=300.0,
)
WALL0 = 1.8e9
WORLD = 3


def Script(events: list[tuple[float, object]]) -> scriptclock.Script:
    return scriptclock.Script(events, wall0=WALL0, limit_s=60)


@pytest.fixture
def rig(tmp_path):
    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    prepare_dirs(folder, 0)
    shm = tmp_path / "shm"
    shm.mkdir()
    progress.create(shm / "rank-0.bin")
    writer = progress.ProgressWriter(shm / "rank-0.bin", rank=0, world_size=WORLD)
    ctx = TaskContext(
        job_id=7,
        step_id=0,
        rank=0,
        world_size=WORLD,
        local_rank=0,
        node_index=0,
        node="n1",
        step_nodelist="n[1-2]",
        tasks_per_node="1,2",
        cluster="lab",
        restart=0,
        cuda_visible_devices="",
    )
    stacks = []
    # the record's pid is this test's process: the watchdog's stack request lands here, counted
    previous = signal.signal(STACK_SIGNAL, lambda *_: stacks.append(1))
    child = subprocess.Popen(["sleep", "120"])
    try:
        yield folder, shm, writer, ctx, child, stacks
    finally:
        signal.signal(STACK_SIGNAL, previous)
        if child.poll() is None:
            child.kill()  # the sleep this test started
            child.wait()


def advance(writer: progress.ProgressWriter) -> None:
    seq = writer.enter("all_reduce", 4, WORLD)
    writer.leave(seq)
    writer.step()


class Peers:
    """Ranks 1 and 2 on n2: waiting inside the next collective since `last_change`, their
    watchdog publishing (a new publish_seq each time)."""

    def __init__(
        self, folder: JobFolder, script: Script, last_change: float, position: int
    ) -> None:
        self.folder, self.script, self.last_change, self.position = (
            folder,
            script,
            last_change,
            position,
        )
        self.seq = 0

    def publish(self) -> None:
        self.seq += 1
        p, t = self.position, self.script.t
        for r in (1, 2):
            write_record(
                self.folder.progress_path(0, r),
                ProgressSnapshot(
                    rank=r,
                    node="n2",
                    pid=3000 + r,
                    published_at=self.script.wall(),
                    child_state=ChildState.RUNNING,
                    coll_entered=p + 1,
                    coll_completed=p,
                    in_collective=True,
                    current_op="all_reduce",
                    opt_steps=p,
                    pg_seq=p,
                    idle_s=round(max(0.0, t - self.last_change), 3),
                    step_time_s=0.0,
                    publish_seq=self.seq,
                    threshold_s=FLOOR,
                ),
            )


def findings(folder: JobFolder) -> list[Finding]:
    found, errors = list_records(folder.findings_dir(0), "*.json", Finding, root=folder.root)
    assert not errors
    return found


def _watchdog(rig, script: Script) -> Watchdog:
    folder, shm, _, ctx, child, _ = rig
    return Watchdog(
        ctx=ctx,
        cfg=CFG,
        folder=folder,
        child=child,
        shm_dir=shm,
        stderr_tail=collections.deque(),
        clock=script.clock,
        wall=script.wall,
        sleep=script.sleep,
    )


def _idle_among_waiting_peers(rig) -> Watchdog:
    """Rank 0 advanced once and then stays idle; ranks 1 and 2 wait inside the next collective from
    t = 0.05 s, their watchdog publishing every 0.5 s."""
    folder, _, writer, _, _, _ = rig
    advance(writer)
    script = Script([])
    p = Peers(folder, script, last_change=0.05, position=writer.steps * 2)
    p.publish()
    script.events = [(round(0.5 * i, 3), p.publish) for i in range(1, 100)]
    return _watchdog(rig, script)


def test_window_is_the_lab_default():
    assert confirm_window_s(CFG) == 2.0


def test_idle_into_the_window_then_advancing_is_never_called(rig):
    folder, _, writer, _, child, stacks = rig
    advance(writer)
    events: list = []
    # idle 0 -> 3.8 s (the window opens at 2 s, the threshold is 4 s), then advancing every 0.1 s,
    # idle again 6 -> 9.7 s, advancing, and the child ends at 11 s
    for start, stop in ((3.8, 6.0), (9.7, 11.0)):
        events += [
            (round(start + i * 0.1, 3), lambda: advance(writer))
            for i in range(int((stop - start) / 0.1))
        ]
    events.append((11.0, child.kill))
    script = Script(events)
    wd = _watchdog(rig, script)
    states = []
    real_to = wd._to
    wd._to = lambda new: (states.append(new), real_to(new))[1]
    code = wd.run()
    assert code == 128 + signal.SIGKILL  # the child's own end, not scout's
    assert not folder.stall_decision_path(0).exists()
    assert [f for f in findings(folder) if f.kind == FindingKind.STALL_SUSPECT] == []
    assert states == [
        WatchState.SUSPECT,
        WatchState.WATCHING,
        WatchState.SUSPECT,
        WatchState.WATCHING,
        WatchState.DONE,
    ]
    assert len(stacks) == 2  # one dump per window, not one per life


def test_idle_past_the_threshold_is_called_at_the_threshold_after_a_full_window(rig):
    folder, _, _, _, child, stacks = rig
    wd = _idle_among_waiting_peers(rig)
    code = wd.run()
    assert code == exitcodes.STALL_CULPRIT
    d = read_record(folder.stall_decision_path(0), StallDecision, root=folder.root)
    assert d.culprits == (0,) and d.kind == FindingKind.HANG, d
    called = d.at - WALL0
    # at the threshold (the rank last advanced at t = 0), within the wake-up margin; the old rule
    # called it at threshold + window (6 s)
    assert FLOOR < called < FLOOR + 0.05, called
    suspects = [f for f in findings(folder) if f.kind == FindingKind.STALL_SUSPECT]
    assert [f.rank for f in suspects] == [0] and FLOOR < suspects[0].at - WALL0 < FLOOR + 0.05
    assert (
        called - wd.suspect_since >= confirm_window_s(CFG) - 1e-6
    )  # the whole window ran before the call
    assert len(stacks) == 1
    assert child.poll() is not None  # scout ended the "training process"


def test_a_peer_still_advancing_holds_the_call_as_before(rig):
    folder, _, writer, _, child, _ = rig
    advance(writer)
    script = Script([])
    p = Peers(folder, script, last_change=0.0, position=writer.steps * 2)

    def peer_advancing() -> None:  # the peers move until 7 s (idle_s stays small), then stop
        if script.t < 7.2:
            p.last_change = script.t
        p.publish()

    p.publish()
    script.events = [(round(0.5 * i, 3), peer_advancing) for i in range(1, 100)]
    wd = _watchdog(rig, script)
    assert wd.run() == exitcodes.STALL_CULPRIT
    called = read_record(folder.stall_decision_path(0), StallDecision, root=folder.root).at - WALL0
    # held while a peer advanced (rank 0 passed its threshold at 4 s); called once the peers'
    # published snapshots said idle for half their threshold: within a publication and a poll
    assert p.last_change > 7.0
    assert (
        p.last_change + FLOOR / 2 - 1e-6
        <= called
        <= p.last_change + FLOOR / 2 + CFG.publish_interval_s + CFG.poll_interval_s
    )


def _wait_zombie(pid: int) -> None:
    """Until the killed child is a zombie: dead, not reaped (what the watchdog's next reap
    collects).
    """
    import time

    for _ in range(500):
        with open(f"/proc/{pid}/stat", "rb") as fh:
            if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end")


def test_a_shim_whose_process_ended_during_its_turn_leaves_the_call_to_the_ranks_still_waiting(rig):
    """The process ends between the turn's reap and its stall check (under load that gap is long:
    reading the records, publishing). The shim takes the exit path at the next turn instead of
    deciding beside peers' snapshots that their shims may not have refreshed yet. In the 20-jobs
    load test (seen once, in CI) only this race, by the rules, lets the survivor's shim name its
    own rank for the peer's SIGKILL."""
    folder, _, _, _, child, _ = rig
    wd = _idle_among_waiting_peers(rig)
    observe, killed = wd._observe, []

    def observe_then_die(now: float) -> None:
        observe(now)
        if now > FLOOR and not killed:
            killed.append(now)
            os.kill(child.pid, signal.SIGKILL)  # the sleep this test started; not reaped here
            _wait_zombie(child.pid)

    wd._observe = observe_then_die
    code = wd.run()
    assert killed
    assert code == 128 + signal.SIGKILL, code  # the child's own end, through the exit path
    assert not folder.stall_decision_path(0).exists()
    e = read_record(folder.rank_exit_path(0, 0), ExitRecord, root=folder.root)
    assert e.signal == signal.SIGKILL and not e.killed_by_scout, e
    snap = read_record(folder.progress_path(0, 0), ProgressSnapshot, root=folder.root)
    assert snap.child_state == ChildState.EXITED  # what the peers still waiting decide with
