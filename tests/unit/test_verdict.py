"""The localiser over plain evidence: an agreed stall names its culprit, a crash names the rank
that failed on its own (not the peers that died of it), a failure most ranks share names nobody,
and a clean run names nobody."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout_slurm.evidence.gather import gather_evidence
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ChildState,
    CollectiveEntry,
    ExitRecord,
    Finding,
    FindingKind,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.evidence.store import write_record
from scout_slurm.localise.verdict import (
    JobEvidence,
    describe_exit,
    is_abnormal,
    is_cascade,
    localise,
)

NOW = 1_700_000_500.0
GLOO_PEER = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [10.0.0.12]:36411"
)


def node_of(rank: int) -> str:
    return f"n{rank // 2 + 1}"  # two ranks per node: n1 holds 0-1, n2 holds 2-3, ...


def entry(seq: int, op: str = "all_reduce", nbytes: int = 4096) -> CollectiveEntry:
    return CollectiveEntry(
        seq=seq, op=op, nbytes=nbytes, group_size=4, entered_ns=seq * 10, left_ns=seq * 10 + 5
    )


def snap(
    rank: int,
    completed: int = 30,
    *,
    entered: int | None = None,
    steps: int = 10,
    state: ChildState = ChildState.RUNNING,
    recent: tuple[CollectiveEntry, ...] = (),
) -> ProgressSnapshot:
    entered = completed + 1 if entered is None else entered
    return ProgressSnapshot(
        rank=rank,
        node=node_of(rank),
        pid=2000 + rank,
        published_at=NOW - 10,
        child_state=state,
        coll_entered=entered,
        coll_completed=completed,
        in_collective=entered > completed,
        current_op="all_reduce",
        opt_steps=steps,
        pg_seq=completed,
        idle_s=90.0,
        step_time_s=0.4,
        recent=recent,
    )


def place(rank: int, world: int) -> RankPlace:
    return RankPlace(
        job_id=77,
        restart=0,
        rank=rank,
        local_rank=rank % 2,
        world_size=world,
        node=node_of(rank),
        hostname=node_of(rank) + ".cluster",
        task_pid=100 + rank,
        child_pid=200 + rank,
        gpu_uuids=(),
        cuda_visible_devices="",
        nic="",
        master_addr="",
        master_port=12345,
        started_at=NOW - 600,
    )


def exited(
    rank: int,
    code: int = 0,
    *,
    signal: int = 0,
    at: float = NOW - 5,
    stderr: tuple[str, ...] = (),
    by_scout: bool = False,
    external: bool = False,
    progress: ProgressSnapshot | None = None,
    node: str | None = None,
) -> ExitRecord:
    return ExitRecord(
        rank=rank,
        node=node or node_of(rank),
        pid=2000 + rank,
        exit_code=-1 if signal else code,
        signal=signal,
        core_dumped=signal == 11,
        at=at,
        killed_by_scout=by_scout,
        last_progress=progress,
        stderr_tail=stderr,
        external_termination=external,
    )


def cascade(rank: int, **kw) -> ExitRecord:
    return exited(rank, 1, stderr=("Traceback (most recent call last):", GLOO_PEER), **kw)


# a run in which scout's checks ran (two state votes, both clean; replay and timing rounds)
CHECKED = VoteCoverage(
    restart=0,
    votes=2,
    last_clean_step=40,
    last_vote_step=40,
    replay_rounds=2,
    timing_rounds=1,
    votes_every=20,
    replay_every=20,
    timing_every=25,
    steps=40,
    final_vote="not needed",
)


def evidence(
    world: int,
    *,
    exits=(),
    snapshots=(),
    findings=(),
    decision=None,
    job_exit_code: int = 256,
    places: bool = True,
    coverage: VoteCoverage | None = CHECKED,
) -> JobEvidence:
    return JobEvidence(
        job_id=77,
        restart=0,
        world_size=world,
        places={r: place(r, world) for r in range(world)} if places else {},
        exits={e.rank: e for e in exits},
        snapshots={s.rank: s for s in snapshots},
        findings=tuple(findings),
        decision=decision,
        job_exit_code=job_exit_code,
        coverage=coverage if places else None,
    )


def ranks(v) -> list[int]:
    return [s.rank for s in v.suspects]


# --- is_cascade, describe_exit ------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        exited(1, by_scout=True, signal=9),
        exited(1, external=True, code=1),
        exited(1, signal=15),
        exited(1, signal=1),
        exited(1, signal=2),
        exited(1, 1, stderr=(GLOO_PEER,)),
        exited(
            1,
            1,
            stderr=(
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275",
            ),
        ),
        exited(
            1,
            1,
            stderr=(
                "[E ProcessGroupNCCL.cpp:828] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=812, OpType=ALLREDUCE) ran for 600000 milliseconds",
            ),
        ),
        exited(
            1,
            1,
            stderr=(
                "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "1800000ms "
                "for recv operation to complete",
            ),
        ),
    ],
    ids=[
        "killed-by-scout",
        "external-termination",
        "sigterm",
        "sighup",
        "sigint",
        "gloo-peer-closed",
        "nccl-error",
        "nccl-watchdog-timeout",
        "gloo-recv-timeout",
    ],
)
def test_failures_caused_by_a_peer_or_by_someone_stopping_us_are_cascades(record):
    assert is_cascade(record)


@pytest.mark.parametrize(
    "record",
    [
        exited(1, 3),
        exited(1, signal=9),
        exited(1, signal=11),
        exited(1, signal=6),
        exited(1, 1, stderr=("Traceback (most recent call last):", "ValueError: loss is nan")),
    ],
    ids=["exit-3", "sigkill", "sigsegv", "sigabrt", "python-exception"],
)
def test_failures_on_its_own_are_not_cascades(record):
    assert not is_cascade(record)


def test_describe_exit():
    assert describe_exit(exited(0, 3)) == "exited with code 3"
    assert describe_exit(exited(0, signal=9)) == "killed by SIGKILL"
    assert describe_exit(exited(0, signal=11)) == "killed by SIGSEGV (core dumped)"
    assert describe_exit(exited(0, signal=40)) == "killed by signal 40"


def test_is_abnormal():
    assert not is_abnormal(exited(0, 0))
    assert is_abnormal(exited(0, 1))
    assert is_abnormal(exited(0, signal=9))


# --- an agreed stall ----------------------------------------------------------------------


def decision(
    *culprits: int, kind: FindingKind = FindingKind.HANG, reasoning=("rank behind",)
) -> StallDecision:
    return StallDecision(
        decided_by=0, at=NOW - 30, culprits=culprits, kind=kind, reasoning=reasoning
    )


def test_hang_decision_names_the_culprit_with_its_node():
    world = 8
    snaps = [snap(r, 40) for r in range(world)]
    snaps[5] = snap(5, 38, steps=12)
    v = localise(
        evidence(
            world,
            snapshots=snaps,
            decision=decision(5),
            exits=[exited(r, by_scout=True, signal=15) for r in range(world)],
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.HANG
    assert ranks(v) == [5]
    assert v.suspects[0].node == "n3"
    assert v.suspect_nodes == ("n3",)
    assert v.suspects[0].kind == VerdictKind.HANG
    assert v.confidence == pytest.approx(0.9)
    assert v.first_failure_at == NOW - 30
    assert v.first_suspect_step == 13
    assert v.created_at == NOW and v.world_size == world and v.job_id == 77


def test_stopped_process_raises_confidence():
    snaps = [snap(r) for r in range(8)]
    snaps[2] = snap(2, state=ChildState.STOPPED)
    v = localise(evidence(8, snapshots=snaps, decision=decision(2)), now=NOW)
    assert ranks(v) == [2]
    assert v.suspects[0].confidence == pytest.approx(0.95)
    assert v.confidence == pytest.approx(0.95)
    assert "rank 2's process was stopped" in v.suspects[0].evidence


def test_disk_sleep_raises_confidence_too():
    snaps = [snap(r) for r in range(8)]
    snaps[2] = snap(2, state=ChildState.DISK_SLEEP)
    assert localise(
        evidence(8, snapshots=snaps, decision=decision(2)), now=NOW
    ).confidence == pytest.approx(0.95)


def test_many_culprits_lower_the_confidence():
    v = localise(
        evidence(4, snapshots=[snap(r) for r in range(4)], decision=decision(1, 2)), now=NOW
    )
    assert ranks(v) == [1, 2]
    assert v.confidence == pytest.approx(0.72)


def test_decision_with_no_culprits_is_inconclusive():
    v = localise(
        evidence(4, decision=decision(reasoning=("every rank stopped at the same point",))), now=NOW
    )
    assert v.kind == VerdictKind.INCONCLUSIVE
    assert v.suspects == ()
    assert "every rank stopped at the same point" in v.reasoning


def test_decision_naming_only_ranks_outside_the_world_is_inconclusive():
    v = localise(evidence(4, decision=decision(4, -1, 99)), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE
    assert v.suspects == ()


def test_desync_decision_says_so():
    v = localise(evidence(4, decision=decision(3, kind=FindingKind.DESYNC)), now=NOW)
    assert v.kind == VerdictKind.HANG and ranks(v) == [3]
    assert any("desync" in line for line in v.suspects[0].evidence)
    assert v.first_suspect_step == -1  # no progress known for rank 3


def test_decision_comes_before_the_exits():
    # the watchdog killed rank 1 after deciding; rank 1's SIGKILL is not a crash of its own
    exits = [exited(1, signal=9, by_scout=True)] + [cascade(r) for r in (0, 2, 3)]
    v = localise(evidence(4, exits=exits, decision=decision(1)), now=NOW)
    assert v.kind == VerdictKind.HANG and ranks(v) == [1]


# --- crashes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,signal,described",
    [
        (3, 0, "exited with code 3"),
        (-1, 9, "killed by SIGKILL"),
        (-1, 11, "killed by SIGSEGV (core dumped)"),
    ],
)
def test_single_primary_crash_is_named_and_the_cascades_are_not(code, signal, described):
    world = 8
    primary = exited(6, code, signal=signal, at=NOW - 50, progress=snap(6, 44, steps=21))
    others = [
        cascade(r, at=NOW - 20 - r, progress=snap(r, 45, steps=21)) for r in range(world) if r != 6
    ]
    v = localise(evidence(world, exits=[primary, *others]), now=NOW)
    assert v.kind == VerdictKind.CRASH
    assert ranks(v) == [6]
    assert v.suspects[0].node == "n4"
    assert v.suspects[0].kind == VerdictKind.CRASH
    assert v.confidence == pytest.approx(0.95)
    assert f"rank 6 {described}" in v.suspects[0].evidence
    assert v.first_suspect_step == 22
    assert v.first_failure_at == NOW - 50
    assert any("cascade" in line and "[0, 1, 2, 3, 4, 5, 7]" in line for line in v.reasoning)


def test_primary_crash_named_even_when_a_cascade_died_earlier_by_wall_clock():
    # the peers' clocks may be ahead; progress order, not wall time, decides across nodes
    primary = exited(3, 3, at=NOW - 5, progress=snap(3, 10))
    others = [cascade(r, at=NOW - 100, progress=snap(r, 11)) for r in (0, 1, 2)]
    v = localise(evidence(4, exits=[primary, *others]), now=NOW)
    assert ranks(v) == [3]


@pytest.mark.parametrize(
    "how",
    [dict(by_scout=True, signal=9), dict(external=True, code=143), dict(signal=15)],
    ids=["killed-by-scout", "external-termination", "sigterm"],
)
def test_scout_kills_slurm_terminations_and_sigterm_are_not_blamed(how):
    primary = exited(2, signal=11, progress=snap(2, 20))
    others = [exited(r, progress=snap(r, 21), **how) for r in (0, 1, 3)]
    v = localise(evidence(4, exits=[primary, *others]), now=NOW)
    assert v.kind == VerdictKind.CRASH
    assert ranks(v) == [2]


def test_failure_shared_by_most_ranks_is_inconclusive():
    err = ("Traceback (most recent call last):", "KeyError: 'labels'")
    exits = [exited(r, 1, stderr=err, progress=snap(r, 3, steps=0)) for r in range(8)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE
    assert v.suspects == ()
    assert v.confidence == 0.0
    assert any("8 of 8 ranks failed on their own" in line for line in v.reasoning)


def test_failure_of_five_of_eight_is_still_shared():
    exits = [exited(r, 1, progress=snap(r)) for r in range(5)] + [cascade(r) for r in range(5, 8)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()


def test_primary_further_behind_in_progress_wins():
    exits = [
        exited(1, 1, at=NOW - 100, progress=snap(1, 50)),  # earlier by wall clock, but ahead
        exited(5, 1, at=NOW - 10, progress=snap(5, 47, steps=9)),
    ]
    exits += [cascade(r) for r in range(8) if r not in (1, 5)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert v.kind == VerdictKind.CRASH
    assert ranks(v) == [5]
    assert v.confidence == pytest.approx(0.85)
    assert v.first_suspect_step == 10
    assert any("later in progress: ranks [1]" in line for line in v.reasoning)


def test_ties_across_nodes_name_each_nodes_first():
    # same progress on n1 and n3: rank 1's later wall clock is not compared with n3's clocks;
    # within n3, rank 5 failed before rank 4
    exits = [
        exited(1, 1, at=NOW - 10, progress=snap(1, 30)),  # n1
        exited(4, 1, at=NOW - 90, progress=snap(4, 30)),  # n3
        exited(5, 1, at=NOW - 95, progress=snap(5, 30)),
    ]  # n3, first on its node
    exits += [cascade(r) for r in (0, 2, 3, 6, 7)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert v.kind == VerdictKind.CRASH
    assert ranks(v) == [1, 5]
    assert v.suspect_nodes == ("n1", "n3")
    assert v.confidence == pytest.approx(0.6)


def test_tie_within_a_node_is_broken_by_wall_time():
    exits = [
        exited(2, signal=6, at=NOW - 10, progress=snap(2, 30)),
        exited(3, signal=6, at=NOW - 12, progress=snap(3, 30)),
    ]
    exits += [cascade(r) for r in (0, 1, 4, 5, 6, 7)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert ranks(v) == [3]
    assert v.suspects[0].node == "n2"
    assert v.confidence == pytest.approx(0.85)
    assert v.first_failure_at == NOW - 12


def test_progress_from_the_exit_record_beats_a_stale_snapshot():
    # the snapshot of rank 1 is older than the progress its exit record carries
    exits = [
        exited(1, 1, progress=snap(1, 60, steps=30)),
        exited(2, 1, progress=snap(2, 55, steps=27)),
    ]
    exits += [cascade(r) for r in (0, 3, 4, 5, 6, 7)]
    snaps = [snap(1, 10, steps=2)]
    v = localise(evidence(8, exits=exits, snapshots=snaps), now=NOW)
    assert ranks(v) == [2]
    assert v.first_suspect_step == 28


def test_desync_ring_wins_over_an_abort_on_a_neighbour():
    world = 4
    agreed = tuple(entry(s) for s in range(1, 9))
    odd = tuple(entry(s) for s in range(1, 6)) + (entry(6, "broadcast", 64),)
    # rank 3 aborted on its own (gloo's enforce on a size mismatch) before rank 2 got anywhere
    exits = [
        exited(3, signal=6, at=NOW - 40, progress=snap(3, 5, entered=6, recent=agreed[:6])),
        exited(2, signal=15, at=NOW - 30, progress=snap(2, 5, entered=6, recent=odd)),
        exited(0, signal=15, at=NOW - 30, progress=snap(0, 7, entered=8, recent=agreed)),
        exited(1, signal=15, at=NOW - 30, progress=snap(1, 7, entered=8, recent=agreed)),
    ]
    v = localise(evidence(world, exits=exits), now=NOW)
    assert v.kind == VerdictKind.HANG
    assert ranks(v) == [2]
    assert v.suspects[0].node == "n2"
    assert any("desync" in line for line in v.suspects[0].evidence)


def test_desync_needs_every_rank_s_ring():
    agreed = tuple(entry(s) for s in range(1, 6))
    odd = agreed[:4] + (entry(5, "broadcast", 64),)
    exits = [
        exited(3, signal=6, progress=snap(3, 5, recent=agreed)),
        exited(2, signal=15, progress=snap(2, 5, recent=odd)),
        exited(0, signal=15, progress=snap(0, 5, recent=agreed)),
        exited(1, signal=15),
    ]  # no progress: no ring to compare
    v = localise(evidence(4, exits=exits), now=NOW)
    assert v.kind == VerdictKind.CRASH and ranks(v) == [3]


# --- missing records, clean runs ----------------------------------------------------------


def test_missing_exit_record_of_a_minority_while_the_others_cascade_is_infra():
    exits = [cascade(r) for r in range(8) if r != 6]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert v.kind == VerdictKind.INFRA
    assert ranks(v) == [6]
    assert v.suspects[0].node == "n4"
    assert v.suspects[0].kind == VerdictKind.INFRA


def test_missing_exit_record_of_a_minority_in_a_failed_job_is_infra():
    exits = [exited(r, 0) for r in range(4) if r != 1]
    v = localise(evidence(4, exits=exits, job_exit_code=9), now=NOW)
    assert v.kind == VerdictKind.INFRA
    assert ranks(v) == [1]
    assert v.suspects[0].node == "n1"


def test_missing_record_node_known_from_the_snapshot_when_no_place():
    exits = [cascade(r) for r in (0, 1, 3)]
    v = localise(evidence(4, exits=exits, snapshots=[snap(2)], places=False), now=NOW)
    assert ranks(v) == [2] and v.suspects[0].node == "n2"


def test_missing_records_of_a_majority_is_inconclusive():
    v = localise(evidence(4, exits=[cascade(0), cascade(1)]), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()


def test_only_cascades_and_no_missing_record_is_inconclusive():
    v = localise(evidence(4, exits=[cascade(r) for r in range(4)]), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()


def test_failed_job_with_every_rank_exiting_zero_is_inconclusive():
    v = localise(evidence(4, exits=[exited(r) for r in range(4)], job_exit_code=256), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()


@pytest.mark.parametrize("job_exit_code", [0, -1])
def test_clean_run_names_nobody(job_exit_code):
    v = localise(
        evidence(
            4, exits=[exited(r, progress=snap(r)) for r in range(4)], job_exit_code=job_exit_code
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.CLEAN
    assert v.suspects == ()
    assert v.confidence == 1.0
    # clean says which checks found nothing
    assert v.coverage == CHECKED
    assert "nothing found by the checks that ran:" in v.reasoning
    assert (
        "state votes (every 20 steps): 2, the last at step 40, every replica agreed up to step 40"
        in v.reasoning
    )


@pytest.mark.parametrize(
    "coverage",
    [
        None,  # no record of any check
        VoteCoverage(
            restart=0,
            votes=0,
            last_clean_step=-1,
            last_vote_step=-1,
            replay_rounds=None,
            timing_rounds=0,
            steps=10,
            final_vote="not made: state votes are off",
        ),  # votes off, 10 steps < timing K
        VoteCoverage(
            restart=0,
            votes=0,
            last_clean_step=-1,
            last_vote_step=-1,
            replay_rounds=3,
            replay_failed_rounds=3,
            steps=40,
        ),  # every replay round failed
    ],
    ids=["no-record", "votes-off", "replay-always-failed"],
)
def test_a_run_no_check_looked_at_is_unchecked_not_clean(coverage):
    v = localise(
        evidence(
            4,
            exits=[exited(r, progress=snap(r)) for r in range(4)],
            job_exit_code=0,
            coverage=coverage,
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.UNCHECKED and v.suspects == ()
    assert any("not checked" in line for line in v.reasoning), v.reasoning
    if coverage is not None:
        assert any("state votes (off): 0" in line for line in v.reasoning), v.reasoning


def test_a_run_whose_only_check_was_timing_is_unchecked_and_says_what_did_not_run():
    """Issue 43: a 40-step Lightning run with no periodic vote (K = 50) and no end-of-training
    vote had one timing round and was called `clean`; timing votes say how fast the ranks were,
    not whether their state is right."""
    only_timing = VoteCoverage(
        restart=0,
        votes=0,
        last_clean_step=-1,
        last_vote_step=-1,
        replay_rounds=None,
        timing_rounds=1,
        votes_every=50,
        timing_every=25,
        steps=40,
        final_vote="not made: the process ended without reaching destroy_process_group",
    )
    assert not only_timing.checks_ran
    v = localise(
        evidence(
            4,
            exits=[exited(r, progress=snap(r)) for r in range(4)],
            job_exit_code=0,
            coverage=only_timing,
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.UNCHECKED and v.suspects == ()
    why = next(line for line in v.reasoning if line.startswith("no state vote or replay ran"))
    assert "timing votes alone do not check the model's state" in why, why
    for said in (
        "state votes (every 50 steps): 0",
        "end-of-training vote: not made",
        "in-situ replay: off",
        "timing votes (every 25 steps): 1 rounds",
    ):
        assert said in why, why
    # one state vote with replicas makes the same run `clean`
    voted = dataclasses.replace(only_timing, votes=1, last_clean_step=40, last_vote_step=40)
    assert voted.checks_ran
    v = localise(
        evidence(
            4,
            exits=[exited(r, progress=snap(r)) for r in range(4)],
            job_exit_code=0,
            coverage=voted,
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.CLEAN


def test_no_scout_records_at_all():
    """A job that never ran under scout-srun is not called clean."""
    v = localise(evidence(4, job_exit_code=0, places=False), now=NOW)
    assert v.kind == VerdictKind.UNCHECKED and "no scout records" in v.reasoning[-1]
    v = localise(evidence(4, job_exit_code=-1, places=False), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()
    v = localise(evidence(4, job_exit_code=256, places=False), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and "scout saw none of its ranks" in v.reasoning[-1]


def test_exit_records_outside_the_world_are_ignored():
    exits = [exited(r) for r in range(4)] + [exited(7, signal=11), exited(-1, 3)]
    v = localise(evidence(4, exits=exits, job_exit_code=0), now=NOW)
    assert v.kind == VerdictKind.CLEAN and v.suspects == ()


def test_problems_are_kept_in_the_reasoning():
    ev = JobEvidence(
        job_id=77,
        restart=0,
        world_size=2,
        exits={0: exited(0), 1: exited(1)},
        job_exit_code=0,
        problems=("exit-9.json: refused (a symbolic link)",),
    )
    assert localise(ev, now=NOW).reasoning[0] == "exit-9.json: refused (a symbolic link)"


# --- findings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "finding_kind,verdict_kind",
    [(FindingKind.SDC, VerdictKind.SDC), (FindingKind.STRAGGLER, VerdictKind.STRAGGLER)],
)
def test_findings_produce_their_verdict(finding_kind, verdict_kind):
    f = Finding(
        rank=3,
        node="n2",
        kind=finding_kind,
        at=NOW - 70,
        summary=f"rank 3: {finding_kind.value} at step 12",
        step=12,
    )
    exits = [exited(r, progress=snap(r, steps=12)) for r in range(4)]
    v = localise(evidence(4, exits=exits, findings=[f], job_exit_code=0), now=NOW)
    assert v.kind == verdict_kind
    assert ranks(v) == [3]
    assert v.suspects[0].node == "n2" and v.suspects[0].kind == verdict_kind
    assert v.suspects[0].evidence == (f.summary,)
    assert v.first_failure_at == NOW - 70
    assert v.first_suspect_step == 13


def test_findings_outside_the_world_and_info_findings_are_ignored():
    fs = [
        Finding(rank=9, node="n5", kind=FindingKind.SDC, at=NOW, summary="forged"),
        Finding(rank=1, node="n1", kind=FindingKind.INFO, at=NOW, summary="note"),
    ]
    v = localise(
        evidence(4, exits=[exited(r) for r in range(4)], findings=fs, job_exit_code=0), now=NOW
    )
    assert v.kind == VerdictKind.CLEAN and v.suspects == ()


def test_sdc_comes_before_a_crash():
    f = Finding(
        rank=0, node="n1", kind=FindingKind.SDC, at=NOW - 70, summary="gradient norm differs"
    )
    exits = [exited(2, signal=11)] + [cascade(r) for r in (0, 1, 3)]
    v = localise(evidence(4, exits=exits, findings=[f]), now=NOW)
    assert v.kind == VerdictKind.SDC and ranks(v) == [0]


def test_first_suspect_step_is_the_earliest_suspect_s_next_step():
    exits = [
        exited(1, 1, at=NOW - 10, progress=snap(1, 30, steps=14)),
        exited(4, 1, at=NOW - 10, progress=snap(4, 30, steps=11)),
    ]
    exits += [cascade(r) for r in (0, 2, 3, 5, 6, 7)]
    v = localise(evidence(8, exits=exits), now=NOW)
    assert ranks(v) == [1, 4]
    assert v.first_suspect_step == 12


# --- gather -------------------------------------------------------------------------------


def test_gather_ignores_ranks_outside_the_world(tmp_path):
    folder = JobFolder(tmp_path, "lab", 77)
    for d in (folder.ranks_dir(0), folder.progress_dir(0), folder.findings_dir(0)):
        d.mkdir(parents=True)
    for r in range(4):
        write_record(folder.rank_place_path(0, r), place(r, 4))
        write_record(folder.rank_exit_path(0, r), exited(r))
        write_record(folder.progress_path(0, r), snap(r))
    write_record(folder.rank_exit_path(0, 12), exited(12, signal=11))
    write_record(folder.progress_path(0, 12), snap(12))
    write_record(folder.coverage_path(0), CHECKED)
    ev = gather_evidence(folder, 0, job_exit_code=0)
    assert ev.coverage == CHECKED
    assert ev.world_size == 4
    assert sorted(ev.exits) == [0, 1, 2, 3] and sorted(ev.snapshots) == [0, 1, 2, 3]
    assert any("rank 12 outside the world of 4" in p for p in ev.problems)
    assert localise(ev, now=NOW).kind == VerdictKind.CLEAN


# --- property: whatever the evidence, a verdict that names only ranks of the world ---------

OPS = ("all_reduce", "broadcast")


@st.composite
def random_evidence(draw) -> JobEvidence:
    world = draw(st.integers(2, 16))
    rank_ids = st.integers(-2, world + 2)

    def progress(r: int) -> ProgressSnapshot:
        completed = draw(st.integers(0, 6))
        n = draw(st.integers(0, 4))
        recent = tuple(
            entry(s, draw(st.sampled_from(OPS)), draw(st.sampled_from((64, 4096))))
            for s in range(max(1, completed - n + 1), completed + 1)
        )
        return snap(
            r,
            completed,
            entered=completed + draw(st.integers(0, 1)),
            steps=draw(st.integers(0, 5)),
            state=draw(st.sampled_from(ChildState)),
            recent=recent,
        )

    exits = {}
    for r in draw(st.sets(rank_ids, max_size=world + 3)):
        kind = draw(st.sampled_from(("ok", "code", "signal", "cascade", "scout", "external")))
        with_progress = draw(st.booleans())
        rec = exited(
            r,
            0 if kind == "ok" else draw(st.integers(1, 3)),
            signal=draw(st.sampled_from((6, 9, 11, 15))) if kind in ("signal", "scout") else 0,
            stderr=(GLOO_PEER,) if kind == "cascade" else (),
            by_scout=kind == "scout",
            external=kind == "external",
            at=NOW - draw(st.integers(0, 100)),
            progress=progress(r) if with_progress else None,
        )
        exits[r] = rec
    snaps = {r: progress(r) for r in draw(st.sets(rank_ids, max_size=world + 3))}
    findings = tuple(
        Finding(
            rank=draw(rank_ids),
            node="nx",
            kind=draw(st.sampled_from(FindingKind)),
            at=NOW,
            summary="f",
        )
        for _ in range(draw(st.integers(0, 2)))
    )
    dec = draw(
        st.one_of(
            st.none(),
            st.builds(
                lambda cs, k: StallDecision(
                    decided_by=0, at=NOW, culprits=tuple(cs), kind=k, reasoning=("r",)
                ),
                st.lists(rank_ids, max_size=4),
                st.sampled_from((FindingKind.HANG, FindingKind.DESYNC)),
            ),
        )
    )
    places = {r: place(r, world) for r in draw(st.sets(st.integers(0, world - 1)))}
    return JobEvidence(
        job_id=77,
        restart=0,
        world_size=world,
        places=places,
        exits=exits,
        snapshots=snaps,
        findings=findings,
        decision=dec,
        job_exit_code=draw(st.sampled_from((-1, 0, 9, 256))),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_evidence())
def test_localise_never_raises_and_names_only_ranks_of_the_world(ev):
    v = localise(ev, now=NOW)
    assert all(0 <= s.rank < ev.world_size for s in v.suspects)
    assert len({s.rank for s in v.suspects}) == len(v.suspects)
    assert 0.0 <= v.confidence <= 1.0
    if v.kind in (
        VerdictKind.CLEAN,
        VerdictKind.INCONCLUSIVE,
        VerdictKind.UNCHECKED,
        VerdictKind.TAINTED,
    ):
        assert v.suspects == ()
    else:
        assert v.suspects


def test_decision_naming_a_rank_twice_names_it_once():
    # the decision file is written by the job: a repeated rank must not become two suspects
    v = localise(
        evidence(8, snapshots=[snap(r) for r in range(8)], decision=decision(3, 3)), now=NOW
    )
    assert ranks(v) == [3]
    assert v.confidence == pytest.approx(0.9)


# --- stragglers (timing votes) ----------------------------------------------------------------


def _straggler(rank, node, component="compute"):
    return Finding(
        rank=rank,
        node=node,
        kind=FindingKind.STRAGGLER,
        at=NOW - 30,
        step=15,
        component=component,
        summary=f"rank {rank} on {node} is a {component} straggler",
    )


def test_a_crash_wins_over_a_straggler_which_stays_in_the_reasoning():
    exits = [exited(2, signal=11)] + [cascade(r) for r in (0, 1, 3)]
    v = localise(evidence(4, exits=exits, findings=[_straggler(1, "n1")]), now=NOW)
    assert v.kind == VerdictKind.CRASH and ranks(v) == [2]
    assert "rank 1 on n1 is a compute straggler" in v.reasoning


def test_communication_straggler_names_every_rank_of_its_node():
    fs = [_straggler(2, "n2", "communication"), _straggler(3, "n2", "communication")]
    v = localise(
        evidence(4, exits=[exited(r) for r in range(4)], findings=fs, job_exit_code=0), now=NOW
    )
    assert v.kind == VerdictKind.STRAGGLER and ranks(v) == [2, 3]
    assert any("communication straggler(s): rank(s) 2, 3" in r for r in v.reasoning)


def test_straggler_ended_by_policy_exit_is_a_straggler_not_a_crash():
    exits = [exited(3, 91)] + [cascade(r) for r in (0, 1, 2)]
    v = localise(evidence(4, exits=exits, findings=[_straggler(3, "n2")]), now=NOW)
    assert v.kind == VerdictKind.STRAGGLER and ranks(v) == [3]


def test_whole_group_slow_is_inconclusive_and_names_nobody():
    f = Finding(
        rank=0,
        node="",
        kind=FindingKind.INFO,
        at=NOW,
        component="timing",
        step=15,
        summary="timing vote at step 15: the whole group is slower together; nobody named "
        "(inconclusive)",
    )
    v = localise(
        evidence(4, exits=[exited(r) for r in range(4)], findings=[f], job_exit_code=0), now=NOW
    )
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()


def test_a_one_off_stall_leaves_a_clean_run_clean():
    f = Finding(
        rank=0,
        node="n1",
        kind=FindingKind.INFO,
        at=NOW,
        component="timing",
        step=10,
        summary="rank 0 was slow in one timing round only (a one-off stall): not a straggler",
    )
    v = localise(
        evidence(4, exits=[exited(r) for r in range(4)], findings=[f], job_exit_code=0), now=NOW
    )
    assert v.kind == VerdictKind.CLEAN


# --- a failure at exit, after the distributed work had finished -------------------------------


ABORT_AT_EXIT = ("rank 0: done", "terminate called without an active exception")


def finished(rank: int, completed: int = 85, *, active: bool = False) -> ProgressSnapshot:
    """A final snapshot after the last collective: none open, the record closed (deactivated)
    unless `active`."""
    import dataclasses

    return dataclasses.replace(
        snap(rank, completed, entered=completed, steps=12, state=ChildState.EXITED),
        bootstrap_active=active,
    )


def test_abort_at_exit_after_every_rank_finished_blames_nobody():
    from scout_slurm.config import RemediationConfig
    from scout_slurm.remediation.plan import JobFacts, build_plan

    exits = [exited(0, signal=6, stderr=ABORT_AT_EXIT, progress=finished(0))]
    exits += [exited(r, progress=finished(r)) for r in (1, 2, 3)]
    v = localise(evidence(4, exits=exits), now=NOW)
    assert v.kind == VerdictKind.INCONCLUSIVE and v.suspects == ()
    said = "\n".join(v.reasoning)
    assert "rank 0 on n1 killed by SIGABRT after it had left distributed training" in said
    assert "terminate called without an active exception" in said
    plan = build_plan(
        v,
        JobFacts(77, ("n1", "n2"), (), True, 0, ("n1", "n2")),
        RemediationConfig(),
        evidence_path="/e",
    )
    assert plan.actions == ()  # no drain, no requeue


def test_abort_at_exit_leaves_a_straggler_verdict_standing():
    exits = [exited(2, signal=6, progress=finished(2))] + [
        exited(r, progress=finished(r)) for r in (0, 1, 3)
    ]
    v = localise(evidence(4, exits=exits, findings=[_straggler(3, "n2")]), now=NOW)
    assert v.kind == VerdictKind.STRAGGLER and ranks(v) == [3]
    assert any(
        "rank 2 on n2 killed by SIGABRT after it had left distributed training" in r
        for r in v.reasoning
    )


@pytest.mark.parametrize(
    "case",
    [
        "record-still-active",
        "behind-the-clean-ranks",
        "peers-cascaded",
        "a-rank-left-no-exit-record",
        "never-ran-a-collective",
        "inside-a-collective",
    ],
)
def test_a_failure_before_the_work_was_done_is_still_a_crash(case):
    import dataclasses

    mine = {
        "record-still-active": finished(0, active=True),
        "behind-the-clean-ranks": finished(0, 60),
        "never-ran-a-collective": dataclasses.replace(finished(0, 0), coll_entered=0),
        "inside-a-collective": finished(0, 85),
    }.get(case, finished(0))
    if case == "inside-a-collective":
        mine = dataclasses.replace(mine, coll_entered=86, in_collective=True)
    exits = [exited(0, signal=6, progress=mine)]
    if (
        case == "peers-cascaded"
    ):  # an exception mid-training also closes the record (atexit): the peers say so
        exits += [cascade(r, progress=finished(r, 70, active=True)) for r in (1, 2, 3)]
    else:
        peers = (
            0 if case == "never-ran-a-collective" else 85
        )  # no collectives anywhere: nothing to have finished
        exits += [
            exited(r, progress=dataclasses.replace(finished(r, peers), coll_entered=peers))
            for r in (1, 2, 3)
            if case != "a-rank-left-no-exit-record" or r != 3
        ]
    v = localise(evidence(4, exits=exits), now=NOW)
    assert not any("after it had left distributed training" in r for r in v.reasoning)
    if case == "a-rank-left-no-exit-record":
        assert v.kind == VerdictKind.CRASH and 0 in ranks(v)
    else:
        assert v.kind == VerdictKind.CRASH and ranks(v) == [0]


def test_votes_that_compared_no_replicas_are_not_a_check():
    """Pure FSDP: every rank holds its own shard; votes ran but compared nothing."""
    cov = VoteCoverage(
        restart=0,
        votes=3,
        last_clean_step=-1,
        last_vote_step=30,
        replay_rounds=None,
        steps=30,
        votes_every=10,
        replicas=1,
    )
    v = localise(
        evidence(
            4, exits=[exited(r, progress=snap(r)) for r in range(4)], job_exit_code=0, coverage=cov
        ),
        now=NOW,
    )
    assert v.kind == VerdictKind.UNCHECKED
    assert any("no replicas to compare" in line for line in v.reasoning), v.reasoning


def test_coverage_says_how_many_at_rest_windows_ran_and_why_the_witness_stopped():
    base = dict(
        restart=0,
        votes=3,
        last_clean_step=30,
        last_vote_step=30,
        replay_rounds=None,
        steps=30,
        votes_every=10,
        replicas=3,
    )
    assert not any(
        "at-rest" in line for line in VoteCoverage(**base).lines()
    )  # off, or a record from before it
    assert (
        "at-rest witness (every 10 steps): 3 windows"
        in VoteCoverage(**base, at_rest_windows=3).lines()
    )
    stopped = VoteCoverage(
        **base, at_rest_windows=1, at_rest_stopped="left to the state votes: ..."
    ).lines()
    assert (
        "at-rest witness (every 10 steps): 1 window, then stopped: left to the state votes: ..."
        in stopped
    )


def test_a_check_the_guard_switched_off_is_listed_as_not_run_and_names_nobody():
    """bootstrap.guard writes a check_off finding when one of scout's checks fails inside scout: the
    verdict says the check did not run (what it did not see), and the rank is no suspect for it."""
    off = Finding(
        rank=1,
        node="n1",
        kind=FindingKind.CHECK_OFF,
        at=NOW - 5,
        step=7,
        summary="state vote not run from step 7 on rank 1: it failed inside scout (ValueError: x)",
    )
    v = localise(
        evidence(4, exits=[exited(r) for r in range(4)], findings=[off], job_exit_code=0), now=NOW
    )
    assert v.suspects == () and v.kind != VerdictKind.SDC
    assert (
        "scout's check not run: state vote not run from step 7 on rank 1: it failed inside scout "
        "(ValueError: x)" in v.reasoning
    )
    cov = VoteCoverage(
        restart=0,
        votes=2,
        last_clean_step=10,
        last_vote_step=10,
        checks_off=("state vote: ValueError: x",),
    )
    assert (
        "stopped during the run (scout's guard switched it off): state vote: ValueError: x"
        in cov.lines()
    )


def test_coverage_lists_the_layers_the_replay_did_not_check():
    cov = VoteCoverage(
        restart=0,
        votes=2,
        last_clean_step=10,
        last_vote_step=10,
        replay_rounds=8,
        replay_every=1,
        replay_not_checked=(
            "emb: EmbeddingBag's CUDA backward accumulates with atomic adds",
            "wobbly: did not reproduce before it ever agreed (step 2): treated as "
            "non-deterministic, not as a fault",
        ),
    )
    lines = cov.lines()
    assert "in-situ replay (every 1 steps): 8 rounds" in lines
    assert (
        "in-situ replay: not checked: wobbly: did not reproduce before it ever agreed (step 2): "
        "treated as non-deterministic, not as a fault" in lines
    )
    assert sum(line.startswith("in-situ replay: not checked: ") for line in lines) == 2
    assert not any("not checked" in line for line in VoteCoverage(0, 1, 1, 1, 1).lines())
