"""Kinds from the strongest evidence (issue 19): a rank the watchdogs named because its peers
waited for it is a crash, not a hang, when its exit record says it died on its own (a signal, a
non-zero code) or when it printed an exception and sat idle, alive, afterwards (a non-daemon
thread keeps the interpreter up); the verdict says the signal or the exception. A hang stays a
hang; ranks scout ended, and peers' failures, are not crashes. The exit records come from the
real watchdog too, driven by a scripted clock, with the real shim's stderr tail."""

from __future__ import annotations

import dataclasses
import signal as signals
import subprocess
import sys

import pytest

from scout_slurm.evidence.gather import gather_evidence
from scout_slurm.evidence.records import (
    ChildState,
    ExitRecord,
    FindingKind,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    VerdictKind,
)
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.localise.verdict import JobEvidence, localise
from scout_slurm.task import exitcodes

NOW = 1_700_000_500.0
GLOO_PEER = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[10.0.0.12]:36411"
)
RAISED = "RuntimeError: scout injected exception at step 5"
OOM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: "
    "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
)


def snap(
    rank: int, completed: int = 30, *, entered: int | None = None, state=ChildState.RUNNING
) -> ProgressSnapshot:
    entered = completed + 1 if entered is None else entered
    return ProgressSnapshot(
        rank=rank,
        node=f"n{rank // 2 + 1}",
        pid=2000 + rank,
        published_at=NOW - 10,
        child_state=state,
        coll_entered=entered,
        coll_completed=completed,
        in_collective=entered > completed,
        current_op="all_reduce",
        opt_steps=completed // 2,
        pg_seq=completed,
        idle_s=40.0,
        step_time_s=0.1,
    )


def place(rank: int) -> RankPlace:
    return RankPlace(
        job_id=77,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=4,
        node=f"n{rank // 2 + 1}",
        hostname="h",
        task_pid=100 + rank,
        child_pid=200 + rank,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="",
        master_addr="",
        master_port=12345,
        started_at=NOW - 600,
    )


def exit_record(
    rank: int,
    code: int = 0,
    *,
    signal: int = 0,
    by_scout: bool = False,
    external: bool = False,
    progress: ProgressSnapshot | None = None,
    tail: tuple[str, ...] = (),
    exception: str = "",
    exception_position: int = -1,
    at: float = NOW - 5,
) -> ExitRecord:
    # as the watchdog writes them: exit_code -1 when a signal ended the child
    return ExitRecord(
        rank=rank,
        node=f"n{rank // 2 + 1}",
        pid=2000 + rank,
        exit_code=-1 if signal else code,
        signal=signal,
        core_dumped=False,
        at=at,
        killed_by_scout=by_scout,
        last_progress=progress,
        stderr_tail=tail,
        external_termination=external,
        exception=exception,
        exception_position=exception_position,
    )


def behind(rank: int) -> StallDecision:
    return StallDecision(
        decided_by=0,
        at=NOW - 30,
        culprits=(rank,),
        kind=FindingKind.HANG,
        reasoning=(f"rank {rank} on n1: 30 collectives done, outside any collective",),
    )


def job(exits, decision=None) -> JobEvidence:
    return JobEvidence(
        job_id=77,
        restart=0,
        world_size=4,
        places={r: place(r) for r in range(4)},
        exits={e.rank: e for e in exits},
        decision=decision,
        job_exit_code=256,
    )


def ended_by_scout(rank: int, position: int = 31) -> ExitRecord:
    """A healthy peer, waiting in collective 31 when scout ended the step (SIGTERM, then
    SIGKILL).
    """
    return exit_record(rank, signal=9, by_scout=True, progress=snap(rank, 30, entered=31))


# --- the stall path: the watchdogs named a rank; its own evidence says what it was ----------------


def test_a_named_rank_killed_by_sigkill_is_a_crash_with_the_signal():
    peers = [ended_by_scout(r) for r in (0, 1, 2)]
    killed = exit_record(3, signal=9, progress=snap(3, 30, entered=30), at=NOW - 42)
    v = localise(job([*peers, killed], behind(3)), now=NOW)
    assert v.kind == VerdictKind.CRASH
    assert [(s.rank, s.kind) for s in v.suspects] == [(3, VerdictKind.CRASH)]
    assert "rank 3 killed by SIGKILL" in v.suspects[0].evidence
    assert any("killed by SIGKILL" in line and "not a hang" in line for line in v.reasoning)
    assert v.first_failure_at == NOW - 42  # when it died, not when its peers gave up waiting


def test_a_rank_that_raised_and_sat_idle_is_a_crash_with_the_exception():
    # its main thread raised after collective 30; a non-daemon thread kept it alive until scout
    # ended it (SIGTERM: exit -1, signal 15, killed by scout); the last stderr line is a warning
    last = snap(1, 30, entered=30)
    raised = exit_record(
        1,
        signal=15,
        by_scout=True,
        progress=last,
        exception=RAISED,
        exception_position=60,
        tail=(
            "Traceback (most recent call last):",
            RAISED,
            "/w/train.py:30: FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated",
        ),
    )
    v = localise(job([raised, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.CRASH and [s.rank for s in v.suspects] == [1]
    ev = v.suspects[0].evidence
    assert f"exception: {RAISED}" in ev and f"rank 1 raised {RAISED}" in ev
    assert not any("FutureWarning" in line for line in ev)
    assert any("stayed alive without progress" in line and "scout ended it" in line for line in ev)
    assert v.suspects[0].confidence == pytest.approx(0.95)


def test_an_exception_survived_before_the_stall_leaves_a_hang():
    # printed at position 40, the rank went on to 60 and then stopped: the traceback is not why
    hung = exit_record(
        1,
        signal=15,
        by_scout=True,
        progress=snap(1, 30, entered=30),
        exception=RAISED,
        exception_position=40,
    )
    v = localise(job([hung, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.HANG and v.suspects[0].kind == VerdictKind.HANG


@pytest.mark.parametrize(
    "exception,position",
    [(GLOO_PEER, 60), (RAISED, -1), ("", -1)],
    ids=["peer-failure", "position-unknown", "no-exception"],
)
def test_no_own_exception_leaves_a_hang(exception, position):
    hung = exit_record(
        1,
        signal=15,
        by_scout=True,
        progress=snap(1, 30, entered=30),
        exception=exception,
        exception_position=position,
    )
    v = localise(job([hung, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.HANG and v.suspects[0].kind == VerdictKind.HANG


@pytest.mark.parametrize(
    "code", [exitcodes.SDC_CULPRIT, exitcodes.RESUME_MISMATCH, exitcodes.STRAGGLER_ENDED]
)
def test_a_rank_scout_ended_is_not_a_crash_of_its_own(code):
    ended = exit_record(1, code, progress=snap(1, 30, entered=30))
    v = localise(job([ended, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.HANG


def test_a_hang_with_no_exit_record_stays_a_hang():
    v = localise(job([], behind(2)), now=NOW)
    assert v.kind == VerdictKind.HANG and [s.rank for s in v.suspects] == [2]


def test_a_desync_stays_a_desync_whatever_the_culprit_printed():
    odd = exit_record(
        3, 1, progress=snap(3, 30), exception="RuntimeError: size mismatch", exception_position=61
    )
    d = dataclasses.replace(behind(3), kind=FindingKind.DESYNC)
    v = localise(job([odd, *(ended_by_scout(r) for r in (0, 1, 2))], d), now=NOW)
    assert v.kind == VerdictKind.HANG


def test_one_crashed_and_one_hung_culprit_keep_their_own_kinds():
    crashed = exit_record(1, signal=11, progress=snap(1, 30, entered=30))
    hung = exit_record(2, signal=15, by_scout=True, progress=snap(2, 30, entered=30))
    d = dataclasses.replace(behind(1), culprits=(1, 2))
    v = localise(job([ended_by_scout(0), crashed, hung, ended_by_scout(3)], d), now=NOW)
    assert [(s.rank, s.kind) for s in v.suspects] == [(1, VerdictKind.CRASH), (2, VerdictKind.HANG)]
    assert v.kind == VerdictKind.HANG  # a rank alive and not advancing is among them


def test_a_rank_still_ending_after_it_left_training_is_a_crash():
    # sys.exit(3) mid-training: the interpreter closed the progress record at exit (outside any
    # collective, behind its peers) and spun in teardown past the stall threshold; scout ended it
    closed = dataclasses.replace(snap(1, 14, entered=14), bootstrap_active=False)
    ending = exit_record(
        1,
        signal=15,
        by_scout=True,
        progress=closed,
        tail=("scout: injecting fault exit on rank 1",),
    )
    v = localise(job([ending, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.CRASH and [s.rank for s in v.suspects] == [1]
    assert any("left training while its peers waited" in line for line in v.suspects[0].evidence)


def test_a_rank_with_an_open_record_killed_by_scout_is_a_hang():
    hung = exit_record(1, signal=9, by_scout=True, progress=snap(1, 14, entered=14))
    v = localise(job([hung, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.HANG


def test_a_rank_that_exited_cleanly_while_its_peers_waited_is_not_called_a_crash():
    early = exit_record(
        1,
        0,
        progress=dataclasses.replace(
            snap(1, 14, entered=14), bootstrap_active=False, child_state=ChildState.EXITED
        ),
    )
    v = localise(job([early, *(ended_by_scout(r) for r in (0, 2, 3))], behind(1)), now=NOW)
    assert v.kind == VerdictKind.HANG


# --- the exits path: the exception line, not the last stderr line ------------------------------


def test_a_crash_says_its_exception_even_when_stderr_ended_with_a_warning():
    tail = (
        f"[rank2]: {OOM}",
        "/usr/lib/python3/site-packages/x.py:9: FutureWarning: deprecated",
        "  warnings.warn(",
    )
    oom = exit_record(2, 1, progress=snap(2, 30), tail=tail, exception=OOM, exception_position=61)
    peers = [
        exit_record(
            r, 1, progress=snap(r, 31), tail=("Traceback (most recent call last):", GLOO_PEER)
        )
        for r in (0, 1, 3)
    ]
    v = localise(job([*peers, oom]), now=NOW)
    assert v.kind == VerdictKind.CRASH and [s.rank for s in v.suspects] == [2]
    assert "rank 2 exited with code 1" in v.suspects[0].evidence
    assert f"exception: {OOM}" in v.suspects[0].evidence
    assert any(
        "DefaultCPUAllocator: can't allocate memory" in line and "on its own" in line
        for line in v.reasoning
    )


def test_peers_sigkilled_by_scout_or_slurm_at_the_end_are_not_suspects():
    killed = exit_record(0, signal=9, progress=snap(0, 30))
    late = [
        exit_record(1, signal=9, by_scout=True, progress=snap(1, 31)),
        exit_record(2, signal=9, external=True, progress=snap(2, 31)),
        exit_record(3, 1, progress=snap(3, 31), tail=(GLOO_PEER,)),
    ]
    v = localise(job([killed, *late]), now=NOW)
    assert v.kind == VerdictKind.CRASH and [s.rank for s in v.suspects] == [0]
    assert "rank 0 killed by SIGKILL" in v.suspects[0].evidence


# --- the real watchdog writes the record the localiser reads -------------------------------------

FLOOR = 4.0


from unit.test_watchdog_window import Script  # noqa: E402 - the same scripted clock as the watchdog's own tests


def publish_peers(folder, script: Script, position: int, seq: list[int]) -> None:
    """Ranks 1 and 2 on n2, waiting inside the next collective since t = 0, their watchdog
    publishing.
    """
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
                coll_entered=position + 1,
                coll_completed=position,
                in_collective=True,
                current_op="all_reduce",
                opt_steps=position // 2,
                pg_seq=position,
                idle_s=script.t,
                step_time_s=0.0,
                publish_seq=seq[0],
                threshold_s=FLOOR,
            ),
        )


def test_watchdog_records_the_exception_dumps_stacks_before_the_kill_and_the_verdict_is_a_crash(
    tmp_path,
):
    """Rank 0's training process (here: this test's process, through its progress record) printed a
    real traceback after its last collective and then sat idle; peers 1 and 2 wait in the next
    collective. The watchdog calls the stall, reads the process from /proc when no Python dump
    came (no bootstrap here), before it signals anything, and writes the exception into the exit
    record; the localiser, reading the folder, calls it a crash with the exception."""
    from scout_slurm.config import WatchdogConfig
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.jobenv import TaskContext
    from scout_slurm.task import progress
    from scout_slurm.task.shim import _position, prepare_dirs
    from scout_slurm.task.stderrtail import StderrTail
    from scout_slurm.task.watchdog import Watchdog

    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    prepare_dirs(folder, 0)
    shm = tmp_path / "shm"
    shm.mkdir()
    record = shm / "rank-0.bin"
    progress.create(record)
    writer = progress.ProgressWriter(record, rank=0, world_size=3)
    ctx = TaskContext(
        job_id=7,
        step_id=0,
        rank=0,
        world_size=3,
        local_rank=0,
        node_index=0,
        node="n1",
        step_nodelist="n[1-2]",
        tasks_per_node="1,2",
        cluster="lab",
        restart=0,
        cuda_visible_devices="",
    )
    real = subprocess.run(
        [sys.executable, "-c", "raise MemoryError('cannot allocate the activations')"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stderr.splitlines()
    tail = StderrTail(40, position=lambda: _position(record))
    for _ in range(2):  # two collectives and steps done, then the exception
        seq = writer.enter("all_reduce", 4, 3)
        writer.leave(seq)
        writer.step()
    for line in real + ["/w/t.py:3: FutureWarning: deprecated"]:
        tail.feed(line)
    tail.end()
    script = Script([])
    count = [0]
    publish_peers(folder, script, 4, count)
    script.events = [
        (round(0.5 * i, 3), lambda: publish_peers(folder, script, 4, count)) for i in range(1, 100)
    ]
    child = subprocess.Popen(["sleep", "120"])
    order: list[str] = []
    previous = signals.signal(signals.SIGRTMIN + 5, lambda *_: order.append("stack signal"))
    try:
        cfg = WatchdogConfig(
            stall_floor_s=FLOOR,
            poll_interval_s=0.2,
            publish_interval_s=0.5,
            steady_publish_interval_s=2.0,
            grace_s=1.0,
            startup_grace_s=300.0,
        )
        wd = Watchdog(
            ctx=ctx,
            cfg=cfg,
            folder=folder,
            child=child,
            shm_dir=shm,
            stderr_tail=tail,
            clock=script.clock,
            wall=script.wall,
            sleep=script.sleep,
        )
        escalate = wd._escalate

        def escalate_after_stacks() -> int:
            order.append(f"kill, stacks file {folder.stacks_path(0, 0).stat().st_size} bytes")
            return escalate()

        wd._escalate = escalate_after_stacks
        assert wd.run() == exitcodes.STALL_CULPRIT
    finally:
        signals.signal(signals.SIGRTMIN + 5, previous)
        if child.poll() is None:
            child.kill()  # the sleep this test started
            child.wait()
    assert (
        order[0] == "stack signal"
        and order[-1].startswith("kill")
        and not order[-1].endswith(" 0 bytes")
    ), order
    stacks = folder.stacks_path(0, 0).read_text()
    assert "no Python stack dump within 1 s of the stack signal" in stacks and "state " in stacks, (
        stacks
    )
    e = read_record(folder.rank_exit_path(0, 0), ExitRecord, root=folder.root)
    assert (
        e.exception == "MemoryError: cannot allocate the activations" and e.exception_position == 4
    )
    assert e.killed_by_scout and e.stderr_tail[-1].endswith("FutureWarning: deprecated")
    v = localise(gather_evidence(folder, 0, job_exit_code=256, world_size=3), now=NOW)
    assert v.kind == VerdictKind.CRASH and [s.rank for s in v.suspects] == [0], v
    assert "exception: MemoryError: cannot allocate the activations" in v.suspects[0].evidence
