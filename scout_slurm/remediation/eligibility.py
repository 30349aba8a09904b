"""Checkpoint eligibility and the recovery rule (pure, given the file checks).

A checkpoint at step s is *eligible* when the replicas were seen to agree at a step >= s (a
persistent corruption before s would have shown there), *candidate* when no vote has covered it
yet, *rejected* when its file is missing or changed since it was noted, when it was saved at
or after the first suspect step of its run, or when the replicas' state signatures disagreed at
the save (schema version 2 records). Replicas that agreed at the save make it eligible as a clean
vote at that step would. The rule: the newest eligible checkpoint strictly
before the first suspect step; failing that, the newest candidate, said so plainly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scout_slurm.evidence.records import (
    Agreement,
    CheckpointNote,
    Verdict,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.remediation.records import (
    CheckpointStatus,
    RejectedCheckpoint,
    RerunCheckpoints,
)


@dataclass(frozen=True)
class Assessment:
    note: CheckpointNote
    status: CheckpointStatus
    reason: str
    # the file on storage is the one noted (False: missing or changed since; nothing of it to load)
    on_storage: bool = True


def assess(
    notes: Sequence[CheckpointNote],
    coverage: Mapping[int, VoteCoverage],
    verdicts: Mapping[int, Verdict],
    file_problem: Callable[[CheckpointNote], str | None],
) -> list[Assessment]:
    out = []
    for note in sorted(notes, key=lambda n: (n.step, n.saved_at)):
        problem = file_problem(note)
        v = verdicts.get(note.restart)
        cov = coverage.get(note.restart)
        if problem:
            out.append(Assessment(note, CheckpointStatus.REJECTED, problem, on_storage=False))
        elif (
            v is not None and v.kind != VerdictKind.CLEAN and 0 <= v.first_suspect_step <= note.step
        ):
            out.append(
                Assessment(
                    note,
                    CheckpointStatus.REJECTED,
                    f"saved at step {note.step}, at or after the first suspect step "
                    f"{v.first_suspect_step} of run {note.restart} ({v.kind.value})",
                )
            )
        elif note.agreement_kind is Agreement.DISAGREED:
            out.append(
                Assessment(
                    note,
                    CheckpointStatus.REJECTED,
                    f"the replicas' state signatures {note.agreement} at the save (step "
                    f"{note.step})",
                )
            )
        elif cov is not None and cov.last_clean_step >= note.step:
            out.append(
                Assessment(
                    note,
                    CheckpointStatus.ELIGIBLE,
                    f"the replicas agreed at step {cov.last_clean_step} (>= {note.step})",
                )
            )
        elif note.agreement_kind is Agreement.AGREED:
            out.append(
                Assessment(
                    note,
                    CheckpointStatus.ELIGIBLE,
                    f"the replicas' state signatures agreed at the save (step {note.step})",
                )
            )
        else:
            seen = (
                f"last clean vote at step {cov.last_clean_step}"
                if cov
                else "no state vote in this run"
            )
            if note.agreement_kind is Agreement.NOT_EXCHANGED:
                seen += f"; replicas' signatures {note.agreement}"
            out.append(
                Assessment(note, CheckpointStatus.CANDIDATE, f"not covered by a vote yet ({seen})")
            )
    return out


def recovery_point(
    assessments: Sequence[Assessment], first_suspect_step: int
) -> tuple[Assessment | None, str]:
    """The checkpoint to resume from, and why (pure)."""
    before = [a for a in assessments if first_suspect_step < 0 or a.note.step < first_suspect_step]
    where = (
        f"before the first suspect step {first_suspect_step}"
        if first_suspect_step >= 0
        else "(first suspect step unknown)"
    )
    for status in (CheckpointStatus.ELIGIBLE, CheckpointStatus.CANDIDATE):
        pool = [a for a in before if a.status == status]
        if pool:
            best = max(pool, key=lambda a: (a.note.step, a.note.saved_at))
            if status == CheckpointStatus.ELIGIBLE:
                return (
                    best,
                    f"newest eligible checkpoint {where}: step {best.note.step} ({best.reason})",
                )
            return best, (
                f"no eligible checkpoint {where}; newest candidate: step {best.note.step} "
                f"({best.reason})"
            )
    return None, f"no usable checkpoint {where}: the rerun starts as the script decides"


def rerun_checkpoints(
    job_id: int, restart: int, assessments: Sequence[Assessment], chosen: Assessment | None
) -> RerunCheckpoints:
    """What run `restart` is told of the checkpoints (pure): the recovery point, and each path
    whose newest noted save was rejected while its file is still that save (a script that loads
    its newest file, replaced in place, would load it)."""
    newest: dict[str, Assessment] = {}
    for a in assessments:
        held = newest.get(a.note.path)
        if held is None or (a.note.saved_at, a.note.step) >= (held.note.saved_at, held.note.step):
            newest[a.note.path] = a
    rejected = tuple(
        RejectedCheckpoint(a.note.path, a.note.step, a.note.restart, a.reason[:300])
        for a in sorted(newest.values(), key=lambda a: a.note.path)
        if a.status is CheckpointStatus.REJECTED and a.on_storage
    )
    return RerunCheckpoints(
        job_id=job_id,
        restart=restart,
        recovery_point=chosen.note.path if chosen else "",
        recovery_step=chosen.note.step if chosen else -1,
        rejected=rejected,
    )
