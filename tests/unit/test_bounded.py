"""The bounded child runner (hooks/bounded.py): results and reports come back as JSON, a child
past its deadline is killed, and one that cannot die (D state on a hung mount) is abandoned
without the parent waiting for it."""

from __future__ import annotations

import os
import time

import frozenfs
import pytest

from scout_slurm.hooks import bounded
from scout_slurm.hooks.bounded import DONE, FAILED, TIMED_OUT, run_bounded


def test_a_quick_child_returns_its_result_and_reports():
    def work(report):
        report(stage="one", n=1)
        report(stage="two")
        return {"answer": 42, "pid": os.getpid()}

    out = run_bounded(work, 10.0, name="quick")
    assert out.status == DONE and out.done
    assert out.result["answer"] == 42 and out.result["pid"] != os.getpid()
    assert out.last("stage") == "two" and out.last("n") == 1 and out.last("missing", 7) == 7


def test_a_child_that_raises_is_failed_with_its_error():
    def work(report):
        report(stage="before")
        raise ValueError("no such thing")

    out = run_bounded(work, 10.0, name="raises")
    assert out.status == FAILED and "ValueError: no such thing" in out.error
    assert out.last("stage") == "before" and out.result is None


def test_a_child_that_dies_is_failed():
    out = run_bounded(lambda report: os._exit(3), 10.0, name="dies")
    assert out.status == FAILED and "status 3" in out.error


def test_the_childs_stderr_reaches_the_hooks_stderr(capfd):
    def work(report):
        import sys

        sys.stderr.write("a line from the child\n")

    assert run_bounded(work, 10.0, name="talks").done
    assert "a line from the child" in capfd.readouterr().err


def test_a_sleeping_child_is_killed_at_its_deadline_and_reaped():
    started = time.monotonic()
    out = run_bounded(lambda report: (report(stage="sleeping"), time.sleep(60)), 0.5, name="sleeps")
    took = time.monotonic() - started
    assert out.status == TIMED_OUT and not out.abandoned
    assert out.last("stage") == "sleeping"
    assert took < 0.5 + bounded.REAP_GRACE_S + 0.5, took


def test_a_child_blocked_reading_a_fifo_nobody_writes_is_cut_off(tmp_path):
    """A FIFO with no writer blocks its reader's open(), like a read on a hung file system."""
    fifo = tmp_path / "hung"
    os.mkfifo(fifo)
    started = time.monotonic()
    out = run_bounded(lambda report: fifo.read_bytes().decode(), 1.0, name="fifo")
    assert out.status == TIMED_OUT
    assert time.monotonic() - started < 1.0 + bounded.REAP_GRACE_S + 0.5


def test_the_margin_is_a_tenth_of_a_small_budget_and_at_most_three_seconds():
    assert bounded.margin_s(60.0) == 3.0
    assert bounded.margin_s(20.0) == 2.0
    assert bounded.margin_s(1.0) == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs")
def test_a_child_in_d_state_on_a_frozen_mount_is_abandoned_not_waited_for(tmp_path):
    with frozenfs.frozen_mount(tmp_path) as fs:
        (fs.source / "record.json").write_text("{}")
        fs.freeze()
        started = time.monotonic()
        out = run_bounded(
            lambda report: (fs.path / "record.json").read_text(), 1.0, name="frozen read"
        )
        took = time.monotonic() - started
        assert out.status == TIMED_OUT and out.abandoned, out
        assert out.state.startswith("D"), out.state  # SIGKILL could not end it
        assert took < 1.0 + bounded.REAP_GRACE_S + 0.5, took
        assert bounded.reap_abandoned() >= 1
        fs.thaw()
        end = time.monotonic() + 10
        while bounded.reap_abandoned() and time.monotonic() < end:
            time.sleep(0.05)
        assert bounded.reap_abandoned() == 0  # the kill took effect once the I/O returned


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def test_a_child_killed_at_its_deadline_takes_its_own_bounded_children_with_it():
    """The Epilog's child runs the root checks in bounded children of its own: killing it must
    not leave a self-test running without anyone to cut it off."""

    def outer(report):
        inner = bounded.BoundedChild(lambda r: time.sleep(60), name="grandchild")
        report(grandchild=inner.pid)
        inner.wait(60.0)

    out = run_bounded(outer, 1.0, name="outer")
    assert out.status == TIMED_OUT
    grandchild = out.last("grandchild")
    end = time.monotonic() + 5
    while not _gone(grandchild) and time.monotonic() < end:
        time.sleep(0.05)
    assert _gone(grandchild)
