"""A job's noted checkpoints assessed from its folder: reads the notes, the runs' vote coverage and
verdicts, and the batch host's root-owned checks (evidence/checkfiles.py); the rule that decides
is remediation/eligibility.py's `assess`."""

from __future__ import annotations

import dataclasses

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.checkfiles import (
    NO_RECORD,
    NO_RESULT,
    list_checkpoint_notes,
    note_digest,
)
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import CheckpointChecks, Verdict, VoteCoverage
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.eligibility import Assessment, CheckpointStatus, assess


def assess_job(
    folder: JobFolder, *, current_verdict: Verdict | None = None, checks: CheckpointChecks | None
) -> list[Assessment]:
    """Every noted checkpoint of a job, assessed (reads the notes, vote coverage and verdicts). What
    is on storage comes from `checks` (`read_checkpoint_checks`) alone: no path a note names is
    opened here. A note with no result for its current bytes is not verified, hence rejected."""
    named = list_checkpoint_notes(folder)
    if checks is not None and checks.job_id != folder.job_id:
        checks = None
    found = {(c.note_file, c.note_digest): c for c in checks.results} if checks is not None else {}
    problems: dict[int, str | None] = {}
    remarks: dict[int, str] = {}  # verified, but not in full (size and presence only)
    for name, note in named:
        if checks is None:
            problems[id(note)] = NO_RECORD
            continue
        result = found.get((name, note_digest(note)))
        if result is None:
            problems[id(note)] = NO_RESULT
        elif result.verified:
            problems[id(note)] = None
            if result.problem:
                remarks[id(note)] = result.problem
        else:
            problems[id(note)] = result.problem or NO_RESULT
    coverage, verdicts = {}, {}
    for restart in folder.restarts():
        p = folder.coverage_path(restart)
        if p.exists():
            try:
                coverage[restart] = read_record(p, VoteCoverage, root=folder.root)
            except EvidenceError:
                pass
        vp = folder.verdict_path(restart)
        if vp.exists():
            try:
                verdicts[restart] = read_record(vp, Verdict, root=folder.root)
            except EvidenceError:
                pass
    if current_verdict is not None:
        verdicts[current_verdict.restart] = current_verdict
    out = assess([note for _, note in named], coverage, verdicts, lambda note: problems[id(note)])
    return [
        dataclasses.replace(a, reason=f"{a.reason}; file {remarks[id(a.note)]}")
        if id(a.note) in remarks and a.status != CheckpointStatus.REJECTED
        else a
        for a in out
    ]
