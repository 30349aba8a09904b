"""The real Watchdog loop, real clock, its evidence folder on a mount that stops answering
(tests/frozenfs.py): rank 0 and its two peers stop advancing together. With the root answering,
the watchdog decides the stall and ends the child (the control); with the root frozen, it cannot
see its peers, so it decides nothing, its loop goes on (it is not stuck in the root), and when the
child ends the watchdog returns the child's own code within its bound."""

from __future__ import annotations

import collections
import signal
import subprocess
import threading
import time
from pathlib import Path

import frozenfs
import pytest

from scout_slurm.config import WatchdogConfig
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import ChildState, ProgressSnapshot
from scout_slurm.evidence.store import write_record
from scout_slurm.evidence.writer import EvidenceWriter
from scout_slurm.jobenv import TaskContext
from scout_slurm.task import progress
from scout_slurm.task.shim import prepare_dirs
from scout_slurm.task.watchdog import STACK_SIGNAL, Watchdog, WatchState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs"),
]
FLOOR = 2.0
CFG = WatchdogConfig(
    stall_floor_s=FLOOR,
    poll_interval_s=0.2,
    publish_interval_s=0.5,
    steady_publish_interval_s=1.0,
    grace_s=1.0,
    startup_grace_s=300.0,
)
WORLD = 3
CTX = TaskContext(
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


@pytest.fixture(autouse=True)
def stacks_signal():
    """The record's pid is this test's process: the watchdog's stack request lands here."""
    previous = signal.signal(STACK_SIGNAL, lambda *_: None)
    yield
    signal.signal(STACK_SIGNAL, previous)


def stalled_job(tmp: Path, root: Path, said: list[str]) -> tuple[Watchdog, subprocess.Popen]:
    """Rank 0 (here) advanced once, then idle; ranks 1 and 2 published idle in a collective."""
    folder = JobFolder(root, "lab", 7)
    prepare_dirs(folder, 0)
    shm = tmp / "shm"
    shm.mkdir()
    progress.create(shm / "rank-0.bin")
    record = progress.ProgressWriter(shm / "rank-0.bin", rank=0, world_size=WORLD)
    seq = record.enter("all_reduce", 4, WORLD)
    record.leave(seq)
    record.step()
    for r in (1, 2):
        write_record(
            folder.progress_path(0, r),
            ProgressSnapshot(
                rank=r,
                node="n2",
                pid=3000 + r,
                published_at=time.time(),
                child_state=ChildState.RUNNING,
                coll_entered=3,
                coll_completed=2,
                in_collective=True,
                current_op="all_reduce",
                opt_steps=1,
                pg_seq=2,
                idle_s=30.0,
                step_time_s=0.0,
                publish_seq=1,
                threshold_s=FLOOR,
            ),
        )
    child = subprocess.Popen(["sleep", "120"])
    writer = EvidenceWriter(root, stall_after_s=1.0, say=said.append)
    watchdog = Watchdog(
        ctx=CTX,
        cfg=CFG,
        folder=folder,
        child=child,
        shm_dir=shm,
        stderr_tail=collections.deque(),
        writer=writer,
    )
    return watchdog, child


def run_in_thread(watchdog: Watchdog) -> tuple[threading.Thread, list[int]]:
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(watchdog.run()), daemon=True)
    thread.start()
    return thread, code


def test_control_the_answering_root_lets_the_watchdog_decide(tmp_path):
    said: list[str] = []
    watchdog, child = stalled_job(tmp_path, tmp_path / "evidence", said)
    try:
        thread, code = run_in_thread(watchdog)
        thread.join(40)
        assert not thread.is_alive() and watchdog.state == WatchState.DONE
        assert (
            (tmp_path / "evidence" / "lab" / "7" / "run-0" / "progress")
            .joinpath("stall-decision.json")
            .is_file()
        )
        assert child.poll() is not None  # ended by scout
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_frozen_root_means_no_decision_a_live_loop_and_a_prompt_exit(tmp_path):
    said: list[str] = []
    with frozenfs.frozen_mount(tmp_path) as fs:
        (fs.source / "evidence").mkdir()
        watchdog, child = stalled_job(tmp_path, fs.path / "evidence", said)
        try:
            fs.freeze()
            thread, code = run_in_thread(watchdog)
            time.sleep(15)  # past the threshold, the window and the look bounds several times
            assert thread.is_alive() and child.poll() is None  # nothing decided, nothing ended
            # the loop is alive: it still reads this rank's shared-memory record
            before = watchdog.trackers[0].view.pid if watchdog.trackers[0].view else -1
            assert before > 0
            child.kill()
            ended = time.monotonic()
            thread.join(20)
            assert not thread.is_alive(), "the watchdog is stuck"
            assert time.monotonic() - ended < 3.0, time.monotonic() - ended
            assert code == [128 + 9]  # the child's own end (SIGKILL), not scout's stall code
            assert [s for s in said if "has not answered for" in s], said
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
            fs.thaw()
            watchdog.writer.close(5)
