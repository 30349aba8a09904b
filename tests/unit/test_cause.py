"""The cause of a failure (pure): from the exit a rank left, real tracebacks read as the shim reads
them, and the verdicts the localiser builds from them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from scout_slurm.evidence.records import Cause, ExitRecord, VerdictKind
from scout_slurm.localise import cause
from scout_slurm.task.stderrtail import StderrTail, TracebackReader


def _exit(rank=1, *, code=1, signal=0, exception="", at="", position=5) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node="n2",
        pid=100 + rank,
        exit_code=code,
        signal=signal,
        core_dumped=False,
        at=10.0,
        killed_by_scout=False,
        last_progress=None,
        exception=exception,
        exception_position=position,
        exception_at=at,
    )


def _stderr_of(tmp_path, body: str) -> list[str]:
    """What a real interpreter prints for `body` run as the job's script."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert proc.returncode != 0
    return proc.stderr.splitlines()


def test_the_innermost_frame_of_a_real_traceback_is_where_it_was_raised(tmp_path):
    lines = _stderr_of(
        tmp_path,
        """
        def step(batch):
            raise ValueError(f"bad batch {batch}")

        def main():
            step(8)

        main()
        """,
    )
    tail = StderrTail(position=lambda: 7, wall=lambda: 1.0)
    for line in lines:
        tail.feed(line + "\n")
    seen = tail.last_exception
    assert seen is not None and seen.line == "ValueError: bad batch 8"
    assert seen.raised_at == f"{tmp_path / 'train.py'}:3 in step"
    assert cause.in_job_code(seen.raised_at)
    assert cause.short_site(seen.raised_at) == "train.py:3 in step"


def test_a_chained_exception_keeps_the_last_tracebacks_frame(tmp_path):
    lines = _stderr_of(
        tmp_path,
        """
        import json

        def load():
            try:
                json.loads("{")
            except ValueError:
                raise KeyError("config")

        load()
        """,
    )
    reader, found = TracebackReader(), []
    for line in lines:
        hit = reader.feed(line)
        if hit:
            found.append((hit, reader.raised_at))
    assert found[-1][0] == "KeyError: 'config'"
    assert found[-1][1].endswith("train.py:8 in load")
    # the first traceback's innermost frame is json's own code: a library's
    assert not cause.in_job_code(found[0][1])


def test_torch_rank_prefixed_lines_are_read_past():
    reader = TracebackReader()
    lines = [
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/u/train.py", line 73, in <module>',
        "[rank1]:     step()",
        '[rank1]:   File "/home/u/train.py", line 41, in step',
        '[rank1]:     raise RuntimeError("loss went negative")',
        "[rank1]: RuntimeError: loss went negative",
    ]
    hits = [reader.feed(x) for x in lines]
    assert hits[-1] == "RuntimeError: loss went negative"
    assert reader.raised_at == "/home/u/train.py:41 in step"


@pytest.mark.parametrize(
    "exception, at, expected",
    [
        ("ValueError: bad batch 8", "/w/train.py:3 in step", Cause.SOFTWARE),
        # a user-side error raised inside a library is still the job's
        ("KeyError: 'lr'", "/usr/lib/python3/dist-packages/x.py:9 in get", Cause.SOFTWARE),
        (
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x8 and 9x2)",
            "/v/lib/python3.11/site-packages/torch/nn/functional.py:99 in linear",
            Cause.SOFTWARE,
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "",
            Cause.SOFTWARE,
        ),
        # any exception the job's own code raised
        ("RuntimeError: loss went negative", "/w/train.py:41 in step", Cause.SOFTWARE),
        # a RuntimeError from inside torch, of no known kind: nothing decides
        (
            "RuntimeError: something odd",
            "/v/lib/python3.11/site-packages/torch/x.py:1 in f",
            Cause.UNKNOWN,
        ),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "", Cause.HARDWARE),
        (
            "OSError: [Errno 5] Input/output error: '/ckpt/x.pt'",
            "/w/train.py:9 in save",
            Cause.INFRASTRUCTURE,
        ),
        ("OSError: [Errno 116] Stale file handle", "", Cause.INFRASTRUCTURE),
        # scout's own frames are not the job's
        ("RuntimeError: x", "/v/site-packages/scout_slurm/bootstrap/x.py:3 in f", Cause.UNKNOWN),
    ],
)
def test_the_cause_one_exit_shows(exception, at, expected):
    found = cause.of_exit(_exit(exception=exception, at=at), exception)
    assert found.cause is expected, found
    assert (found.fault_site != "") == (expected is Cause.SOFTWARE)


def test_sigbus_is_hardware_and_a_plain_exit_code_decides_nothing():
    assert cause.of_exit(_exit(code=-1, signal=7), "").cause is Cause.HARDWARE
    assert cause.of_exit(_exit(code=3), "").cause is Cause.UNKNOWN


def test_a_verdict_is_software_only_when_every_suspect_agrees():
    bug = (_exit(1, exception="ValueError: x", at="/w/t.py:3 in f"), "ValueError: x")
    odd = (_exit(2, code=3), "")
    ecc = (
        _exit(3, exception="RuntimeError: uncorrectable ECC error"),
        "RuntimeError: uncorrectable ECC error",
    )
    assert cause.judge(VerdictKind.CRASH, [bug]).cause is Cause.SOFTWARE
    assert cause.judge(VerdictKind.CRASH, [bug]).fault_site == "ValueError at t.py:3 in f"
    assert cause.judge(VerdictKind.CRASH, [bug, odd]).cause is Cause.UNKNOWN
    assert cause.judge(VerdictKind.CRASH, [bug, ecc]).cause is Cause.HARDWARE
    assert cause.judge(VerdictKind.SDC, []).cause is Cause.HARDWARE
    assert cause.judge(VerdictKind.HANG, [bug]).cause is Cause.UNKNOWN
    # root evidence outranks the job's own words
    soft = cause.judge(VerdictKind.CRASH, [bug])
    assert cause.with_root_evidence(soft, "nvidia-xid 79").cause is Cause.HARDWARE
    assert cause.with_root_evidence(soft, "") is soft


def test_the_localiser_writes_the_cause_into_the_verdict():
    from scout_slurm.localise.verdict import JobEvidence, localise

    exits = {r: _exit(r, code=0, exception="", position=-1) for r in range(4) if r != 1}
    exits[1] = _exit(
        1, exception="ValueError: bad batch 8", at="/w/train.py:73 in step", position=-1
    )
    v = localise(JobEvidence(job_id=7, restart=0, world_size=4, exits=exits), now=20.0)
    assert v.kind is VerdictKind.CRASH and [s.rank for s in v.suspects] == [1]
    assert v.cause is Cause.SOFTWARE
    assert v.fault_site == "ValueError at train.py:73 in step"
    assert "ValueError" in v.cause_evidence


def test_the_job_output_line_for_the_same_bug_on_two_runs():
    from scout_slurm.task.watchdog import same_bug

    bug = "ValueError: batch 5 has 8 rows, expected 17"
    now = _exit(exception=bug, at="/w/train.py:18 in check_batch")
    line = same_bug(now, _exit(exception=bug, at="/w/train.py:18 in check_batch"), 0)
    assert line.startswith("scout: rank 1 failed with the same ValueError at train.py:18 in ")
    assert "as on run 0: a bug in the script, not a node's fault" in line
    # elsewhere in the script, another error, or no earlier exception: nothing said
    assert same_bug(now, _exit(exception=bug, at="/w/train.py:30 in check_batch"), 0) == ""
    assert (
        same_bug(now, _exit(exception="KeyError: 'x'", at="/w/train.py:18 in check_batch"), 0) == ""
    )
    assert same_bug(now, _exit(code=3), 0) == "" and same_bug(now, None, 0) == ""


def _dump_of(tmp_path, body: str) -> list[str]:
    """A real faulthandler dump of `body`'s main thread (report/story.py main_thread)."""
    from scout_slurm.evidence.stacks import main_thread

    out = tmp_path / "stack.txt"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body).replace("OUT", repr(str(out))))
    subprocess.run([sys.executable, str(script)], check=True, timeout=60, cwd=tmp_path)
    return main_thread(out.read_text())


def test_a_hang_in_the_jobs_own_code_is_software_and_one_in_a_library_is_not(tmp_path):
    own = _dump_of(
        tmp_path,
        """
        import faulthandler

        def wait_for_data():
            with open(OUT, "w") as fh:
                faulthandler.dump_traceback(fh)

        wait_for_data()
        """,
    )
    found = cause.of_hang(((1, own),), [1])
    assert (
        found.cause is Cause.SOFTWARE and found.fault_site == "hang at train.py:6 in wait_for_data"
    )
    assert "rank 1 was in the job's own code" in found.evidence
    # every suspect must have stood in its own code; a missing dump decides nothing
    assert cause.of_hang(((1, own),), [1, 2]).cause is Cause.UNKNOWN
    assert cause.of_hang((), [1]).cause is Cause.UNKNOWN
    # innermost in the standard library (a lock's wait), not the job's code: nothing decided
    assert (
        cause.of_hang_stack(
            1,
            [
                "Current thread 0x1 (most recent call first):",
                '  File "/usr/lib/python3.11/threading.py", line 320 in wait',
            ],
        ).cause
        is Cause.UNKNOWN
    )


def test_the_decide_stage_takes_a_hangs_cause_from_the_stacks_and_root_outranks_it():
    import dataclasses

    from scout_slurm.evidence.records import Suspect, Verdict
    from scout_slurm.incident import decide

    v = Verdict(
        job_id=7,
        restart=0,
        kind=VerdictKind.HANG,
        suspects=(Suspect(1, "n2", VerdictKind.HANG, 0.9),),
        confidence=0.9,
        reasoning=(),
        first_failure_at=0.0,
        first_suspect_step=5,
        world_size=4,
        created_at=1.0,
    )
    frames = (
        "Current thread 0x1 (most recent call first):",
        '  File "/w/train.py", line 40 in step',
    )
    soft = decide.with_stack_cause(v, [(1, frames)])
    assert soft.cause is Cause.SOFTWARE and soft.fault_site == "hang at train.py:40 in step"
    assert (
        decide.with_stack_cause(dataclasses.replace(v, kind=VerdictKind.CRASH), [(1, frames)]).cause
        is Cause.UNKNOWN
    )
    assert decide.counts_against_nodes(soft) is False
    from scout_slurm.remediation.plan import NodeSuspicion

    named = {"n2": decide.NamedNode(NodeSuspicion("n2", (), ("nvidia-xid-bus: Xid 79",), True))}
    rooted = decide.with_root_cause(soft, named)
    assert rooted.cause is Cause.HARDWARE and "Xid 79" in rooted.cause_evidence
    assert decide.counts_against_nodes(rooted) is True
