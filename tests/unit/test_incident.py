"""The incident package's seams: the one bounded wait on an injected clock (no test sleeps to pass
time), the Incident's budget, and the pure stages (localise, decide, plan) over plain records."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from scout_slurm.config import DrainConfig, EpilogConfig, EvidenceConfig, SiteConfig
from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.incident import decide, gather, localise, plan
from scout_slurm.incident.budget import Budget, Clock, wait_until
from scout_slurm.incident.decide import NamedNode
from scout_slurm.incident.incident import Incident
from scout_slurm.jobenv import HookContext
from scout_slurm.remediation.plan import DrainDecision, JobFacts, NodeSuspicion, Plan
from scout_slurm.remediation.records import PlanStatus


class FakeClock:
    """Time that passes only when the code under test sleeps."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> Clock:
        return Clock(monotonic=self.monotonic, wall=lambda: 1_700_000_000.0, sleep=self.sleep)


def _ctx(**kw) -> HookContext:
    base = dict(
        job_id=9,
        job_uid=1000,
        job_user="alice",
        cluster="lab",
        restart=0,
        node="",
        job_nodelist="n[1-2]",
        exit_code_raw=256,
        script_context="epilog_slurmctld",
        work_dir="/tmp",
    )
    return HookContext(**{**base, **kw})


def _verdict(kind=VerdictKind.CRASH, nodes=("n2",)) -> Verdict:
    return Verdict(
        job_id=9,
        restart=0,
        kind=kind,
        suspects=tuple(Suspect(i + 1, n, kind, 0.9) for i, n in enumerate(nodes)),
        confidence=0.9,
        reasoning=("test",),
        first_failure_at=1.0,
        first_suspect_step=25,
        world_size=4,
        created_at=2.0,
    )


# --- the one bounded wait ------------------------------------------------------------------------


def test_wait_returns_as_soon_as_done_without_sleeping():
    t = FakeClock()
    got = wait_until(lambda: [], lambda m: not m, seconds=10, clock=t.monotonic, sleep=t.sleep)
    assert got == [] and t.sleeps == []


def test_wait_gives_up_at_its_bound_with_what_it_last_found():
    t = FakeClock()
    looks = []

    def look():
        looks.append(t.now)
        return ["n2"]

    got = wait_until(look, lambda m: not m, seconds=1.0, clock=t.monotonic, sleep=t.sleep)
    assert got == ["n2"]
    assert 1.0 <= t.now - 100.0 < 1.0 + 0.2 + 1e-9  # never past the bound by more than one poll
    assert looks[-1] >= 100.0 + 1.0  # looked once more after the last sleep


def test_wait_sees_what_appears_during_it():
    t = FakeClock()
    appears_at = 100.5
    got = wait_until(
        lambda: t.now >= appears_at, bool, seconds=5.0, clock=t.monotonic, sleep=t.sleep
    )
    assert got is True and appears_at <= t.now < appears_at + 0.2 + 1e-9


def test_a_zero_wait_looks_once():
    t = FakeClock()
    assert wait_until(lambda: 1, lambda v: False, seconds=0, clock=t.monotonic, sleep=t.sleep) == 1
    assert t.sleeps == []


def test_the_budget_counts_from_when_the_hook_began():
    t = FakeClock(now=50.0)
    b = Budget(started=40.0, seconds=30.0, clock=t.clock())
    assert b.deadline == 70.0 and b.elapsed() == 10.0
    assert b.left() == 20.0 and b.left(5.0) == 15.0 and b.left(25.0) == 0.0
    assert b.wait_until(lambda: 0, bool, seconds=b.left(18.0)) == 0 and t.now >= 52.0


def test_an_incident_is_built_from_the_context_and_the_site_config(tmp_path):
    cfg = SiteConfig(
        evidence=EvidenceConfig(root=str(tmp_path)), epilog=EpilogConfig(time_budget_s=60.0)
    )
    t = FakeClock()
    inc = Incident.begin(_ctx(), cfg, started=90.0, clock=t.clock(), holder="batch-host n1")
    assert inc.folder.path == Path(tmp_path) / "lab" / "9"
    assert inc.budget.deadline == 150.0 and inc.budget.left() == 50.0
    assert inc.holder == "batch-host n1" and inc.restart == 0 and inc.job_id == 9


def test_gather_waits_for_the_node_evidence_within_the_budget(tmp_path):
    cfg = SiteConfig(
        evidence=EvidenceConfig(root=str(tmp_path)),
        epilog=EpilogConfig(time_budget_s=60.0, wait_for_nodes_s=3.0),
    )
    t = FakeClock()
    inc = Incident.begin(_ctx(), cfg, started=t.now, clock=t.clock())
    (inc.folder.node_dir("n1")).mkdir(parents=True)
    (inc.folder.node_dir("n1") / "epilog.json").write_text("{}")
    assert gather.wait_for_node_evidence(inc, ("n1", "n2")) == ["n2"]
    assert 3.0 <= t.now - 100.0 < 3.2 + 1e-9  # [epilog] wait_for_nodes_s, not the whole budget
    # with 6 s of the budget left, the wait keeps 5 s back for the rest of the incident
    t.now = 100.0 + 54.0
    assert gather.wait_for_node_evidence(inc, ("n2",)) == ["n2"]
    assert 155.0 <= t.now < 155.0 + 0.2 + 1e-9


# --- localise, decide, plan: pure ------------------------------------------------------------


def test_localise_says_which_nodes_evidence_never_came():
    from scout_slurm.localise.verdict import JobEvidence

    ev = JobEvidence(job_id=9, restart=0, world_size=0)
    v = localise.verdict_of(ev, now=5.0)
    assert not any("missing" in r for r in v.reasoning)
    noted = localise.verdict_of(ev, now=5.0, missing_nodes=["n1", "n2"])
    assert noted.reasoning[-1] == "node epilog evidence missing from: n1, n2"
    assert noted.reasoning[:-1] == v.reasoning and noted.kind == v.kind


def test_a_clean_or_unchecked_verdict_is_no_incident():
    assert not localise.is_incident(_verdict(VerdictKind.CLEAN))
    assert not localise.is_incident(_verdict(VerdictKind.UNCHECKED))
    assert localise.is_incident(_verdict(VerdictKind.CRASH))


def _named(*nodes, corroborated=()) -> dict[str, NamedNode]:
    return {
        n: NamedNode(
            NodeSuspicion(
                node=n,
                gpu_serials=(f"S-{n}",),
                corroborated_by=tuple(corroborated),
                root_checked=bool(corroborated),
            ),
            root_checks=("nvml: found",) if corroborated else (),
            root_findings=tuple(corroborated),
        )
        for n in nodes
    }


def test_decide_names_the_user_and_rules_on_each_named_node():
    assert decide.job_user(_ctx()) == "alice"
    assert decide.job_user(_ctx(job_user="")) == "uid 1000"
    named = {**_named("n1"), **_named("n2", corroborated=("gpu-ecc: 3 uncorrected",))}
    got = decide.drain_decisions(_ctx(), named, [], at=10.0, cfg=DrainConfig())
    assert set(got) == {"n1", "n2"}
    assert got["n2"].drain and not got["n1"].drain, got
    every = decide.drain_decisions(
        _ctx(), named, [], at=10.0, cfg=DrainConfig(drain_on="job-evidence")
    )
    assert all(d.drain for d in every.values())


def test_the_plan_status_follows_the_actions_and_observe_only():
    empty, some = (
        Plan(actions=(), held_back=()),
        _plan(_verdict(), {"n2": DrainDecision(True, "x")}),
    )
    assert plan.plan_status(empty, observe_only=False) == PlanStatus.NOTHING_TO_DO
    assert plan.plan_status(some, observe_only=True) == PlanStatus.OBSERVE_ONLY
    assert plan.plan_status(some, observe_only=False) == PlanStatus.PLANNED
    record = plan.actions_record(9, 0, _verdict(), some, observe_only=False, at=7.0)
    assert record.status == PlanStatus.PLANNED and record.results == ()
    assert record.actions == some.actions and record.created_at == record.updated_at == 7.0


FACTS = JobFacts(
    job_id=9,
    allocation=tuple(f"n{i}" for i in range(1, 7)),
    excluded=(),
    requeue_allowed=True,
    restart_count=0,
    usable_nodes=tuple(f"n{i}" for i in range(1, 11)),
)


def _plan(verdict, decisions) -> Plan:
    from scout_slurm.config import RemediationConfig

    return plan.remediation_plan(
        verdict,
        FACTS,
        RemediationConfig(),
        evidence_path="/e",
        recovery=(None, "no checkpoint"),
        decisions=decisions,
    )


def test_the_decisions_record_says_what_became_of_each_named_node():
    verdict = _verdict(nodes=("n1", "n2"))
    named = {**_named("n1"), **_named("n2", corroborated=("gpu-ecc: 3",))}
    decisions = {
        "n1": DrainDecision(False, "only the job's own evidence: watch list"),
        "n2": DrainDecision(True, "corroborated by gpu-ecc: 3"),
    }
    planned = _plan(verdict, decisions)
    rec = plan.decisions_record(
        _ctx(), verdict, named, decisions, planned, drain_on="corroborated", at=3.0
    )
    rows = {r.node: r for r in rec.nodes}
    assert rows["n2"].outcome == "drain" and rows["n2"].why == "corroborated by gpu-ecc: 3"
    assert rows["n2"].root_checks == ("nvml: found",) and rows["n2"].gpu_serials == ("S-n2",)
    assert rows["n1"].outcome == "watch" and rows["n1"].root_checks == ()
    assert (rec.user, rec.uid, rec.kind, rec.at) == ("alice", 1000, VerdictKind.CRASH, 3.0)
    assert (
        plan.decisions_record(_ctx(), verdict, {}, {}, planned, drain_on="corroborated", at=3.0)
        is None
    )


def test_a_node_a_guard_held_back_is_recorded_as_held_with_the_guards_words():
    verdict = _verdict(nodes=("n2",))
    decisions = {"n2": DrainDecision(True, "corroborated")}
    planned = dataclasses.replace(_plan(verdict, decisions), actions=(), held_back=("guard: x",))
    rec = plan.decisions_record(
        _ctx(), verdict, _named("n2"), decisions, planned, drain_on="corroborated", at=3.0
    )
    assert rec.nodes[0].outcome == "held" and rec.nodes[0].why == "guard: x"
