"""The shared-memory progress record: what the writer puts in, a reader gets out, consistent
even while another thread writes."""

from __future__ import annotations

import os
import struct
import sys
import threading

import pytest

from scout_slurm.task.progress import RING, SIZE, ProgressWriter, create, read


@pytest.fixture()
def record(tmp_path):
    path = tmp_path / "rank-3.bin"
    create(path)
    return path


def test_fresh_record_reads_as_empty(record):
    v = read(record)
    assert v is not None
    assert (v.coll_entered, v.coll_completed, v.opt_steps, v.pg_seq) == (0, 0, 0, -1)
    assert not v.in_collective and v.current_op == "none" and v.recent == ()
    assert v.rank == -1 and not v.active
    assert os.stat(record).st_size == SIZE
    assert os.stat(record).st_mode & 0o777 == 0o600


def test_round_trip(record):
    w = ProgressWriter(record, rank=3, world_size=8)
    seq = w.enter("all_reduce", 4096, 8, pg_seq=17)
    v = read(record)
    assert v.pid == os.getpid() and v.rank == 3 and v.world_size == 8 and v.active
    assert v.coll_entered == 1 and v.coll_completed == 0
    assert v.in_collective and v.current_op == "all_reduce" and v.current_nbytes == 4096
    assert v.pg_seq == 17
    assert v.last_change_ns > 0
    (e,) = v.recent
    assert (e.seq, e.op, e.nbytes, e.group_size, e.left_ns) == (seq, "all_reduce", 4096, 8, 0)
    assert e.entered_ns > 0

    w.leave(seq)
    v = read(record)
    assert v.coll_completed == 1 and not v.in_collective and v.current_op == "none"
    (e,) = v.recent
    assert e.left_ns >= e.entered_ns > 0
    assert v.position == (1, 1, 0)


def test_unknown_op_is_other(record):
    w = ProgressWriter(record, rank=0, world_size=2)
    w.enter("my_custom_collective", 8, 2)
    assert read(record).current_op == "other"
    assert read(record).recent[0].op == "other"


def test_nested_collectives_stay_inside_until_the_last_leaves(record):
    w = ProgressWriter(record, rank=0, world_size=2)
    a = w.enter("all_reduce", 8, 2)
    b = w.enter("broadcast", 16, 2)
    w.leave(b)
    v = read(record)
    assert v.in_collective and v.coll_entered == 2 and v.coll_completed == 1
    w.leave(a)
    assert not read(record).in_collective


def test_ring_keeps_the_last_entries_in_seq_order(record):
    w = ProgressWriter(record, rank=1, world_size=2)
    for i in range(RING + 37):
        w.leave(w.enter("broadcast" if i % 2 else "all_reduce", i, 2))
    v = read(record)
    assert len(v.recent) == RING == 64
    assert [e.seq for e in v.recent] == list(range(38, RING + 38))
    assert all(e.left_ns >= e.entered_ns for e in v.recent)
    assert v.recent[-1].nbytes == RING + 36


def test_step_counter(record):
    w = ProgressWriter(record, rank=0, world_size=1)
    assert [w.step() for _ in range(3)] == [1, 2, 3]
    assert w.steps == 3
    v = read(record)
    assert v.opt_steps == 3 and v.last_step_ns > 0


def test_a_second_writer_continues_the_counters(record):
    # the bootstrap may open the record again (fork, re-exec): counters are not reset
    w = ProgressWriter(record, rank=0, world_size=1)
    w.leave(w.enter("all_reduce", 8, 1))
    w.step()
    w2 = ProgressWriter(record, rank=0, world_size=1)
    w2.enter("all_reduce", 8, 1)
    v = read(record)
    assert v.coll_entered == 2 and v.coll_completed == 1 and v.opt_steps == 1


def test_set_pg_seq(record):
    w = ProgressWriter(record, rank=0, world_size=1)
    w.set_pg_seq(41)
    assert read(record).pg_seq == 41


def test_deactivate(record):
    w = ProgressWriter(record, rank=0, world_size=1)
    assert read(record).active
    w.deactivate()
    v = read(record)
    assert not v.active and v.rank == 0


def test_reader_of_a_non_record_gets_none(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00" * SIZE)
    assert read(junk) is None
    short = tmp_path / "short.bin"
    short.write_bytes(b"SCPR")
    assert read(short) is None
    assert read(tmp_path / "absent.bin") is None
    assert read(tmp_path) is None  # a directory


def test_writer_refuses_a_non_record(tmp_path):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x01" * SIZE)
    with pytest.raises(ValueError, match="not a scout progress record"):
        ProgressWriter(junk, rank=0, world_size=1)


def test_reader_gives_up_on_a_record_stuck_mid_write(record):
    with open(record, "r+b") as fh:
        fh.seek(8)
        fh.write(struct.pack("<Q", 7))  # odd generation: a writer died mid-write
    assert read(record, retries=3) is None


def test_create_refuses_a_planted_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("keep")
    link = tmp_path / "rank-0.bin"
    link.symlink_to(target)
    with pytest.raises(OSError):
        create(link)
    assert target.read_text() == "keep"


def test_reads_are_consistent_while_another_thread_writes(record):
    w = ProgressWriter(record, rank=0, world_size=4)
    stop = threading.Event()

    def op_of(seq: int) -> str:
        return "broadcast" if seq % 3 == 0 else "all_reduce"

    def hammer():
        # each collective's size is its own seq: a reader can tell a whole ring entry from a torn
        # one
        n = 0
        while not stop.is_set():
            n += 1
            seq = w.enter(op_of(n), n, 4)
            w.leave(seq)
            if seq % 50 == 0:
                w.step()

    writer = threading.Thread(target=hammer, daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often: more interleavings, and a fast test
    writer.start()
    bad: list[str] = []
    seen = 0
    try:
        for _ in range(10_000):
            v = read(record)
            if v is None:
                continue  # the reader gave up retrying: allowed, but never a torn view
            seen += 1
            if v.coll_completed > v.coll_entered:
                bad.append(f"completed {v.coll_completed} > entered {v.coll_entered}")
            if not v.coll_entered - 1 <= v.coll_completed:
                bad.append(
                    f"completed {v.coll_completed} lags entered {v.coll_entered} by more than one"
                )
            seqs = [e.seq for e in v.recent]
            if seqs != sorted(set(seqs)):
                bad.append(f"ring seqs not ascending: {seqs}")
            if seqs != list(range(max(1, v.coll_entered - RING + 1), v.coll_entered + 1)):
                bad.append(
                    f"ring {seqs[:1]}..{seqs[-1:]} is not the last {RING} of {v.coll_entered} "
                    "entered"
                )
            torn = [
                e
                for e in v.recent
                if e.nbytes != e.seq
                or e.op != op_of(e.seq)
                or (e.left_ns and e.left_ns < e.entered_ns)
            ]
            if torn:
                bad.append(f"torn ring entries: {torn[:2]}")
    finally:
        stop.set()
        writer.join(timeout=5)
        sys.setswitchinterval(switch)
    assert not bad, bad[:5]
    assert seen > 9_000
    assert read(record).coll_entered > 0


def test_leave_many_is_one_change_for_several_collectives(record):
    """DDP's buckets are left together at the end of their backward: only the entries named
    change.
    """
    w = ProgressWriter(record, rank=3, world_size=8)
    seqs = [w.enter("ddp_bucket_all_reduce", 1024 * (i + 1), 8) for i in range(3)]
    w.leave_many([seqs[0], seqs[2]])
    v = read(record)
    assert (v.coll_entered, v.coll_completed, v.in_collective) == (3, 2, True)
    left = {e.seq: e.left_ns for e in v.recent}
    assert left[seqs[0]] > 0 and left[seqs[2]] > 0 and left[seqs[1]] == 0
    w.leave_many([seqs[1]])
    v = read(record)
    assert (v.coll_completed, v.in_collective, v.current_op) == (3, False, "none")
