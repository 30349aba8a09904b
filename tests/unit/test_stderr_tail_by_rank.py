"""torchrun's workers share their task's stderr: each worker's own lines ("[rankN]:", as torch
prefixes a rank's uncaught exception) are kept apart, so that a worker that failed on a peer's
broken connection reads as a cascade. Lines recorded from a real run: the Hugging Face Trainer
under torchrun, 2 nodes x 2 workers, rank 2 exiting with code 3 (job 23341 of the lab)."""

from __future__ import annotations

from scout_slurm.evidence.records import ExitRecord
from scout_slurm.localise.verdict import is_cascade
from scout_slurm.task.stderrtail import StderrTail

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
    tail = StderrTail()
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
    tail = StderrTail(maxlen=5)
    for rank in range(200):
        for i in range(10):
            tail.feed(f"[rank{rank}]: line {i}")
    assert len(tail.by_rank) == 64 and all(len(d) == 5 for d in tail.by_rank.values())
