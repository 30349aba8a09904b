"""The localiser over replay findings: a compute SDC names its rank and node, a two-replica
disagreement (inconclusive finding) makes an otherwise clean run inconclusive and names nobody."""

from __future__ import annotations

import dataclasses

from scout_slurm.evidence.records import (
    ExitRecord,
    Finding,
    FindingKind,
    RankPlace,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.localise.verdict import JobEvidence, localise

NOW = 1_700_000_500.0


def node_of(rank: int) -> str:
    return f"n{rank // 2 + 1}"


def exited(rank: int, code: int = 0) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node=node_of(rank),
        pid=2000 + rank,
        exit_code=code,
        signal=0,
        core_dumped=False,
        at=NOW - 5,
        killed_by_scout=False,
        last_progress=None,
        stderr_tail=(),
        external_termination=False,
    )


def evidence(world: int, *, exits=(), findings=(), job_exit_code: int = 256) -> JobEvidence:
    places = {
        r: RankPlace(
            job_id=77,
            restart=0,
            rank=r,
            local_rank=r % 2,
            world_size=world,
            node=node_of(r),
            hostname=node_of(r),
            task_pid=100 + r,
            child_pid=200 + r,
            gpu_uuids=(),
            cuda_visible_devices="",
            nic="",
            master_addr="",
            master_port=12345,
            started_at=NOW - 600,
        )
        for r in range(world)
    }
    return JobEvidence(
        job_id=77,
        restart=0,
        world_size=world,
        places=places,
        exits={e.rank: e for e in exits},
        snapshots={},
        findings=tuple(findings),
        decision=None,
        job_exit_code=job_exit_code,
    )


def _compute_sdc(rank: int, step: int = 6) -> Finding:
    return Finding(
        rank=rank,
        node="",
        kind=FindingKind.SDC,
        at=NOW - 20,
        step=step,
        since_step=step - 1,
        summary=f"rank {rank}'s recomputation of layer '0' (output) differs from the majority of 4 "
        f"replicas at step {step}: compute corruption",
        component="compute",
    )


def test_compute_sdc_names_the_rank_and_its_node():
    ev = evidence(
        4, exits=[exited(r, 88 if r == 2 else 1) for r in range(4)], findings=[_compute_sdc(2)]
    )
    v = localise(ev, now=NOW)
    assert v.kind == VerdictKind.SDC and [(s.rank, s.node) for s in v.suspects] == [(2, node_of(2))]
    assert v.first_suspect_step == 5 and any("compute corruption" in line for line in v.reasoning)


def test_two_replicas_disagreeing_make_a_clean_exit_inconclusive():
    unsure = Finding(
        rank=0,
        node="",
        kind=FindingKind.INFO,
        at=NOW - 30,
        step=4,
        component="weights",
        summary="no strict majority among 2 replicas (ranks 0, 2) for weights at step 4: "
        "inconclusive",
    )
    ev = evidence(4, exits=[exited(r) for r in range(4)], findings=[unsure], job_exit_code=0)
    v = localise(ev, now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()
    assert unsure.summary in v.reasoning


def test_an_injection_note_alone_keeps_a_clean_run_clean():
    note = Finding(
        rank=1,
        node="n1",
        kind=FindingKind.INFO,
        at=NOW - 30,
        summary="fault injected: noise",
        step=3,
    )
    ev = evidence(4, exits=[exited(r) for r in range(4)], findings=[note], job_exit_code=0)
    ev = dataclasses.replace(
        ev,
        coverage=VoteCoverage(
            restart=0, votes=1, last_clean_step=10, last_vote_step=10, replay_rounds=1, steps=10
        ),
    )
    assert localise(ev, now=NOW).kind == VerdictKind.CLEAN
