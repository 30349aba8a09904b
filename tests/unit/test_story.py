"""`scout show JOBID` tells the job's story: runs in order, the incident first, a running run as
running, the suspect's dumped stack (pure rendering over records; a real faulthandler dump)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.records import Cause, Suspect, Verdict, VerdictKind
from scout_slurm.evidence.safeio import list_names_below
from scout_slurm.evidence.stacks import main_thread
from scout_slurm.remediation.records import (
    ActionResult,
    ActionsRecord,
    Drain,
    PlannedAction,
    PlanStatus,
    Requeue,
)
from scout_slurm.report.story import RunStory, render_story, running


def _verdict(run: int, kind=VerdictKind.HANG, cause=Cause.UNKNOWN) -> Verdict:
    return Verdict(
        job_id=77,
        restart=run,
        kind=kind,
        suspects=(Suspect(1, "n2", kind, 0.9),) if kind is not VerdictKind.CLEAN else (),
        confidence=0.9,
        reasoning=(),
        first_failure_at=0.0,
        first_suspect_step=12 if kind is not VerdictKind.CLEAN else -1,
        world_size=4,
        created_at=1.0,
        cause=cause,
        cause_evidence="rank 1 stopped" if kind is not VerdictKind.CLEAN else "",
    )


def _actions() -> ActionsRecord:
    drain, requeue = PlannedAction.of(Drain("n2", "scout: hang")), PlannedAction.of(Requeue(77))
    return ActionsRecord(
        job_id=77,
        restart=0,
        verdict_kind=VerdictKind.HANG,
        status=PlanStatus.APPLIED,
        actions=(drain, requeue),
        held_back=(),
        results=(
            ActionResult(drain.kind, drain.target, True, "drained", 1, 1.0),
            ActionResult(requeue.kind, requeue.target, True, "requeued", 1, 1.0),
        ),
        created_at=1.0,
        updated_at=1.0,
    )


def test_a_recovered_job_opens_on_its_incident_then_the_rerun():
    stories = [
        RunStory(0, _verdict(0), _actions(), ("n1", "n2"), 4, 4),
        RunStory(1, _verdict(1, VerdictKind.CLEAN), None, ("n1", "n3"), 4, 4),
    ]
    text = "\n".join(render_story(77, stories, 1))
    assert text.index("run 0 on n1,n2: hang") < text.index("run 1 on n1,n3 (shown below): clean")
    assert "rank 1 on n2; cause unknown" in text
    assert "drain n2: done" in text and "requeue 77: done" in text
    assert "reran as run 1 on n1,n3" in text


def test_a_running_run_says_running_not_failed():
    s = RunStory(0, None, None, ("n1", "n2"), 4, 1)
    assert running(s)
    text = "\n".join(render_story(77, [s], 0))
    assert "running, no verdict yet (1 of 4 ranks have exited" in text
    assert "failed" not in text
    assert not running(dataclasses.replace(s, exited=4))


def test_the_current_threads_frames_from_a_real_faulthandler_dump(tmp_path):
    out = tmp_path / "rank-1.txt"
    code = textwrap.dedent(
        f"""
        import faulthandler, threading, time
        def sleeper():
            time.sleep(30)
        threading.Thread(target=sleeper, daemon=True).start()
        def train_step():
            with open({str(out)!r}, "w") as fh:
                faulthandler.dump_traceback(fh, all_threads=True)
        def main():
            train_step()
        main()
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    frames = main_thread(out.read_text())
    assert frames[0].startswith("Current thread ")
    assert "train_step" in frames[1] and any("main" in f for f in frames[2:])
    assert not any("sleeper" in f for f in frames)  # the other thread is not the training's
    assert main_thread("--- scout watchdog: stopped (T); /proc shows ...") == []


def test_listing_a_job_folder_refuses_a_planted_link(tmp_path):
    root = tmp_path / "root"
    (root / "c" / "7" / "run-0").mkdir(parents=True)
    (root / "c" / "7" / "run-0" / "ranks").mkdir()
    (root / "c" / "7" / "run-0" / "ranks" / "rank-0.json").write_text("{}")
    assert list_names_below(root / "c" / "7" / "run-0" / "ranks", root) == ["rank-0.json"]
    assert list_names_below(root / "c" / "7" / "run-1" / "ranks", root) == []
    os.symlink("/etc", root / "c" / "7" / "run-0" / "tasks")
    with pytest.raises(EvidenceError, match="symbolic link"):
        list_names_below(root / "c" / "7" / "run-0" / "tasks", root)
