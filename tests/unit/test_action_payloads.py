"""Typed action payloads: each kind keeps its fields through the actions file, the executor takes
the resume step from the payload (no text is parsed), and a payload of one kind is never read as
another's."""

from __future__ import annotations

import json

import pytest

from scout_slurm.config import RemediationConfig
from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.evidence.store import decode_record, read_record, record_to_bytes
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.plan import JobFacts, build_plan
from scout_slurm.remediation.records import (
    ActionKind,
    ActionsRecord,
    CheckpointNote,
    CheckpointStatus,
    Drain,
    Exclude,
    PlannedAction,
    PlanStatus,
    Requeue,
    ResumeFrom,
    ResumeInstruction,
)

ACTIONS = (
    PlannedAction.of(Drain("n3", "scout: crash rank 5 job 77 run 0 conf 0.95 see /e")),
    PlannedAction.of(Requeue(77)),
    PlannedAction.of(Exclude(77, ("n7", "n3", "n1"))),
    PlannedAction.of(
        ResumeFrom("/ckpt/step-100, odd name.pt", 100, 120, "newest eligible: clean votes")
    ),
)


def record(actions=ACTIONS) -> ActionsRecord:
    return ActionsRecord(
        job_id=77,
        restart=0,
        verdict_kind=VerdictKind.CRASH,
        status=PlanStatus.PLANNED,
        actions=actions,
        held_back=(),
        results=(),
        created_at=1.0,
        updated_at=1.0,
    )


def test_each_payload_survives_the_actions_file():
    back = decode_record(record_to_bytes(record()), ActionsRecord, source="actions-0.json")
    assert back == record()
    assert [a.kind for a in back.actions] == [
        ActionKind.DRAIN,
        ActionKind.REQUEUE,
        ActionKind.EXCLUDE,
        ActionKind.RESUME_FROM,
    ]
    assert [type(a.payload) for a in back.actions] == [Drain, Requeue, Exclude, ResumeFrom]


def test_targets_and_descriptions_for_people():
    drain, requeue, exclude, resume = ACTIONS
    assert [a.target for a in ACTIONS] == ["n3", "77", "77", "/ckpt/step-100, odd name.pt"]
    assert drain.describe() == "drain node n3: scout: crash rank 5 job 77 run 0 conf 0.95 see /e"
    assert requeue.describe() == "requeue job 77"
    assert exclude.describe() == "set job 77 excluded nodes to n[1,3,7]"
    assert resume.describe() == (
        "resume from checkpoint /ckpt/step-100, odd name.pt "
        "(step 100, before first suspect step 120; newest eligible: clean votes)"
    )


def test_a_payload_with_a_field_of_another_kind_is_refused():
    obj = json.loads(record_to_bytes(record((PlannedAction.of(Requeue(77)),))))
    obj["actions"][0]["payload"]["reason"] = "x"  # neither a Requeue nor a Drain (no node)
    with pytest.raises(EvidenceError, match="actions"):
        decode_record(json.dumps(obj).encode(), ActionsRecord, source="actions-0.json")


def test_a_version_1_actions_file_is_refused_by_its_version():
    """Version 1 held each action as prose (target, detail); it is refused, not guessed at, and the
    error says it is an older scout's record (not a corrupt one)."""
    v1 = {
        "record_kind": "actions",
        "schema_version": 1,
        "job_id": 77,
        "restart": 0,
        "verdict_kind": "crash",
        "status": "planned",
        "held_back": [],
        "results": [],
        "created_at": 1.0,
        "updated_at": 1.0,
        "actions": [{"kind": "requeue", "target": "77", "detail": ""}],
    }
    with pytest.raises(
        EvidenceError,
        match=r"ActionsRecord schema_version 1 was written by an older scout; "
        r"this one reads versions 2 to 2",
    ):
        decode_record(json.dumps(v1).encode(), ActionsRecord, source="actions-0.json")


def test_the_resume_step_comes_from_the_payload(tmp_path):
    """No Slurm call: a plan of one resume action writes the rerun's instruction with the step as
    planned, whatever the checkpoint's path or the rule's words say."""
    folder = JobFolder(tmp_path / "evidence", "lab", 77)
    folder.results_dir.mkdir(parents=True)
    path = folder.results_dir / "actions-0.json"
    resume = PlannedAction.of(ResumeFrom("/ckpt/step 7, really.pt", 100, -1, "step 3 in words"))
    done = apply_plan(
        record((resume,)), path, folder, timeout=5, retries=0, retry_wait_s=0, deadline=1e18
    )
    assert done.status is PlanStatus.APPLIED and [r.ok for r in done.results] == [True]
    instruction = read_record(folder.resume_path(1), ResumeInstruction, root=folder.root)
    assert (instruction.checkpoint, instruction.step, instruction.restart) == (
        "/ckpt/step 7, really.pt",
        100,
        1,
    )
    assert instruction.reason == "step 100, before first suspect step -1; step 3 in words"
    assert read_record(path, ActionsRecord, root=folder.root) == done


@pytest.mark.parametrize("status", [CheckpointStatus.ELIGIBLE, CheckpointStatus.CANDIDATE, None])
def test_the_plan_says_how_the_rule_chose_the_checkpoint(status):
    verdict = Verdict(
        job_id=77,
        restart=0,
        kind=VerdictKind.CRASH,
        suspects=(Suspect(5, "n3", VerdictKind.CRASH, 0.95),),
        confidence=0.95,
        reasoning=(),
        first_failure_at=1.0,
        first_suspect_step=120,
        world_size=8,
        created_at=2.0,
    )
    note = CheckpointNote(
        path="/ckpt/step-100.pt", step=100, rank=0, restart=0, saved_at=1.0, size_bytes=10
    )
    plan = build_plan(
        verdict,
        JobFacts(77, ("n3", "n4"), (), True, 0, ("n1", "n2", "n3", "n4")),
        RemediationConfig(),
        evidence_path="/e",
        checkpoint=note,
        checkpoint_reason="why",
        checkpoint_status=status,
    )
    resume = [a.payload for a in plan.actions if a.kind == ActionKind.RESUME_FROM]
    assert resume == [ResumeFrom("/ckpt/step-100.pt", 100, 120, "why", status)]
    back = decode_record(
        record_to_bytes(record(plan.actions)), ActionsRecord, source="actions-0.json"
    )
    assert back.actions == plan.actions


@pytest.mark.parametrize(
    "text,kind",
    [
        ("agreed", "AGREED"),
        ("agreed (per-rank RNG streams: rng_cpu differs)", "AGREED"),
        ("disagreed: model differs on rank 3", "DISAGREED"),
        ("not exchanged: the replicas' signatures follow", "NOT_EXCHANGED"),
        ("", "UNKNOWN"),
        ("something newer", "UNKNOWN"),
    ],
)
def test_a_checkpoint_note_s_agreement_by_kind(text, kind):
    from scout_slurm.remediation.records import Agreement

    note = CheckpointNote(
        path="/c", step=1, rank=0, restart=0, saved_at=1.0, size_bytes=1, agreement=text
    )
    assert note.agreement_kind is Agreement[kind]


def test_an_exclusion_of_names_that_are_not_hosts_is_still_shown():
    assert (
        PlannedAction.of(Exclude(77, ("n1", "a b"))).describe()
        == "set job 77 excluded nodes to n1,a b"
    )
