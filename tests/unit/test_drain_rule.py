"""The drain rule (remediation/plan.py, `drain_decision`) as a table, and what build_plan does
with its word: a node the rule does not drain is excluded from the job's rerun all the same."""

from __future__ import annotations

import re

import pytest

from scout_slurm.config import DrainConfig, RemediationConfig
from scout_slurm.evidence.records import Suspect, Verdict, VerdictKind
from scout_slurm.remediation.plan import (
    DrainDecision,
    JobFacts,
    NodeSuspicion,
    PastIncident,
    build_plan,
    drain_decision,
)

DAY = 86400.0
NOW = 100 * DAY
CORROBORATED = DrainConfig()
OLD_RULE = DrainConfig(drain_on="job-evidence")


def node(name="n1", serials=(), corroborated=(), checked=True) -> NodeSuspicion:
    return NodeSuspicion(name, tuple(serials), tuple(corroborated), checked)


def past(job, user, node_name="n1", serials=(), age=DAY) -> PastIncident:
    return PastIncident(
        job_id=job,
        user=user,
        node=node_name,
        gpu_serials=tuple(serials),
        kind="crash",
        at=NOW - age,
    )


# (what the row shows, suspicion, earlier incidents, config, drained?, words the reason must hold)
TABLE = [
    (
        "job evidence alone, first incident: watched",
        node(),
        [],
        CORROBORATED,
        False,
        ["only the job's own evidence", "root checks found nothing", "watch list"],
    ),
    (
        "no root check on record at all: watched",
        node(checked=False),
        [],
        CORROBORATED,
        False,
        ["no root check on record"],
    ),
    (
        "root check corroborates: drained on the first incident",
        node(corroborated=["nvidia-xid: NVRM: Xid 79"]),
        [],
        CORROBORATED,
        True,
        ["corroborated by root check: nvidia-xid: NVRM: Xid 79"],
    ),
    (
        "an earlier incident of another user on the node: drained",
        node(),
        [past(7, "bob")],
        CORROBORATED,
        True,
        ["2 incidents from 2 users", "bob job 7", "alice job 9"],
    ),
    (
        "earlier incidents all from the same user: still one word",
        node(),
        [past(7, "alice"), past(8, "alice")],
        CORROBORATED,
        False,
        ["2 earlier incident(s) here, all from alice"],
    ),
    (
        "the other user's incident is older than the window: watched",
        node(),
        [past(7, "bob", age=31 * DAY)],
        CORROBORATED,
        False,
        ["only the job's own evidence"],
    ),
    (
        "another node's incident does not count",
        node(),
        [past(7, "bob", node_name="n2")],
        CORROBORATED,
        False,
        ["only the job's own evidence"],
    ),
    (
        "the same GPU serial named on another node by another user: drained",
        node(serials=["1320"]),
        [past(7, "bob", node_name="n3", serials=["1320"])],
        CORROBORATED,
        True,
        ["2 incidents from 2 users"],
    ),
    (
        "an earlier run of this same job does not count",
        node(),
        [past(9, "bob")],
        CORROBORATED,
        False,
        ["only the job's own evidence"],
    ),
    (
        "a site that asks for three users: two are not enough",
        node(),
        [past(7, "bob")],
        DrainConfig(min_users=3),
        False,
        ["only the job's own evidence"],
    ),
    (
        "three users where three are asked",
        node(),
        [past(7, "bob"), past(8, "carol")],
        DrainConfig(min_users=3),
        True,
        ["3 incidents from 3 users"],
    ),
    (
        "the old rule: the job's evidence drains",
        node(),
        [],
        OLD_RULE,
        True,
        ["drain_on = job-evidence"],
    ),
]


@pytest.mark.parametrize(
    "what,suspicion,earlier,cfg,drained,words", TABLE, ids=[row[0] for row in TABLE]
)
def test_drain_rule_table(what, suspicion, earlier, cfg, drained, words):
    d = drain_decision(suspicion, job_id=9, user="alice", at=NOW, past=earlier, cfg=cfg)
    assert d.drain is drained, d
    for w in words:
        assert w in d.why, (w, d.why)


def _verdict(kind=VerdictKind.CRASH) -> Verdict:
    return Verdict(
        job_id=9,
        restart=0,
        kind=kind,
        suspects=(Suspect(2, "n2", kind, 0.95),),
        confidence=0.95,
        reasoning=("test",),
        first_suspect_step=25,
        first_failure_at=1.0,
        world_size=4,
        created_at=2.0,
    )


FACTS = JobFacts(
    job_id=9,
    allocation=("n1", "n2"),
    excluded=(),
    requeue_allowed=True,
    restart_count=0,
    usable_nodes=("n1", "n2", "n3", "n4"),
)


def test_a_watched_node_is_excluded_from_the_rerun_and_not_drained():
    plan = build_plan(
        _verdict(),
        FACTS,
        RemediationConfig(),
        evidence_path="/e",
        decisions={"n2": DrainDecision(False, "only the job's own evidence (x): watch list")},
    )
    kinds = [a.kind.value for a in plan.actions]
    assert kinds == ["requeue", "exclude"], plan
    assert plan.actions[1].payload.nodes == ("n2",)
    assert plan.watched == ("n2",)
    assert any(h.startswith("node n2: only the job's own evidence") for h in plan.held_back), (
        plan.held_back
    )


def test_a_drain_the_rule_allows_says_why_in_the_reason():
    why = "2 incidents from 2 users (bob job 7, alice job 9)"
    plan = build_plan(
        _verdict(),
        FACTS,
        RemediationConfig(),
        evidence_path="/e",
        decisions={"n2": DrainDecision(True, why)},
    )
    assert [a.kind.value for a in plan.actions] == ["drain", "requeue", "exclude"]
    reason = plan.actions[0].payload.reason
    assert reason.startswith("scout: crash rank 2 job 9 run 0 conf 0.95") and why in reason, reason
    assert plan.watched == ()


def test_guards_still_hold_a_watched_node_back():
    """Below the site's confidence the node is neither drained nor excluded: the guards come
    first.
    """
    low = Verdict(
        job_id=9,
        restart=0,
        kind=VerdictKind.CRASH,
        suspects=(Suspect(2, "n2", VerdictKind.CRASH, 0.5),),
        confidence=0.5,
        reasoning=(),
        first_suspect_step=25,
        first_failure_at=1.0,
        world_size=4,
        created_at=2.0,
    )
    plan = build_plan(
        low,
        FACTS,
        RemediationConfig(),
        evidence_path="/e",
        decisions={"n2": DrainDecision(False, "only the job's own evidence")},
    )
    assert plan.actions == () and plan.watched == ()


@pytest.mark.parametrize(
    "raw,words",
    [
        ({"drain_on": "always"}, "[drain] drain_on must be 'corroborated' or 'job-evidence'"),
        ({"min_users": 1}, "[drain] min_users must be at least 2"),
    ],
)
def test_drain_settings_are_checked(raw, words):
    from scout_slurm.config import parse_config
    from scout_slurm.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_config({"drain": raw}, source="t.toml")
    assert parse_config({"drain": {"drain_on": "job-evidence"}}).drain == OLD_RULE
