"""torchrun's workers share their task's stderr: each worker's own lines ("[rankN]:", as torch
prefixes a rank's uncaught exception) are kept apart, so that a worker that failed on a peer's
broken connection reads as a cascade. Lines recorded from a real run: the Hugging Face Trainer
under torchrun, 2 nodes x 2 workers, rank 2 exiting with code 3 (job 23341 of the lab)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from scout_slurm.bootstrap.agent import AgentRecord, Attempt, WorkerExit
from scout_slurm.config import WatchdogConfig
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import ExitRecord
from scout_slurm.jobenv import TaskContext
from scout_slurm.localise.verdict import is_cascade
from scout_slurm.task.stderrtail import StderrTail
from scout_slurm.task.watchdog import Watchdog

RECORDED = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/work/main/tests/jobs/train_hf.py", line 63, in <module>',
    "[rank0]: Traceback (most recent call last):",
    "[rank1]:     work.wait()",
    "[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553]"
    " Connection closed by peer [127.0.0.1]:9143. This is typically caused by a remote worker "
    "crashing. Check the logs of the remote worker before reporting an error.",
    '[rank0]:   File "/work/main/tests/jobs/train_hf.py", line 57, in main',
    "[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537]"
    " Read error [127.0.0.1]:64720: Connection reset by peer. This is typically caused by a remote "
    "worker hanging or bugs in the application.",
    "W1206 03:22:08.092000 4642 torch/distributed/elastic/multiprocessing/api.py:1028] Sending "
    "process 4692 closing signal SIGTERM",
] + [f"torchrun summary line {i}" for i in range(60)]  # the shared tail's 40 lines lose them


def _record(rank: int, tail: tuple[str, ...]) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node="n1",
        pid=100 + rank,
        exit_code=1,
        signal=0,
        core_dumped=False,
        at=0.0,
        killed_by_scout=False,
        last_progress=None,
        stderr_tail=tail,
    )


def test_each_workers_lines_are_kept_apart_and_read_as_a_cascade():
    tail = StderrTail(per_rank=True)
    for line in RECORDED:
        tail.feed(line)
    assert not any("Connection" in line for line in tail)  # gone from the shared 40 lines
    for rank in (0, 1):
        own = tail.of_rank(rank)
        assert own and all(line.startswith(f"[rank{rank}]:") for line in own), own
        assert is_cascade(_record(rank, own)), own
    assert tail.of_rank(2) == ()
    assert not is_cascade(_record(2, tail.of_rank(2)))  # nothing of its own: failed on its own


def test_ranks_kept_apart_are_bounded():
    tail = StderrTail(maxlen=5, per_rank=True)
    for rank in range(200):
        for i in range(10):
            tail.feed(f"[rank{rank}]: line {i}")
    assert len(tail.by_rank) == 64 and all(len(d) == 5 for d in tail.by_rank.values())


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "torchrun"


def _exits_of_task(tmp_path: Path, stream: str, workers: tuple[WorkerExit, ...]) -> dict:
    """The exit records a torchrun task's watchdog writes for its workers, from that task's
    recorded output (lines of a real lab run: the HF Trainer under torchrun, 2 nodes x 2
    workers, rank 2 exiting with code 3 at step 5) and torchrun's record of how each ended."""
    tail = StderrTail(40, per_rank=True)
    for line in (FIXTURES / stream).read_text().splitlines():
        tail.feed(line)
    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    child = subprocess.Popen(["true"])
    child.wait()
    ctx = TaskContext(
        job_id=7,
        step_id=0,
        rank=0,
        world_size=2,
        local_rank=0,
        node_index=0,
        node="n1",
        step_nodelist="n[1-2]",
        tasks_per_node="1(x2)",
        cluster="lab",
        restart=0,
        cuda_visible_devices="",
    )
    wd = Watchdog(
        ctx=ctx,
        cfg=WatchdogConfig(),
        folder=folder,
        child=child,
        shm_dir=tmp_path,  # no agent record there: the one set below is read
        stderr_tail=tail,
        torchrun=True,
    )
    wd.agent = AgentRecord(max_restarts=0, attempts=(Attempt(0, "failed", workers),))
    return {e.rank: e for e in wd._worker_exits(256, killed_by_scout=False, snaps={})}


def test_a_lone_failing_worker_with_a_broken_connection_is_a_cascade(tmp_path):
    """n1's task: rank 1 exited with code 1 on gloo's broken connection, then torchrun stopped
    rank 0. Rank 1 is its task's lone failing worker: its record holds its own lines (with
    torchrun's summary after them), so it reads as a cascade; torchrun's ChildFailedError is
    not its exception (CI once named rank 1 when its record held torchrun's summary alone)."""
    exits = _exits_of_task(
        tmp_path,
        "hf-exit3-task-n1.txt",
        (WorkerExit(0, 0, 19243, None, 15), WorkerExit(1, 1, 19246, 1, 0)),
    )
    one = exits[1]
    assert is_cascade(one) and "Connection closed by peer" in one.exception, one
    assert any(line.startswith("[rank1]:") for line in one.stderr_tail)
    assert not any(line.startswith("[rank0]:") for line in one.stderr_tail)
    assert is_cascade(exits[0]) and exits[0].signal == 15


def test_the_worker_that_failed_first_is_not_a_cascade_whatever_its_neighbour_printed(tmp_path):
    """n2's task: rank 2 exited with code 3 (no traceback: os._exit), torchrun stopped rank 3,
    whose own lines show the broken connection. Rank 2's record holds none of rank 3's lines
    and no exception of torchrun's: it failed on its own."""
    exits = _exits_of_task(
        tmp_path,
        "hf-exit3-task-n2.txt",
        (WorkerExit(2, 0, 19244, 3, 0), WorkerExit(3, 1, 19247, None, 15)),
    )
    two = exits[2]
    assert not is_cascade(two) and two.exit_code == 3 and two.exception == "", two
    assert not any(line.startswith("[rank3]:") for line in two.stderr_tail), two.stderr_tail
    assert any(re.search(r"exitcode\s*: 3 ", line) for line in two.stderr_tail), two.stderr_tail
    assert is_cascade(exits[3])


def test_exceptions_are_read_per_rank_when_tracebacks_interleave():
    tail = StderrTail(per_rank=True)
    for line in RECORDED:
        tail.feed(line)
    (one,) = tail.exceptions_of(1)
    (zero,) = tail.exceptions_of(0)
    assert "Connection closed by peer" in one.line and "Connection reset by peer" in zero.line
    assert one.raised_at.endswith("train_hf.py:63 in <module>")
    assert zero.raised_at.endswith("train_hf.py:57 in main")
    assert tail.exceptions_of(None) == () and len(tail.unprefixed) == 40


def test_a_task_that_is_one_rank_reads_each_line_once():
    """Without torchrun the task's rank is its process: nothing is kept apart."""
    tail = StderrTail()
    for line in RECORDED:
        tail.feed(line)
    assert tail.by_rank == {} and len(tail.unprefixed) == 0 and tail.exceptions_of(1) == ()
