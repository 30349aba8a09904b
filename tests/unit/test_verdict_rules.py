"""The localiser's rule table: every row decides at least one plain input, with the kind and the
confidence the table states, and docs/HOW-IT-WORKS.md's verdict section shows the table as
rendered."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from scout_slurm.evidence.flightrec import read_dump
from scout_slurm.evidence.records import ChildState, Finding, FindingKind, StallDecision
from scout_slurm.localise.verdict import RULES, Rule, explain, localise, render_rules_markdown
from tests.unit.test_verdict import (
    NOW,
    _straggler,
    cascade,
    entry,
    evidence,
    exited,
    finished,
    ranks,
    snap,
)

HOW_IT_WORKS = Path(__file__).resolve().parents[2] / "docs" / "HOW-IT-WORKS.md"
BLOCK = re.compile(r"<!-- verdict-rules:begin -->\n(.*?)<!-- verdict-rules:end -->", re.S)


def stall(*culprits: int, kind: FindingKind = FindingKind.HANG) -> StallDecision:
    return StallDecision(
        decided_by=0, at=NOW - 20, culprits=culprits, kind=kind, reasoning=("rank behind",)
    )


def all_clean(world: int = 4) -> list:
    return [exited(r) for r in range(world)]


AGREED = tuple(entry(s) for s in range(1, 9))
ODD = tuple(entry(s) for s in range(1, 6)) + (entry(6, "broadcast", 64),)


# one plain input a rule, and the ranks it names
def _fr_dump(rank: int) -> bytes:
    return (
        Path(__file__).resolve().parents[1]
        / "fixtures"
        / "flight_recorder"
        / f"gloo-2ranks-rank-{rank}.json"
    ).read_bytes()


EXAMPLES = {
    Rule.SDC_VOTE: (
        evidence(
            4,
            exits=all_clean(),
            job_exit_code=0,
            findings=[
                Finding(
                    rank=1, node="n1", kind=FindingKind.SDC, at=NOW - 9, summary="weights differ"
                )
            ],
        ),
        [1],
    ),
    # torch's Flight Recorder (real gloo dumps): ranks 0 and 2 wait inside all_reduce #6, rank 1
    # never enqueued it; scout's own record saw all at the same point (a functional collective)
    Rule.STALL_LEDGER: (
        dataclasses.replace(
            evidence(3, decision=stall()),
            ledger={r: read_dump(_fr_dump(min(r, 1) if r < 2 else 0), r) for r in (0, 1, 2)},
        ),
        [1],
    ),
    Rule.STALL_NO_CULPRIT: (evidence(4, decision=stall()), []),
    Rule.STALL_CRASHED: (evidence(4, decision=stall(1), exits=[exited(1, signal=11)]), [1]),
    Rule.STALL_STOPPED: (
        evidence(
            4,
            decision=stall(1),
            snapshots=[
                snap(r, state=ChildState.STOPPED if r == 1 else ChildState.RUNNING)
                for r in range(4)
            ],
        ),
        [1],
    ),
    Rule.STALL_BEHIND: (evidence(4, decision=stall(1), snapshots=[snap(r) for r in range(4)]), [1]),
    Rule.STALL_WIDE: (
        evidence(4, decision=stall(1, 2), snapshots=[snap(r) for r in range(4)]),
        [1, 2],
    ),
    Rule.DESYNC: (
        evidence(
            4,
            exits=[
                exited(3, signal=6, progress=snap(3, 5, entered=6, recent=AGREED[:6])),
                exited(2, signal=15, progress=snap(2, 5, entered=6, recent=ODD)),
                exited(0, signal=15, progress=snap(0, 7, entered=8, recent=AGREED)),
                exited(1, signal=15, progress=snap(1, 7, entered=8, recent=AGREED)),
            ],
        ),
        [2],
    ),
    Rule.STRAGGLER: (
        evidence(4, exits=all_clean(), job_exit_code=0, findings=[_straggler(3, "n2")]),
        [3],
    ),
    Rule.FAILED_AT_EXIT: (
        evidence(
            4,
            exits=[exited(0, signal=6, progress=finished(0))]
            + [exited(r, progress=finished(r)) for r in (1, 2, 3)],
        ),
        [],
    ),
    Rule.NO_MAJORITY: (
        evidence(
            4,
            exits=all_clean(),
            job_exit_code=0,
            findings=[
                Finding(
                    rank=0,
                    node="n1",
                    kind=FindingKind.INFO,
                    at=NOW - 9,
                    component="weights",
                    summary="state vote inconclusive: replicas 0 and 1 disagree with no majority",
                )
            ],
        ),
        [],
    ),
    Rule.UNWATCHED_CLEAN: (evidence(4, places=False, job_exit_code=0), []),
    Rule.UNWATCHED_FAILED: (evidence(4, places=False, job_exit_code=256), []),
    Rule.TAINTED: (
        evidence(
            4,
            exits=all_clean(),
            job_exit_code=0,
            findings=[
                Finding(
                    rank=r,
                    node="n1",
                    kind=FindingKind.TAINTED,
                    at=NOW - 50,
                    summary=f"TAINTED: rank {r} loaded /ckpt/last.pt, a checkpoint scout rejected",
                    component="resume",
                )
                for r in range(4)
            ],
        ),
        [],
    ),
    Rule.CLEAN: (evidence(4, exits=all_clean(), job_exit_code=0), []),
    Rule.UNCHECKED: (evidence(4, exits=all_clean(), job_exit_code=0, coverage=None), []),
    Rule.MISSING_EXIT: (evidence(4, exits=all_clean()[:3], job_exit_code=256), [3]),
    Rule.FAILED_NO_RANK: (evidence(4, exits=all_clean(), job_exit_code=256), []),
    Rule.CASCADE_MISSING: (evidence(4, exits=[cascade(r) for r in range(3)]), [3]),
    Rule.ALL_CASCADE: (evidence(4, exits=[cascade(r) for r in range(4)]), []),
    Rule.SHARED_FAILURE: (evidence(4, exits=[exited(r, 1) for r in range(3)] + [exited(3)]), []),
    Rule.CRASH_SOLE: (evidence(4, exits=[exited(1, 1)] + [cascade(r) for r in (0, 2, 3)]), [1]),
    Rule.CRASH_FIRST: (
        evidence(
            4,
            exits=[
                exited(1, 1, progress=snap(1, 10)),
                exited(2, 1, progress=snap(2, 20)),
                cascade(0),
                cascade(3),
            ],
        ),
        [1],
    ),
    Rule.CRASH_TIED: (
        evidence(4, exits=[exited(0, 1), exited(2, 1), cascade(1), cascade(3)]),
        [0, 2],
    ),
}


def test_every_rule_has_an_example():
    assert set(EXAMPLES) == set(RULES) == set(Rule)


@pytest.mark.parametrize("rule", list(Rule), ids=lambda r: r.value)
def test_each_rule_decides_its_example_as_the_table_says(rule):
    ev, named = EXAMPLES[rule]
    verdict, consulted = explain(ev, now=NOW)
    assert rule in consulted, (rule, consulted, verdict.reasoning)
    assert verdict == localise(ev, now=NOW)
    assert ranks(verdict) == named, verdict
    row = RULES[rule]
    if row.factor:  # the factor multiplies what the per-culprit rule before it gave
        base = RULES[consulted[0]]
        assert verdict.kind == base.kind
        assert verdict.confidence == round(base.confidence * row.confidence, 3)
    else:
        assert verdict.kind == row.kind
        assert verdict.confidence == row.confidence
        assert all((s.kind, s.confidence) == (row.kind, row.confidence) for s in verdict.suspects)


def test_rules_are_consulted_in_table_order():
    order = list(RULES)
    for rule, (ev, _) in EXAMPLES.items():
        consulted = explain(ev, now=NOW)[1]
        positions = [order.index(r) for r in dict.fromkeys(consulted)]
        assert positions == sorted(positions), (rule, consulted)


def test_how_it_works_shows_the_rule_table_as_rendered():
    found = BLOCK.search(HOW_IT_WORKS.read_text())
    assert found, (
        f"{HOW_IT_WORKS}: no <!-- verdict-rules:begin --> ... <!-- verdict-rules:end --> block in "
        "the verdict section"
    )
    assert found.group(1) == render_rules_markdown(), (
        "docs/HOW-IT-WORKS.md's verdict-rules block differs from the table in "
        "scout_slurm/localise/verdict.py: paste the output "
        "of `python -c 'from scout_slurm.localise.verdict import render_rules_markdown as r; "
        'print(r(), end="")\'`'
    )


def test_the_rendering_has_one_row_a_rule():
    lines = render_rules_markdown().splitlines()
    assert len(lines) == 2 + len(RULES)
    assert all(f"`{r.value}`" in line for r, line in zip(RULES, lines[2:]))


# --- findings by kind, and the words older writers used ------------------------------------


def test_a_no_majority_finding_is_inconclusive_by_kind_or_by_its_words():
    from scout_slurm.evidence.records import is_no_majority

    worded = EXAMPLES[Rule.NO_MAJORITY][0].findings[0]
    typed = dataclasses.replace(
        worded, kind=FindingKind.NO_MAJORITY, summary="replicas 0 and 1 disagree"
    )
    assert is_no_majority(worded) and is_no_majority(typed)
    assert not is_no_majority(
        dataclasses.replace(worded, component="")
    )  # the words alone, no component
    for f in (worded, typed):
        ev = evidence(4, exits=all_clean(), job_exit_code=0, findings=[f])
        assert explain(ev, now=NOW)[1] == (Rule.NO_MAJORITY,)


def test_a_fault_injection_is_known_by_kind_or_by_its_words():
    from scout_slurm.evidence.records import is_fault_injection

    worded = Finding(
        rank=2, node="n2", kind=FindingKind.INFO, at=NOW, summary="fault injected: hang"
    )
    assert is_fault_injection(worded)
    assert is_fault_injection(
        dataclasses.replace(worded, kind=FindingKind.FAULT_INJECTED, summary="hang")
    )
    assert not is_fault_injection(dataclasses.replace(worded, kind=FindingKind.SDC))
    assert not is_fault_injection(dataclasses.replace(worded, summary="a fault injected"))


def test_resume_outcomes():
    from scout_slurm.evidence.records import ResumeOutcome, resume_outcome

    assert (
        resume_outcome("RESUME MISMATCH: rank 0's state restored from x") is ResumeOutcome.MISMATCH
    )
    assert resume_outcome("resume verified: rank 1 restored x (step 10)") is ResumeOutcome.VERIFIED
    assert resume_outcome("no checkpoint record for x") is ResumeOutcome.OTHER
