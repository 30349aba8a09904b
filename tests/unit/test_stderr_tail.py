"""The shim keeps the last Python exception its child printed: the final `Type: message` line of
the last traceback, not whatever stderr said last (a warning), with the rank's progress then; and
it forwards the child's stderr unchanged. The pump is tested on a real child process whose
non-daemon thread keeps it alive after its main thread raised."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from scout_slurm.task.shim import _pump_stderr
from scout_slurm.task.stderrtail import StderrTail, TracebackReader

CHAINED = """\
/work/train.py:7: FutureWarning: torch.cuda.amp.GradScaler is deprecated
  warnings.warn("torch.cuda.amp.GradScaler is deprecated", FutureWarning)
Traceback (most recent call last):
  File "/work/train.py", line 4, in inner
    {}["x"]
    ~~^^^^^
KeyError: 'x'

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/train.py", line 9, in <module>
    inner()
  File "/work/train.py", line 6, in inner
    raise RuntimeError("boom at step 5") from e
RuntimeError: boom at step 5
/work/train.py:30: UserWarning: the keep-alive thread is still running
  warnings.warn(...)""".splitlines()

OOM = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't "
    "allocate memory: "
    "you tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)"
)


def exceptions(lines):
    reader = TracebackReader()
    return [found for line in lines if (found := reader.feed(line)) is not None]


def test_each_traceback_gives_its_final_line_and_warnings_do_not():
    assert exceptions(CHAINED) == ["KeyError: 'x'", "RuntimeError: boom at step 5"]


def test_torch_distributed_rank_prefix_is_read_past():
    # torch.distributed's excepthook writes every line of an uncaught exception as "[rankN]: ..."
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/w/t.py", line 3, in <module>',
        "[rank1]:     x = torch.empty(1 << 31)",
        f"[rank1]: {OOM}",
    ]
    assert exceptions(lines) == [OOM]


@pytest.mark.parametrize(
    "line,found",
    [
        ("KeyboardInterrupt", "KeyboardInterrupt"),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        ),
        ("MemoryError", "MemoryError"),
        ("AssertionError:", "AssertionError:"),
    ],
)
def test_exception_lines(line, found):
    assert exceptions(
        ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>', line]
    ) == [found]


def test_a_warning_printed_by_another_thread_inside_a_traceback_is_skipped():
    lines = [
        "Traceback (most recent call last):",
        '  File "t.py", line 1, in <module>',
        "/x/y.py:3: FutureWarning: deprecated",
        "",
        "ValueError: loss is nan",
    ]
    assert exceptions(lines) == ["ValueError: loss is nan"]


def test_no_traceback_no_exception():
    assert (
        exceptions(
            [
                "RuntimeError: said in a log line, no traceback",
                "step 20 loss 0.1",
                "Fatal Python error: Segmentation fault",
                "Thread 0x7f (most recent call first):",
            ]
        )
        == []
    )


def test_the_tail_keeps_the_last_exception_with_the_position_when_it_was_read():
    positions = iter([10, 21])
    tail = StderrTail(4, position=lambda: next(positions), wall=lambda: 123.0)
    for line in CHAINED:
        tail.feed(line + "\n")
    assert tail.last_exception.line == "RuntimeError: boom at step 5"
    assert tail.last_exception.position == 21 and tail.last_exception.at == 123.0
    assert (
        list(tail)[-1] == "  warnings.warn(...)" and len(tail) == 4
    )  # still the last lines, bounded


def test_a_position_that_cannot_be_read_is_unknown():
    def broken() -> int:
        raise OSError("gone")

    tail = StderrTail(position=broken)
    for line in ("Traceback (most recent call last):", "ValueError: x"):
        tail.feed(line)
    assert tail.last_exception.position == -1


def test_pump_forwards_unchanged_and_keeps_the_exception_of_a_child_kept_alive(capfd):
    """A real child: a non-daemon thread outlives the main thread's exception (as a user's metrics
    thread would); after the traceback the thread prints a warning. The tail's exception is the
    traceback's, and the bytes reach the job's stderr as the child wrote them."""
    code = (
        "import threading, time, warnings, sys\n"
        "def later():\n"
        "    time.sleep(0.5)\n"
        "    warnings.warn('still uploading metrics', FutureWarning)\n"
        "threading.Thread(target=later, daemon=False).start()\n"
        "raise ValueError('loss is nan at step 5')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)  # ends by itself
    tail = StderrTail(position=lambda: 42)
    pump = threading.Thread(target=_pump_stderr, args=(child, tail))
    pump.start()
    try:
        assert tail.wait_ended(30)
        pump.join(10)
        assert child.wait(10) == 1
    finally:
        if child.poll() is None:
            child.kill()
    seen = tail.last_exception
    assert (
        seen is not None
        and seen.line == "ValueError: loss is nan at step 5"
        and seen.position == 42
    )
    assert "FutureWarning: still uploading metrics" in tail[-1]  # the last line is the warning
    err = capfd.readouterr().err
    alone = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=30
    ).stderr.decode()
    assert err == alone  # byte for byte what the child writes without the shim
    assert (
        "Traceback (most recent call last):\n" in err
        and "ValueError: loss is nan at step 5\n" in err
    )
