"""`scout show` and the incident report: the suspect rank and node are named, the timeline has
one row per rank, and each action says whether it was done, FAILED or is still pending."""

from __future__ import annotations

import re

from scout_slurm.evidence.records import (
    ChildState,
    ExitRecord,
    ProgressSnapshot,
    RankPlace,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.localise.verdict import JobEvidence, localise
from scout_slurm.remediation.records import (
    ActionKind,
    ActionResult,
    ActionsRecord,
    Drain,
    Exclude,
    PlannedAction,
    PlanStatus,
    Requeue,
    ResumeFrom,
)
from scout_slurm.report.markdown import render_actions, render_incident_markdown
from scout_slurm.report.show import render_show, render_timeline, render_verdict

NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
WORLD = 4
GLOO = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.11]:5123"


def node(rank: int) -> str:
    return f"node0{rank // 2 + 1}"


def snap(
    rank: int, completed: int, *, state=ChildState.RUNNING, inside: bool = True
) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=node(rank),
        pid=100 + rank,
        published_at=NOW,
        child_state=state,
        coll_entered=completed + int(inside),
        coll_completed=completed,
        in_collective=inside,
        current_op="all_reduce" if inside else "none",
        opt_steps=completed // 4,
        pg_seq=completed,
        idle_s=0.0,
        step_time_s=0.1,
    )


def exit_rec(
    rank: int, code: int = 0, *, signal: int = 0, stderr=(), by_scout=False, progress=None
) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node=node(rank),
        pid=100 + rank,
        exit_code=-1 if signal else code,
        signal=signal,
        core_dumped=False,
        at=NOW - 10,
        killed_by_scout=by_scout,
        last_progress=progress,
        stderr_tail=stderr,
    )


def place(rank: int) -> RankPlace:
    return RankPlace(
        job_id=4711,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=WORLD,
        node=node(rank),
        hostname=node(rank),
        task_pid=1,
        child_pid=2,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="",
        master_addr="",
        master_port=1,
        started_at=NOW - 100,
    )


def crash_evidence() -> JobEvidence:
    exits = {
        3: exit_rec(3, signal=11, progress=snap(3, 40)),
        0: exit_rec(0, 1, stderr=(GLOO,), progress=snap(0, 41)),
        1: exit_rec(1, signal=9, by_scout=True, progress=snap(1, 41)),
    }
    # rank 2 left no exit record, only a snapshot
    return JobEvidence(
        job_id=4711,
        restart=0,
        world_size=WORLD,
        places={r: place(r) for r in range(WORLD)},
        exits=exits,
        snapshots={2: snap(2, 41, state=ChildState.STOPPED, inside=False)},
        job_exit_code=256,
    )


def timeline_rows(lines: list[str]) -> list[str]:
    return [ln for ln in lines if re.match(r"^\s*\d+\s+node", ln)]


def test_show_names_the_suspect_rank_and_node():
    ev = crash_evidence()
    v = localise(ev, now=NOW)
    assert v.kind == VerdictKind.CRASH
    text = render_show(4711, "lab", 0, v, ev, computed=True)
    assert text.startswith(
        "job 4711 on cluster lab, run 0 (verdict computed now from the evidence)"
    )
    assert "verdict: crash  (confidence 0.95)" in text
    assert "rank 3 on node node02: crash (0.95)" in text
    assert "rank 3 killed by SIGSEGV" in text
    assert f"first suspect step: {40 // 4 + 1}" in text
    assert text.endswith("\n")


def test_timeline_has_one_row_per_rank():
    ev = crash_evidence()
    rows = timeline_rows(render_timeline(ev))
    assert len(rows) == WORLD
    assert [int(r.split()[0]) for r in rows] == list(range(WORLD))
    by_rank = dict(enumerate(rows))
    assert (
        "node01" in by_rank[0] and "[cascade]" in by_rank[0] and "exited with code 1" in by_rank[0]
    )
    assert "killed by SIGKILL [scout ended it]" in by_rank[1]
    assert (
        "stopped" in by_rank[2]
        and "between collectives" in by_rank[2]
        and by_rank[2].endswith("no exit record")
    )
    assert "killed by SIGSEGV" in by_rank[3] and "inside all_reduce" in by_rank[3]
    assert "[cascade]" not in by_rank[3]


def test_timeline_row_without_progress():
    ev = JobEvidence(
        job_id=1, restart=0, world_size=3, exits={0: exit_rec(0)}, places={1: place(1)}
    )
    rows = timeline_rows(render_timeline(ev))
    assert len(rows) == 2  # rank 2 is nowhere: node "?"
    lines = render_timeline(ev)
    assert sum(1 for ln in lines if "no progress record" in ln) == 3
    assert any(ln.split()[:2] == ["2", "?"] for ln in lines)
    assert "exited with code 0" in lines[2] and lines[3].rstrip().endswith("no exit record")


def test_clean_verdict_names_nobody():
    cov = VoteCoverage(
        restart=0,
        votes=1,
        last_clean_step=8,
        last_vote_step=8,
        replay_rounds=None,
        steps=8,
        votes_every=8,
        final_vote="not needed: the last vote was at the last step (8)",
    )
    ev = JobEvidence(
        job_id=1,
        restart=0,
        world_size=2,
        exits={r: exit_rec(r, progress=snap(r, 8)) for r in range(2)},
        job_exit_code=0,
        coverage=cov,
    )
    v = localise(ev, now=NOW)
    lines = render_verdict(v)
    assert lines[0] == "verdict: clean  (confidence 1.00)"
    # what was checked is part of the verdict
    at = lines.index("checks that ran:")
    assert lines[at + 1 : at + 5] == [
        "  state votes (every 8 steps): 1, the last at step 8, every replica agreed up to step 8",
        "  end-of-training vote: not needed: the last vote was at the last step (8)",
        "  in-situ replay: off",
        "  timing votes (off): 0 rounds",
    ]
    assert "suspects: none" in lines
    assert not any(ln.startswith("first suspect step") for ln in lines)
    assert all("exited 0" in r for r in timeline_rows(render_timeline(ev)))


def actions_record(results: tuple[ActionResult, ...], status=PlanStatus.PARTIAL) -> ActionsRecord:
    actions = (
        PlannedAction.of(Drain("node02", "scout: crash rank 3 job 4711 run 0 conf 0.95 see /e")),
        PlannedAction.of(Requeue(4711)),
        PlannedAction.of(Exclude(4711, ("node02",))),
        PlannedAction.of(ResumeFrom("/ckpt/step-8.pt", 8, 11, "")),
    )
    return ActionsRecord(
        job_id=4711,
        restart=0,
        verdict_kind=VerdictKind.CRASH,
        status=status,
        actions=actions,
        held_back=("restart limit reached (3 of 3): not requeued",),
        results=results,
        created_at=NOW,
        updated_at=NOW,
    )


def test_actions_show_done_failed_and_pending():
    results = (
        ActionResult(ActionKind.DRAIN, "node02", True, "scontrol update: ok", 1, NOW),
        ActionResult(
            ActionKind.REQUEUE, "4711", False, "scontrol requeue: timed out after 30 s", 3, NOW
        ),
    )
    lines = render_actions(actions_record(results))
    assert lines[0] == "status: partial"
    assert lines[1] == (
        "- [done] drain node node02: scout: crash rank 3 job 4711 run 0 conf 0.95 see /e"
        " -> scontrol update: ok"
    )
    assert lines[2] == "- [FAILED] requeue job 4711 -> scontrol requeue: timed out after 30 s"
    assert lines[3] == "- [pending] set job 4711 excluded nodes to node02"
    assert (
        lines[4]
        == "- [pending] resume from checkpoint /ckpt/step-8.pt (step 8, before first suspect "
        "step 11)"
    )
    assert lines[5] == "- held back: restart limit reached (3 of 3): not requeued"


def test_no_actions_recorded():
    assert render_actions(None) == ["no remediation recorded"]


def test_incident_markdown():
    ev = crash_evidence()
    v = localise(ev, now=NOW)
    record = actions_record((ActionResult(ActionKind.DRAIN, "node02", True, "ok", 1, NOW),))
    md = render_incident_markdown(v, ev, record)
    assert md.startswith("# scout incident: job 4711, run 0\n")
    assert "Written 2023-11-14 22:13:20 UTC." in md
    for section in ("## Verdict", "## Timeline", "## Actions"):
        assert f"\n{section}\n" in md
    assert md.count("```") == 4
    assert "rank 3 on node node02: crash" in md
    assert len(timeline_rows(md.splitlines())) == WORLD
    assert "- [done] drain node node02" in md and "- [pending] requeue job 4711" in md


def test_show_lists_actions_when_given():
    ev = crash_evidence()
    v = localise(ev, now=NOW)
    text = render_show(
        4711, "lab", 0, v, ev, ["status: applied", "- [done] requeue job 4711"], computed=False
    )
    assert "(verdict recorded by the epilog)" in text
    assert text.endswith("actions:\n  status: applied\n  - [done] requeue job 4711\n")
