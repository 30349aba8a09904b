"""Checkpoint eligibility and the recovery rule (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.remediation.eligibility import CheckpointStatus, assess, recovery_point
from scout_slurm.remediation.records import CheckpointNote, VoteCoverage


def note(step, restart=0, path=None):
    return CheckpointNote(
        path=path or f"/ck/run{restart}-step-{step}.pt",
        step=step,
        rank=0,
        restart=restart,
        saved_at=1000.0 + step,
        size_bytes=10,
        sha256="ab",
    )


def verdict(kind, first_step, restart=0):
    return Verdict(
        job_id=1,
        restart=restart,
        kind=kind,
        suspects=(Suspect(0, "n1", kind, 0.9),),
        confidence=0.9,
        reasoning=(),
        first_failure_at=0.0,
        first_suspect_step=first_step,
        world_size=4,
        created_at=0.0,
    )


def cov(last_clean, restart=0):
    return VoteCoverage(
        restart=restart, votes=3, last_clean_step=last_clean, last_vote_step=last_clean
    )


OK = lambda n: None  # noqa: E731


def test_statuses_and_reasons():
    notes = [note(5), note(10), note(15)]
    out = {
        a.note.step: a for a in assess(notes, {0: cov(10)}, {0: verdict(VerdictKind.SDC, 11)}, OK)
    }
    assert out[5].status == out[10].status == CheckpointStatus.ELIGIBLE
    assert out[15].status == CheckpointStatus.REJECTED and "first suspect step 11" in out[15].reason
    chosen, why = recovery_point(list(out.values()), 11)
    assert chosen.note.step == 10 and "newest eligible" in why


def test_changed_file_is_rejected_whatever_the_votes():
    a = assess([note(10)], {0: cov(20)}, {}, lambda n: "changed on disk after its record")
    assert a[0].status == CheckpointStatus.REJECTED and "changed on disk" in a[0].reason
    assert recovery_point(a, 30) == (
        None,
        "no usable checkpoint before the first suspect step 30: the rerun "
        "starts as the script decides",
    )


def test_candidate_when_no_vote_covers_it():
    a = assess([note(20)], {}, {0: verdict(VerdictKind.CRASH, 26)}, OK)
    assert a[0].status == CheckpointStatus.CANDIDATE and "no state vote" in a[0].reason
    chosen, why = recovery_point(a, 26)
    assert chosen.note.step == 20 and "no eligible checkpoint" in why


def test_eligible_beats_a_newer_candidate():
    a = assess([note(10), note(20)], {0: cov(10)}, {}, OK)
    chosen, _ = recovery_point(a, 25)
    assert chosen.note.step == 10


def test_strictly_before_the_first_suspect_step():
    a = assess([note(10)], {0: cov(10)}, {}, OK)
    assert recovery_point(a, 10)[0] is None
    assert recovery_point(a, 11)[0].note.step == 10
    assert recovery_point(a, -1)[0].note.step == 10  # unknown: any


def test_clean_verdict_rejects_nothing():
    a = assess([note(30)], {}, {0: verdict(VerdictKind.CLEAN, 5)}, OK)
    assert a[0].status == CheckpointStatus.CANDIDATE


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(st.integers(1, 200), min_size=0, max_size=12, unique=True),
    clean=st.integers(-1, 200),
    fss=st.integers(-1, 200),
    broken=st.sets(st.integers(1, 200)),
)
def test_the_rule_never_picks_a_rejected_or_late_checkpoint(steps, clean, fss, broken):
    notes = [note(s) for s in steps]
    a = assess(
        notes,
        {0: cov(clean)},
        {0: verdict(VerdictKind.SDC, fss)},
        lambda n: "changed" if n.step in broken else None,
    )
    chosen, why = recovery_point(a, fss)
    if chosen is None:
        return
    assert chosen.status != CheckpointStatus.REJECTED
    assert fss < 0 or chosen.note.step < fss
    same = [x for x in a if x.status == chosen.status and (fss < 0 or x.note.step < fss)]
    assert chosen.note.step == max(x.note.step for x in same)
    if chosen.status == CheckpointStatus.CANDIDATE:
        assert not [
            x for x in a if x.status == CheckpointStatus.ELIGIBLE and (fss < 0 or x.note.step < fss)
        ]
