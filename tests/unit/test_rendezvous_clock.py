"""Issue 38: the start-up limit runs only where a peer waits (task/stallclock.py).

- the pure rule: a rank before init_process_group is on no clock until a peer of its step has
  entered it, then from that moment;
- the record: the bootstrap's mark before torch's rendezvous, and every writer, set FLAG_INIT;
- the order: a rank that never entered init is behind every rank that did (a strict majority
  still needed, as for any rank behind);
- the real Watchdog loop on a scripted clock: a program that never enters init outlives three
  start-up limits untouched; one whose peers wait at the rendezvous is named at the limit counted
  from their arrival, with one `scout:` line; one that enters marks its step for its peers;
- the `scout:` line's text (task/stallnotice.py).
"""

from __future__ import annotations

import collections
import signal
import subprocess

import pytest
import scriptclock

from scout_slurm.config import WatchdogConfig
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ChildState,
    CollectiveEntry,
    FindingKind,
    ProgressSnapshot,
    RendezvousMark,
    StallDecision,
)
from scout_slurm.evidence.store import list_records, read_record, write_record
from scout_slurm.jobenv import TaskContext
from scout_slurm.localise.stall import decide_stall
from scout_slurm.task import exitcodes, progress, stallclock, stallnotice
from scout_slurm.task.shim import prepare_dirs
from scout_slurm.task.watchdog import Watchdog

LIMIT = 8.0
CFG = WatchdogConfig(
    stall_floor_s=4.0,
    poll_interval_s=0.2,
    publish_interval_s=0.5,
    steady_publish_interval_s=2.0,
    grace_s=1.0,
    startup_grace_s=LIMIT,
)
WALL0 = 1.8e9
WORLD = 3


# ---- the pure rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "entered,peer_since,now,expected_idle",
    [
        (False, None, 500.0, 0.0),  # nobody at the rendezvous: no clock, however long it loads
        (False, 100.0, 103.0, 3.0),  # a peer arrived at 100: the clock runs from then, not from 0
        (
            False,
            2.0,
            103.0,
            63.0,
        ),  # ...or from the rank's own later change (40 s) when that is later
        (
            True,
            None,
            103.0,
            63.0,
        ),  # entered init (waiting there or past it): its last change, as always
        (True, 100.0, 103.0, 63.0),
    ],
)
def test_idle_before_init_counts_only_once_a_peer_waits_at_the_rendezvous(
    entered, peer_since, now, expected_idle
):
    since = stallclock.idle_from(
        last_change=40.0, entered_init=entered, peer_at_init_since=peer_since, now=now
    )
    assert now - since == pytest.approx(expected_idle)


@pytest.mark.parametrize(
    "in_collective,peer_since,now,expected_idle",
    [
        (
            False,
            None,
            900.0,
            0.0,
        ),  # past init, every rank still loading (no collective anywhere): no clock
        (
            False,
            100.0,
            103.0,
            3.0,
        ),  # a peer entered the job's first collective at 100: from then on
        (False, 2.0, 103.0, 63.0),  # ...or from the rank's own later change
        (True, None, 103.0, 63.0),  # past its first collective: its last change, as always
    ],
)
def test_idle_after_init_before_the_first_collective_counts_only_once_a_peer_waits_in_one(
    in_collective, peer_since, now, expected_idle
):
    since = stallclock.idle_from(
        last_change=40.0,
        entered_init=True,
        peer_at_init_since=10.0,
        now=now,
        entered_collective=in_collective,
        peer_in_collective_since=peer_since,
    )
    assert now - since == pytest.approx(expected_idle)


# ---- the record ---------------------------------------------------------------------------------


def test_the_bootstraps_mark_sets_entered_init_on_the_shims_record_before_any_writer(tmp_path):
    path = tmp_path / "rank-3.bin"
    progress.create(path)
    before = progress.read(path)
    assert before is not None and not before.entered_init and before.pid == 0
    progress.mark_entering_init(tmp_path)
    marked = progress.read(path)
    assert (
        marked.entered_init and not marked.active and marked.pid == 0
    )  # still watched, no stack signal
    assert marked.last_change_ns > before.last_change_ns and marked.position == before.position
    w = progress.ProgressWriter(path, rank=3, world_size=4)  # init returned
    after = progress.read(path)
    assert after.entered_init and after.active and after.pid > 0
    w.deactivate()
    assert progress.read(path).entered_init


def test_a_writer_alone_says_past_init_and_the_mark_leaves_a_writers_record_alone(tmp_path):
    path = tmp_path / "rank-0.bin"
    progress.create(path)
    w = progress.ProgressWriter(path, rank=0, world_size=2)
    seq = w.enter("all_reduce", 4, 2)
    before = progress.read(path)
    progress.mark_entering_init(
        tmp_path
    )  # a second init in the same process: the writer owns the record
    assert progress.read(path) == before and before.entered_init
    w.leave(seq)


def test_the_mark_never_raises(tmp_path):
    progress.mark_entering_init(None)  # not under scout-task
    progress.mark_entering_init(tmp_path / "missing")  # no progress folder
    (tmp_path / "rank-1.bin").write_bytes(b"not a record")  # too short
    (tmp_path / "rank-2.bin").write_bytes(b"\0" * progress.SIZE)  # the right size, not a record
    progress.mark_entering_init(tmp_path)
    assert (tmp_path / "rank-2.bin").read_bytes() == b"\0" * progress.SIZE


# ---- who is behind ------------------------------------------------------------------------------


def snap(
    rank: int,
    *,
    entered: bool,
    idle: float = 9.0,
    node: str = "n1",
    completed: int = 0,
    in_coll: bool = False,
    op: str = "none",
    steps: int = 0,
    recent=(),
    state: ChildState = ChildState.RUNNING,
) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=node,
        pid=100 + rank,
        published_at=WALL0,
        child_state=state,
        coll_entered=completed + int(in_coll),
        coll_completed=completed,
        in_collective=in_coll,
        current_op=op,
        opt_steps=steps,
        pg_seq=-1,
        idle_s=idle,
        step_time_s=0.0,
        recent=tuple(recent),
        threshold_s=LIMIT,
        entered_init=entered,
    )


def test_a_rank_that_never_entered_init_is_behind_every_rank_that_did():
    snaps = {r: snap(r, entered=r != 1, node=f"n{1 + r // 2}") for r in range(4)}
    call = decide_stall(snaps, 4)
    assert call.culprits == (1,) and call.kind == FindingKind.HANG, call
    assert "rank 1 on n1: 0 collectives done, before init_process_group" in call.reasoning[0]
    assert "entered init_process_group and waited there" in call.reasoning[-1]


def test_before_init_with_two_ranks_is_still_no_majority():
    call = decide_stall({0: snap(0, entered=True), 1: snap(1, entered=False)}, 2)
    assert call.culprits == (), call


def test_snapshots_of_ranks_past_init_are_ordered_by_progress_alone_as_before():
    snaps = {r: snap(r, entered=True, completed=4 if r != 2 else 3) for r in range(4)}
    call = decide_stall(snaps, 4)
    assert (
        call.culprits == (2,)
        and call.reasoning[-1] == "the other 3 rank(s) reached progress 8 (this rank 6)"
    )


# ---- the real watchdog loop on a scripted clock
# ---------------------------------------------------


def Script(events: list[tuple[float, object]]) -> scriptclock.Script:
    return scriptclock.Script(events, wall0=WALL0, limit_s=90)


@pytest.fixture
def rig(tmp_path):
    """Rank 0's shim before its child calls anything: the record the shim creates, no writer; the
    "training process" is a `sleep` this test starts and ends by pid."""
    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    prepare_dirs(folder, 0)
    shm = tmp_path / "shm"
    shm.mkdir()
    progress.create(shm / "rank-0.bin")
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
    child = subprocess.Popen(["sleep", "120"])
    try:
        yield folder, shm, ctx, child
    finally:
        if child.poll() is None:
            child.kill()  # the sleep this test started
            child.wait()


def _watchdog(rig, script: Script, init_line: str = "") -> Watchdog:
    folder, shm, ctx, child = rig
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
        init_line=init_line,
    )


def _suspects(folder: JobFolder):
    from scout_slurm.evidence.records import Finding

    found, errors = list_records(folder.findings_dir(0), "*.json", Finding, root=folder.root)
    assert not errors
    return [f for f in found if f.kind == FindingKind.STALL_SUSPECT]


def test_a_program_that_never_enters_init_outlives_three_startup_limits_untouched(rig, capsys):
    folder, _, _, child = rig
    script = Script([(3 * LIMIT + 1, child.kill)])
    code = _watchdog(rig, script).run()
    assert code == 128 + signal.SIGKILL  # the child's own end, not scout's 86/87
    assert not folder.stall_decision_path(0).exists() and _suspects(folder) == []
    published = read_record(folder.progress_path(0, 0), ProgressSnapshot, root=folder.root)
    assert not published.entered_init and published.idle_s == 0.0
    assert "scout:" not in capsys.readouterr().err


def test_a_rank_not_at_init_while_its_peers_wait_there_is_a_startup_hang_from_their_arrival(
    rig, capsys
):
    folder, _, _, _ = rig
    arrived = 10.0  # ranks 1 and 2 (n2) enter init_process_group
    script = Script([])
    seq = [0]

    def peers_publish() -> None:
        seq[0] += 1
        for r in (1, 2):
            write_record(
                folder.progress_path(0, r),
                ProgressSnapshot(
                    rank=r,
                    node="n2",
                    pid=3000 + r,
                    published_at=script.wall(),
                    child_state=ChildState.RUNNING,
                    coll_entered=0,
                    coll_completed=0,
                    in_collective=False,
                    current_op="none",
                    opt_steps=0,
                    pg_seq=-1,
                    idle_s=round(max(0.0, script.t - arrived), 3),
                    step_time_s=0.0,
                    publish_seq=seq[0],
                    threshold_s=LIMIT,
                    entered_init=script.t >= arrived,
                ),
            )

    def mark_step() -> None:  # what rank 1's watchdog writes on seeing its rank enter
        write_record(
            folder.rendezvous_path(0, 0),
            RendezvousMark(rank=1, node="n2", step_id=0, at=script.wall()),
        )

    peers_publish()
    script.events = sorted(
        [(round(0.5 * i, 3), peers_publish) for i in range(1, 170)] + [(arrived, mark_step)],
        key=lambda e: e[0],
    )
    code = _watchdog(rig, script).run()
    assert code == exitcodes.STALL_CULPRIT
    d = read_record(folder.stall_decision_path(0), StallDecision, root=folder.root)
    assert (
        d.culprits == (0,) and d.kind == FindingKind.HANG and d.phase == stallclock.PHASE_STARTUP
    ), d
    assert d.reasoning[0].startswith(
        "startup hang: rank(s) 0 had not entered init_process_group"
    ), d
    called = d.at - WALL0
    # the limit counted from the peers' arrival (seen within a publish interval), not from 0
    assert arrived + LIMIT < called <= arrived + CFG.publish_interval_s + LIMIT + 0.1, called
    assert all(f.at - WALL0 > arrived + LIMIT for f in _suspects(folder))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("scout:")]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "scout: job 7: rank 0 on n1 stalled first (startup hang: before init_process_group"
    )
    assert (
        f"exit code {exitcodes.STALL_CULPRIT}" in lines[0]
        and f"exit code {exitcodes.STALL_PEER}" in lines[0]
    )
    assert "scout show 7" in lines[0]


def test_a_rank_that_enters_init_marks_its_step_for_its_peers_and_says_what_is_on(rig, capsys):
    folder, shm, _, child = rig
    script = Script([(1.0, lambda: progress.mark_entering_init(shm)), (3.0, child.kill)])
    code = _watchdog(
        rig, script, init_line="scout: job 7, rank 0 entered init_process_group: (what is on)"
    ).run()
    assert code == 128 + signal.SIGKILL
    mark = read_record(folder.rendezvous_path(0, 0), RendezvousMark, root=folder.root)
    assert (mark.rank, mark.node, mark.step_id) == (0, "n1", 0) and 1.0 <= mark.at - WALL0 < 1.5
    assert not folder.rendezvous_path(0, 1).exists()  # another step of the job starts unmarked
    err = capsys.readouterr().err
    assert err.count("rank 0 entered init_process_group") == 1, err
    published = read_record(folder.progress_path(0, 0), ProgressSnapshot, root=folder.root)
    assert published.entered_init


# ---- the `scout:` line --------------------------------------------------------------------------


def test_the_line_names_the_first_rank_where_it_stood_the_codes_and_the_evidence():
    recent = (
        CollectiveEntry(seq=11, op="all_reduce", nbytes=16, group_size=4, entered_ns=1, left_ns=2),
    )
    snaps = {
        r: snap(
            r,
            entered=True,
            completed=11 if r != 3 else 11,
            steps=5,
            node=f"n{1 + r // 2}",
            in_coll=r != 3,
            op="all_reduce" if r != 3 else "none",
            recent=recent,
            state=ChildState.STOPPED if r == 3 else ChildState.RUNNING,
        )
        for r in range(4)
    }
    d = StallDecision(
        decided_by=0, at=WALL0, culprits=(3,), kind=FindingKind.HANG, reasoning=("x",)
    )
    line = stallnotice.ending_line(d, snaps, job_id=42, world_size=4)
    assert line == (
        "scout: job 42: rank 3 on n2 stalled first (hang in training: outside any collective, "
        "after all_reduce (collective #11), optimizer step 5, process stopped, idle 9.0 s); "
        f"scout ended it (exit code {exitcodes.STALL_CULPRIT}) and the step's other 3 rank(s) "
        f"(exit code {exitcodes.STALL_PEER}); see `scout show 42` for the evidence "
        "(verdict, stacks, progress)"
    )
    assert "\n" not in line


def test_the_line_when_nobody_could_be_named_says_all_were_ended():
    snaps = {r: snap(r, entered=True) for r in range(2)}
    d = StallDecision(
        decided_by=1,
        at=WALL0,
        culprits=(),
        kind=FindingKind.HANG,
        reasoning=("startup hang: ...", "1 of 2 ranks are behind: no strict majority ahead"),
        phase="startup",
    )
    line = stallnotice.ending_line(d, snaps, job_id=5, world_size=2)
    assert line.startswith(
        "scout: job 5: every rank stopped making progress (startup hang) and no rank could be named"
    )
    assert f"scout ended all 2 ranks of this step (exit code {exitcodes.STALL_PEER})" in line
    assert "no strict majority ahead" in line and "scout show 5" in line


def test_rank_0_says_what_is_on_when_it_enters_even_after_a_peer_marked_the_step(rig, capsys):
    folder, shm, _, child = rig
    peer = RendezvousMark(rank=2, node="n2", step_id=0, at=WALL0)
    script = Script(
        [
            (0.5, lambda: write_record(folder.rendezvous_path(0, 0), peer)),
            (2.0, lambda: progress.mark_entering_init(shm)),
            (4.0, child.kill),
        ]
    )
    code = _watchdog(
        rig, script, init_line="scout: job 7, rank 0 entered init_process_group: (what is on)"
    ).run()
    assert code == 128 + signal.SIGKILL
    assert (
        read_record(folder.rendezvous_path(0, 0), RendezvousMark, root=folder.root) == peer
    )  # the first word stays
    assert capsys.readouterr().err.count("rank 0 entered init_process_group") == 1


def test_a_rank_at_the_rendezvous_keeps_its_clock_one_past_init_waits_for_a_first_collective(
    tmp_path,
):
    """The first-collective rule applies past init only: a rank still inside init_process_group (its
    record marked, no writer yet) waits at the rendezvous and its clock runs from its last
    change."""
    from scout_slurm.task.watchdog import RankTracker

    path = tmp_path / "rank-0.bin"
    progress.create(path)
    progress.mark_entering_init(tmp_path)
    tracker = RankTracker(0, path, last_change=40.0)
    tracker.observe(progress.read(path), 40.0)
    assert tracker.idle_s(100.0, 10.0, None) == pytest.approx(60.0)  # at the rendezvous: as always
    w = progress.ProgressWriter(path, rank=0, world_size=2)  # init returned, no collective yet
    tracker.observe(progress.read(path), 50.0)
    assert tracker.idle_s(100.0, 10.0, None) == 0.0  # every rank may still be loading
    assert tracker.idle_s(100.0, 10.0, 90.0) == pytest.approx(
        10.0
    )  # a peer waits in a collective since 90
    seq = w.enter("barrier", 0, 2)
    tracker.observe(progress.read(path), 95.0)
    assert tracker.idle_s(100.0, 10.0, None) == pytest.approx(
        5.0
    )  # in its first collective: as always
    w.leave(seq)
    w.deactivate()
