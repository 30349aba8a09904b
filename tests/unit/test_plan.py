"""The remediation plan: every guard of the site config over plain verdicts and job facts. What a
guard stops is written down with the reason; nothing outside the job's allocation is ever
drained."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm.config import RemediationConfig
from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.remediation.plan import JobFacts, build_plan, choose_checkpoint, drain_reason
from scout_slurm.remediation.records import ActionKind, CheckpointNote
from scout_slurm.slurm.hostlist import expand_hostlist

EVIDENCE = "/var/lib/scout/evidence/lab/77"
ALLOC = ("n1", "n2", "n3", "n4")


def verdict(
    kind: VerdictKind = VerdictKind.CRASH,
    *suspects: tuple[int, str],
    confidence: float = 0.95,
    first_step: int = 120,
) -> Verdict:
    return Verdict(
        job_id=77,
        restart=1,
        kind=kind,
        suspects=tuple(Suspect(r, n, kind, confidence) for r, n in suspects),
        confidence=confidence,
        reasoning=("because",),
        first_failure_at=0.0,
        first_suspect_step=first_step,
        world_size=8,
        created_at=1_700_000_000.0,
    )


def facts(
    allocation=ALLOC,
    *,
    excluded=(),
    requeue_allowed=True,
    restarts=1,
    usable=("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"),
) -> JobFacts:
    return JobFacts(
        job_id=77,
        allocation=tuple(allocation),
        excluded=tuple(excluded),
        requeue_allowed=requeue_allowed,
        restart_count=restarts,
        usable_nodes=tuple(usable),
    )


def note(step: int, saved_at: float = 0.0, path: str = "") -> CheckpointNote:
    return CheckpointNote(
        path=path or f"/ckpt/step-{step}.pt",
        step=step,
        rank=0,
        restart=0,
        saved_at=saved_at or 1_700_000_000.0 + step,
        size_bytes=1 << 20,
    )


def kinds(plan) -> list[ActionKind]:
    return [a.kind for a in plan.actions]


def drained(plan) -> list[str]:
    return [a.target for a in plan.actions if a.kind == ActionKind.DRAIN]


def held(plan) -> str:
    return "\n".join(plan.held_back)


CFG = RemediationConfig()


# --- nothing to do ------------------------------------------------------------------------


def test_inconclusive_drains_nothing_and_does_not_requeue():
    plan = build_plan(
        verdict(VerdictKind.INCONCLUSIVE),
        facts(),
        CFG,
        evidence_path=EVIDENCE,
        checkpoint=note(100),
    )
    assert plan.actions == ()
    assert "not requeued" in held(plan) and "nothing is drained" in held(plan)


def test_inconclusive_with_suspects_still_drains_nothing():
    plan = build_plan(
        verdict(VerdictKind.INCONCLUSIVE, (1, "n1")), facts(), CFG, evidence_path=EVIDENCE
    )
    assert plan.actions == ()


def test_clean_does_nothing():
    plan = build_plan(
        verdict(VerdictKind.CLEAN), facts(), CFG, evidence_path=EVIDENCE, checkpoint=note(1)
    )
    assert plan.actions == ()
    assert "clean" in held(plan)


# --- drains -------------------------------------------------------------------------------


def test_crash_drains_the_suspect_node_requeues_excludes_and_resumes():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(),
        CFG,
        evidence_path=EVIDENCE,
        checkpoint=note(100),
    )
    assert kinds(plan) == [
        ActionKind.DRAIN,
        ActionKind.REQUEUE,
        ActionKind.EXCLUDE,
        ActionKind.RESUME_FROM,
    ]
    drain, requeue, exclude, resume = plan.actions
    assert drain.target == "n3"
    assert drain.payload.reason == drain_reason(
        verdict(VerdictKind.CRASH, (5, "n3")), "n3", EVIDENCE
    )
    assert requeue.target == "77" and requeue.payload.job_id == 77
    assert exclude.target == "77" and exclude.payload.hostlist == "n3"
    assert resume.target == "/ckpt/step-100.pt" and resume.payload.step == 100
    assert resume.payload.first_suspect_step == 120
    assert "step 100" in resume.describe() and "120" in resume.describe()
    assert plan.held_back == ()


def test_two_suspects_on_one_node_drain_it_once():
    plan = build_plan(
        verdict(VerdictKind.HANG, (4, "n3"), (5, "n3")), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == ["n3"]


def test_low_confidence_holds_the_drain():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3"), confidence=0.6), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == []
    assert "confidence 0.60 is below the site's minimum 0.80" in held(plan)
    # and without a drain a rerun on the same nodes would fail alike: not requeued either
    assert ActionKind.REQUEUE not in kinds(plan)


def test_confidence_at_the_minimum_drains():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3"), confidence=0.8), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == ["n3"]


def test_node_outside_the_allocation_is_held_back_and_never_in_actions():
    plan = build_plan(
        verdict(VerdictKind.HANG, (2, "n9"), (5, "n3")), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == ["n3"]
    assert "node 'n9' named by the evidence is outside the job's allocation (n[1-4])" in held(plan)
    assert all("n9" not in a.target and "n9" not in a.describe() for a in plan.actions)


def test_only_nodes_outside_the_allocation_drain_nothing():
    plan = build_plan(
        verdict(VerdictKind.HANG, (2, "login1")), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == []
    assert "login1" in held(plan)
    assert ActionKind.REQUEUE not in kinds(plan)


def test_empty_allocation_is_said_so():
    plan = build_plan(
        verdict(VerdictKind.HANG, (2, "n2")), facts(allocation=()), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == []
    assert "(empty)" in held(plan)


@pytest.mark.parametrize(
    "fraction,alloc,suspects,expected",
    [
        (0.5, ALLOC, ("n1", "n2"), ["n1", "n2"]),
        (0.5, ALLOC, ("n1", "n2", "n3"), []),
        (0.25, ALLOC, ("n1",), ["n1"]),
        (0.25, ALLOC, ("n1", "n2"), []),
        (1.0, ALLOC, ("n1", "n2", "n3", "n4"), ["n1", "n2", "n3", "n4"]),
        (0.5, ("n1",), ("n1",), ["n1"]),  # one node may always go ...
        (0.1, ("n1", "n2"), ("n2",), ["n2"]),
        (0.1, ("n1", "n2"), ("n1", "n2"), []),
        (0.0, ("n1",), ("n1",), []),  # ... unless the fraction is 0
        (0.0, ALLOC, ("n2",), []),
        (
            0.3,
            ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10"),
            ("n1", "n2", "n3"),
            ["n1", "n2", "n3"],
        ),
    ],
    ids=[
        "half-of-4-two",
        "half-of-4-three",
        "quarter-one",
        "quarter-two",
        "all",
        "one-node-job",
        "tenth-of-two",
        "tenth-of-two-both",
        "zero-one-node",
        "zero",
        "float-edge-30pct-of-10",
    ],
)
def test_max_drain_fraction(fraction, alloc, suspects, expected):
    cfg = RemediationConfig(max_drain_fraction=fraction)
    v = verdict(VerdictKind.CRASH, *[(i, n) for i, n in enumerate(suspects)])
    plan = build_plan(
        v,
        facts(allocation=alloc, usable=alloc + ("s1", "s2", "s3", "s4")),
        cfg,
        evidence_path=EVIDENCE,
    )
    assert drained(plan) == expected
    if not expected:
        assert "exceed the limit" in held(plan) and "nothing drained" in held(plan)


# --- requeue ------------------------------------------------------------------------------


def test_restart_limit_stops_the_requeue_but_not_the_drain():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(restarts=3),
        CFG,
        evidence_path=EVIDENCE,
        checkpoint=note(100),
    )
    assert kinds(plan) == [ActionKind.DRAIN]
    assert "restart limit reached (3 of 3)" in held(plan)


def test_no_requeue_job_is_not_requeued():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(requeue_allowed=False),
        CFG,
        evidence_path=EVIDENCE,
        checkpoint=note(100),
    )
    assert kinds(plan) == [ActionKind.DRAIN]
    assert "--no-requeue" in held(plan)


def test_site_without_requeue():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(),
        RemediationConfig(requeue=False),
        evidence_path=EVIDENCE,
    )
    assert kinds(plan) == [ActionKind.DRAIN]
    assert "disables requeue" in held(plan)


def test_too_few_usable_nodes_is_not_requeued():
    # 4 nodes needed; of the 5 usable, n3 is drained and n5 already excluded: 3 remain
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(excluded=("n5",), usable=("n1", "n2", "n3", "n4", "n5")),
        CFG,
        evidence_path=EVIDENCE,
    )
    assert kinds(plan) == [ActionKind.DRAIN]
    assert "only 3 usable nodes would remain for a job of 4" in held(plan)


def test_just_enough_usable_nodes_is_requeued():
    plan = build_plan(
        verdict(VerdictKind.CRASH, (5, "n3")),
        facts(usable=("n1", "n2", "n3", "n4", "n5")),
        CFG,
        evidence_path=EVIDENCE,
    )
    assert ActionKind.REQUEUE in kinds(plan)


def test_requeue_merges_exclusions():
    plan = build_plan(
        verdict(VerdictKind.HANG, (1, "n1"), (5, "n3")),
        facts(excluded=("n7", "n3"), usable=[f"n{i}" for i in range(1, 13)]),
        CFG,
        evidence_path=EVIDENCE,
    )
    exclude = [a for a in plan.actions if a.kind == ActionKind.EXCLUDE]
    assert len(exclude) == 1
    assert exclude[0].payload.hostlist == "n[1,3,7]"
    assert exclude[0].describe() == "set job 77 excluded nodes to n[1,3,7]"


def test_infra_requeues_even_without_a_drain():
    plan = build_plan(
        verdict(VerdictKind.INFRA, (5, "n3"), confidence=0.7), facts(), CFG, evidence_path=EVIDENCE
    )
    assert drained(plan) == []
    assert kinds(plan) == [ActionKind.REQUEUE]  # no EXCLUDE without a drain


def test_no_checkpoint_is_said_so():
    plan = build_plan(verdict(VerdictKind.CRASH, (5, "n3")), facts(), CFG, evidence_path=EVIDENCE)
    assert ActionKind.RESUME_FROM not in kinds(plan)
    assert "no recorded checkpoint before the first suspect step" in held(plan)


# --- checkpoint choice --------------------------------------------------------------------

NOTES = [note(300), note(100), note(200)]


def test_newest_checkpoint_strictly_before_the_first_suspect_step():
    assert choose_checkpoint(NOTES, 250).step == 200
    assert choose_checkpoint(NOTES, 200).step == 100
    assert choose_checkpoint(NOTES, 301).step == 300


def test_no_checkpoint_when_all_are_at_or_after_the_first_suspect_step():
    assert choose_checkpoint(NOTES, 100) is None
    assert choose_checkpoint(NOTES, 5) is None
    assert choose_checkpoint([], 5) is None


def test_any_checkpoint_when_the_first_suspect_step_is_unknown():
    assert choose_checkpoint(NOTES, -1).step == 300
    assert choose_checkpoint([], -1) is None


def test_same_step_newest_save_wins():
    a, b = note(100, saved_at=10.0, path="/ckpt/a.pt"), note(100, saved_at=20.0, path="/ckpt/b.pt")
    assert choose_checkpoint([b, a], 150).path == "/ckpt/b.pt"


# --- drain reason -------------------------------------------------------------------------


def test_drain_reason():
    v = verdict(VerdictKind.HANG, (4, "n3"), (5, "n3"), (1, "n1"), confidence=0.9)
    reason = drain_reason(v, "n3", EVIDENCE)
    assert reason.startswith("scout:")
    assert reason == f"scout: hang rank 4,5 job 77 run 1 conf 0.90 see {EVIDENCE}"


# --- property: drains stay inside the allocation and within the fraction ------------------

POOL = [f"n{i}" for i in range(1, 13)] + ["login1", "gpu-a1"]


@st.composite
def plan_inputs(draw):
    kind = draw(st.sampled_from(VerdictKind))
    suspects = draw(st.lists(st.tuples(st.integers(0, 31), st.sampled_from(POOL)), max_size=8))
    v = verdict(
        kind, *suspects, confidence=draw(st.floats(0, 1)), first_step=draw(st.integers(-1, 500))
    )
    alloc = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=10))
    job = facts(
        allocation=alloc,
        excluded=draw(st.lists(st.sampled_from(POOL), unique=True, max_size=3)),
        requeue_allowed=draw(st.booleans()),
        restarts=draw(st.integers(0, 5)),
        usable=draw(st.lists(st.sampled_from(POOL), unique=True)),
    )
    cfg = RemediationConfig(
        min_confidence=draw(st.floats(0, 1)),
        max_drain_fraction=draw(st.floats(0, 1)),
        restart_limit=draw(st.integers(0, 5)),
        requeue=draw(st.booleans()),
    )
    return v, job, cfg


@settings(max_examples=400, deadline=None)
@given(plan_inputs())
def test_drains_stay_in_the_allocation_and_respect_the_fraction(inputs):
    v, job, cfg = inputs
    plan = build_plan(v, job, cfg, evidence_path=EVIDENCE)
    targets = drained(plan)
    assert set(targets) <= set(job.allocation)
    assert len(targets) == len(set(targets))
    limit = math.floor(cfg.max_drain_fraction * len(job.allocation) + 1e-9)
    allowed = 0 if cfg.max_drain_fraction == 0 else max(1, limit)
    assert len(targets) <= allowed
    if v.kind in (VerdictKind.CLEAN, VerdictKind.INCONCLUSIVE):
        assert plan.actions == ()
    if targets:
        assert v.confidence >= cfg.min_confidence
        assert all(
            a.payload.reason.startswith("scout:")
            for a in plan.actions
            if a.kind == ActionKind.DRAIN
        )
    for a in plan.actions:
        if a.kind == ActionKind.EXCLUDE:
            assert (
                set(a.payload.nodes)
                == set(expand_hostlist(a.payload.hostlist))
                == set(job.excluded) | set(targets)
            )


# --- stragglers ---------------------------------------------------------------------------


def test_straggler_is_reported_not_drained_by_default():
    plan = build_plan(
        verdict(VerdictKind.STRAGGLER, (3, "n2")), facts(), CFG, evidence_path=EVIDENCE
    )
    assert plan.actions == ()
    assert "drain_stragglers" in held(plan) and "not requeued" in held(plan)


def test_straggler_drained_under_the_site_setting_but_never_requeued():
    cfg = RemediationConfig(drain_stragglers=True)
    plan = build_plan(
        verdict(VerdictKind.STRAGGLER, (2, "n2"), (3, "n2")), facts(), cfg, evidence_path=EVIDENCE
    )
    assert kinds(plan) == [ActionKind.DRAIN] and drained(plan) == ["n2"]
    assert plan.actions[0].payload.reason.startswith("scout: straggler rank 2,3 job 77")
    assert "not requeued" in held(plan)


# How the job ended, by Slurm's word: the table of what scout then does (issue: a real site's
# conditions). A job ended by a person or by Slurm itself is never drained for nor requeued.
END_STATES = [
    # (Slurm's JobState at the hook, scout acts?, words the plan must hold)
    ("CANCELLED", False, "cancelled (scancel, by its user or an administrator)"),
    ("CANCELLED by 1001", False, "cancelled"),
    ("TIMEOUT", False, "time limit"),
    ("DEADLINE", False, "deadline"),
    ("PREEMPTED", False, "preempted"),
    ("NODE_FAIL", False, "requeues the job itself"),
    ("BOOT_FAIL", False, "failed to boot"),
    ("FAILED", True, ""),
    ("COMPLETED", True, ""),  # a finding in a job that exited 0 (SDC)
    ("OUT_OF_MEMORY", True, ""),
    ("", True, ""),  # Slurm did not answer: today's behaviour
]


@pytest.mark.parametrize("state,acts,words", END_STATES)
@pytest.mark.parametrize(
    "kind", [VerdictKind.CRASH, VerdictKind.HANG, VerdictKind.SDC, VerdictKind.INFRA]
)
def test_how_the_job_ended_decides_whether_scout_acts(state, acts, words, kind):
    import dataclasses

    plan = build_plan(
        verdict(kind, (2, "n2")),
        dataclasses.replace(facts(), state=state),
        RemediationConfig(),
        evidence_path=EVIDENCE,
        checkpoint=note(100),
    )
    if acts:
        assert ActionKind.REQUEUE in [a.kind for a in plan.actions], plan
    else:
        assert plan.actions == (), plan
        assert any(
            words in h and kind.value in h and "nothing is drained and the job is not requeued" in h
            for h in plan.held_back
        ), plan.held_back


def test_scout_s_drain_reasons_are_told_from_others():
    from scout_slurm.remediation.plan import is_scout_drain

    reason = drain_reason(verdict(VerdictKind.CRASH, (5, "n3")), "n3", EVIDENCE)
    assert is_scout_drain(reason) and is_scout_drain(reason, 77)
    assert not is_scout_drain(reason, 7) and not is_scout_drain(reason, 777)
    assert not is_scout_drain("bad DIMM (admin)") and not is_scout_drain(
        "bad DIMM, scout: job 77 ", 77
    )


# --- a failure of the job's own software --------------------------------------------------------
def software(restart: int, site: str = "ValueError at train.py:73 in step", step: int = 8):
    import dataclasses

    from scout_slurm.evidence.records import Cause

    return dataclasses.replace(
        verdict(VerdictKind.CRASH, (1, "n2"), first_step=step),
        restart=restart,
        cause=Cause.SOFTWARE,
        cause_evidence=f"rank 1 raised {site}",
        fault_site=site,
    )


def test_a_software_failure_drains_excludes_and_watches_nothing_and_is_retried_once():
    plan = build_plan(
        software(0),
        facts(restarts=0),
        RemediationConfig(),
        evidence_path=EVIDENCE,
        checkpoint=note(4),
        checkpoint_reason="newest eligible",
    )
    kinds = [a.kind for a in plan.actions]
    assert kinds == [ActionKind.REQUEUE, ActionKind.RESUME_FROM]
    assert plan.watched == ()
    assert any("cause software" in h and "no node is drained" in h for h in plan.held_back)


def test_the_same_bug_on_the_rerun_stops_the_requeue_and_says_so():
    plan = build_plan(
        software(1),
        facts(restarts=1),
        RemediationConfig(),
        evidence_path=EVIDENCE,
        earlier=[software(0)],
        software_retries=3,
    )
    assert plan.actions == ()
    assert any(
        "the same ValueError at train.py:73 in step, step 8, on run 0 and run 1: a bug, not a node"
        in h
        for h in plan.held_back
    ), plan.held_back


def test_a_different_software_failure_is_retried_up_to_the_sites_count():
    other = software(1, site="KeyError at data.py:9 in load")
    assert [
        a.kind
        for a in build_plan(
            other,
            facts(restarts=1),
            RemediationConfig(),
            evidence_path=EVIDENCE,
            earlier=[software(0)],
            software_retries=2,
        ).actions
    ] == [ActionKind.REQUEUE]
    held = build_plan(
        other,
        facts(restarts=1),
        RemediationConfig(),
        evidence_path=EVIDENCE,
        earlier=[software(0)],
        software_retries=1,
    )
    assert held.actions == () and any("software_retries = 1" in h for h in held.held_back)


def test_hardware_and_unknown_causes_keep_the_drain_rule():
    import dataclasses

    from scout_slurm.evidence.records import Cause

    for c in (Cause.HARDWARE, Cause.UNKNOWN):
        v = dataclasses.replace(verdict(VerdictKind.CRASH, (1, "n2")), cause=c)
        kinds = [
            a.kind
            for a in build_plan(v, facts(), RemediationConfig(), evidence_path=EVIDENCE).actions
        ]
        assert ActionKind.DRAIN in kinds and ActionKind.EXCLUDE in kinds, (c, kinds)


def test_an_infrastructure_failure_is_excluded_from_the_rerun_never_drained_nor_watched():
    import dataclasses

    from scout_slurm.evidence.records import Cause
    from scout_slurm.remediation.plan import DrainDecision

    v = dataclasses.replace(
        verdict(VerdictKind.CRASH, (1, "n2")),
        cause=Cause.INFRASTRUCTURE,
        cause_evidence="rank 1 raised a storage or network error: OSError: [Errno 98] Address "
        "already in use",
    )
    for decisions in (None, {"n2": DrainDecision(False, "only the job's own evidence")}):
        plan = build_plan(
            v, facts(), RemediationConfig(), evidence_path=EVIDENCE, decisions=decisions
        )
        assert ActionKind.DRAIN not in kinds(plan)
        assert ActionKind.REQUEUE in kinds(plan) and ActionKind.EXCLUDE in kinds(plan)
        assert plan.watched == ()
        assert any(
            "cause infrastructure" in h and "not drained, not watched" in h for h in plan.held_back
        )
