"""The job's evidence writer (evidence/writer.py) against a real frozen mount (tests/frozenfs.py:
a FUSE mount whose daemon is stopped, so what touches it sits in D state): the caller's enqueue
returns at once, the stall is said once, only the newest record per path is held, all of it lands
after the thaw, and a process whose writer is stuck on the root still exits promptly."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import frozenfs
import pytest

from scout_slurm.evidence.records import NodeTasks
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.evidence.writer import EvidenceWriter, _Item

needs_fuse = pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs")
REPO = Path(__file__).resolve().parents[2]


class Said(list):
    def __call__(self, line: str) -> None:
        self.append(line)


def test_writes_appends_and_refusals_on_a_healthy_root(tmp_path):
    said = Said()
    w = EvidenceWriter(tmp_path, say=said)
    w.mkdir(tmp_path / "run-0" / "ranks")
    w.write(tmp_path / "run-0" / "ranks" / "rank-0.json", b'{"a": 1}')
    w.append(tmp_path / "run-0" / "ranks" / "log-0.jsonl", b"one\n")
    w.append(tmp_path / "run-0" / "ranks" / "log-0.jsonl", b"two\n")
    w.write(tmp_path / "absent" / "x.json", b"{}")  # its folder does not exist
    assert w.flush(10)
    assert (tmp_path / "run-0" / "ranks" / "rank-0.json").read_bytes() == b'{"a": 1}'
    assert (tmp_path / "run-0" / "ranks" / "log-0.jsonl").read_text() == "one\ntwo\n"
    failures = w.take_failures()
    assert [f.path for f in failures] == [str(tmp_path / "absent" / "x.json")]
    assert w.probe(tmp_path / "run-0", 5) == 0
    assert w.probe(tmp_path / "nothing-here", 5) == 2  # ENOENT: the root answered
    assert w.read(tmp_path / "run-0" / "ranks" / "rank-0.json", 5) == b'{"a": 1}'
    assert w.read(tmp_path / "nothing-here", 5) == 2
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.json").write_text("{}")
    (tmp_path / "run-0" / "planted").symlink_to(tmp_path / "elsewhere")
    inside = tmp_path / "run-0"
    refused = w.read(inside / "planted" / "x.json", 5, root=inside)  # a link below the root
    assert isinstance(refused, int) and refused != 0, refused
    assert w.read(tmp_path / "elsewhere" / "x.json", 5) == b"{}"  # the file itself is readable
    w.create_new(tmp_path / "mark.json", b"first")
    w.create_new(tmp_path / "mark.json", b"second")  # the first mark stays
    assert w.flush(10) and (tmp_path / "mark.json").read_bytes() == b"first"
    assert w.create_exclusive(tmp_path / "decision.json", b"mine", 5) is True
    assert w.create_exclusive(tmp_path / "decision.json", b"yours", 5) is False
    assert (tmp_path / "decision.json").read_bytes() == b"mine"
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for rank in (10, 2):
        write_record(
            tasks / f"rank-{rank}.json", NodeTasks(job_id=7, restart=0, node="n1", ranks=(rank,))
        )
    (tasks / "rank-5.json").write_text("{not json")
    records, errors = w.list_records(tasks, "rank-*.json", NodeTasks, root=tmp_path, timeout=5)
    assert [r.ranks for r in records] == [(2,), (10,)]  # natural order, as store.list_records
    assert len(errors) == 1 and "rank-5.json" in errors[0]
    assert w.close(5) and said == [] and w.dropped == 0


def test_a_full_queue_drops_new_paths_with_a_count_said_once(tmp_path):
    said = Said()
    w = EvidenceWriter(tmp_path, say=said, max_pending=3)
    with w._cond:  # hold the writer thread so the queue fills deterministically
        for i in range(10):
            w._put(_Item(1, str(tmp_path / f"f{i}"), bytearray(b"x"), 0o644))
    assert w.dropped == 7
    assert len([s for s in said if "drops records" in s]) == 1, said
    assert w.flush(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f0", "f1", "f2"]
    w.close(5)


@needs_fuse
@pytest.mark.slow
def test_a_frozen_root_holds_the_newest_record_per_path_and_flushes_after_the_thaw(tmp_path):
    with frozenfs.frozen_mount(tmp_path) as fs:
        root = fs.path
        said = Said()
        w = EvidenceWriter(root, say=said, stall_after_s=1.0, max_pending=8)
        (fs.source / "ranks").mkdir()
        w.write(root / "ranks" / "before.json", b"0")
        assert w.flush(10)
        fs.freeze()
        slowest = 0.0
        for i in range(200):
            t = time.monotonic()
            w.write_record(
                root / "ranks" / "tasks.json", NodeTasks(job_id=7, restart=0, node="n1", ranks=(i,))
            )
            w.write(root / "ranks" / f"many-{i % 20}.json", str(i).encode())
            slowest = max(slowest, time.monotonic() - t)
            if i == 0:
                time.sleep(2.5)  # the first write now sits in the frozen daemon
        assert slowest < 0.05, slowest  # the caller never waits on the root
        assert w.stalled and w.stall_count == 1
        stall = [s for s in said if "has not answered for" in s]
        assert len(stall) == 1 and str(root) in stall[0] and "training goes on" in stall[0]
        assert w.pending <= 8 + 1  # bounded: the newest per path, past that dropped and counted
        assert w.dropped > 0 and len([s for s in said if "drops records" in s]) == 1
        t = time.monotonic()  # a question while stalled: no answer, at once
        assert w.read(root / "ranks" / "before.json", 5) is None
        assert w.probe(root / "ranks", 5) is None and time.monotonic() - t < 0.05
        assert w.list_records(root / "ranks", "*.json", NodeTasks, root=root, timeout=5) is None
        assert w.create_exclusive(root / "ranks" / "d.json", b"x", 5) is None
        fs.thaw()
        assert w.flush(20)
        assert not w.stalled
        assert len([s for s in said if "answers again" in s]) == 1, said
        # the newest record of the path held back, not an older one
        held = read_record(fs.source / "ranks" / "tasks.json", NodeTasks)
        assert held.ranks == (199,)
        assert w.close(5)


@needs_fuse
@pytest.mark.slow
def test_a_process_whose_writer_is_stuck_on_the_root_exits_promptly(tmp_path):
    """The training process (here: a plain Python program) writes through the writer, the root
    freezes, the program ends: its exit is not held by the stuck write, its code is its own."""
    with frozenfs.frozen_mount(tmp_path) as fs:
        program = textwrap.dedent(
            f"""
            import sys, time
            sys.path.insert(0, {str(REPO)!r})
            from scout_slurm.evidence.writer import EvidenceWriter
            w = EvidenceWriter({str(fs.path)!r}, stall_after_s=1.0)
            w.write({str(fs.path / "a.json")!r}, b"1")
            assert w.flush(10)
            print("frozen?", flush=True)
            sys.stdin.readline()
            for i in range(50):
                w.write({str(fs.path / "a.json")!r}, str(i).encode())
            time.sleep(1.5)
            w.close(1.0)
            sys.exit(7)
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", program],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "frozen?", proc.stderr.read()
        fs.freeze()
        started = time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        code = proc.wait(timeout=30)
        took = time.monotonic() - started
        err = proc.stderr.read()
        assert code == 7, err
        assert took < 6.0, took  # 1.5 s of work, 1 s of close: not the freeze
        assert err.count("has not answered for") == 1, err
        assert "did not take scout's last" in err and "they are lost" in err, err
        fs.thaw()
        assert (fs.source / "a.json").read_text() == "1"  # nothing half-written in its place


def test_the_helper_stays_out_of_the_job_environment(tmp_path, monkeypatch):
    """A bootstrap on PYTHONPATH (as in the training process) does not load into the helper."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("raise SystemExit('bootstrap loaded in the helper')\n")
    monkeypatch.setenv("PYTHONPATH", os.fspath(site))
    w = EvidenceWriter(tmp_path, say=Said())
    w.write(tmp_path / "x.json", b"1")
    assert w.flush(10) and (tmp_path / "x.json").read_bytes() == b"1"
    w.close(5)


def test_a_forked_child_of_the_training_process_writes_on_its_own_thread(tmp_path):
    """A DataLoader worker forked from the training process has the writer's queue but not its
    thread: its writes are made directly (not queued for a thread that is not there)."""
    from scout_slurm.bootstrap import evidencewrites
    from scout_slurm.evidence.records import NodeTasks

    evidencewrites.start(tmp_path)
    try:
        pid = os.fork()
        if pid == 0:  # the child: its record must be on disk when it ends, without a flush
            code = 1
            try:
                record = NodeTasks(job_id=7, restart=0, node="n1", ranks=(3,))
                evidencewrites.write_record(tmp_path / "child.json", record)
                code = 0 if evidencewrites.current() is None else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert read_record(tmp_path / "child.json", NodeTasks).ranks == (3,)
        assert evidencewrites.current() is not None  # the parent keeps its writer
    finally:
        evidencewrites.close(5)
        evidencewrites._writer = None
