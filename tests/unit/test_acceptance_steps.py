"""The acceptance steps' judging (pure): pass, fail, skip and missing evidence, on plain records."""

from __future__ import annotations

import dataclasses

import pytest

from scout_slurm.acceptance.steps import (
    CaseRun,
    CheckpointResult,
    CheckpointRow,
    IncidentFiles,
    LoadResult,
    MapResult,
    ResumeResult,
    Status,
    StepResult,
    is_right,
    judge_checkpoints,
    judge_injection,
    judge_map,
    judge_measurements,
    judge_naming,
    judge_resume,
    judge_training,
    judge_under_load,
    naming,
    overall,
    summary_table,
)

NODES = ((0, "n1"), (1, "n1"), (2, "n2"), (3, "n2"))
KEPT = IncidentFiles(files=20, bytes=40_000, largest=(("run-0/stacks/rank-1.txt", 9000),))


def clean(**kw) -> CaseRun:
    base = CaseRun(
        name="clean",
        fault="",
        expected_kind="clean",
        expected_rank=None,
        job_id=5,
        final_state="COMPLETED",
        world_size=4,
        rank_nodes=NODES,
        verdict_at=100.0,
        verdict_kind="clean",
        incident=KEPT,
    )
    return dataclasses.replace(base, **kw)


def stall(**kw) -> CaseRun:
    base = CaseRun(
        name="stall",
        fault="sleep,rank=1,step=8",
        expected_kind="hang",
        expected_rank=1,
        job_id=6,
        final_state="FAILED",
        world_size=4,
        rank_nodes=NODES,
        injected_at=1000.0,
        detected_at=1006.2,
        verdict_at=1006.9,
        verdict_kind="hang",
        named=((1, "n1"),),
        incident=KEPT,
    )
    return dataclasses.replace(base, **kw)


def sdc(**kw) -> CaseRun:
    base = CaseRun(
        name="numerical",
        fault="bitflip,bit=3,rank=0,step=12",
        expected_kind="sdc",
        expected_rank=0,
        job_id=7,
        final_state="COMPLETED",
        world_size=4,
        rank_nodes=NODES,
        injected_at=2000.0,
        detected_at=2001.0,
        verdict_at=2004.0,
        verdict_kind="sdc",
        named=((0, "n1"),),
        component="weights",
        incident=KEPT,
    )
    return dataclasses.replace(base, **kw)


# -- step 1 ------------------------------------------------------------------------------------


def test_training_passes_across_two_nodes():
    r = judge_training(clean(), expected_world=4)
    assert r.status is Status.PASS and "4 ranks on 2 nodes (n1,n2)" in r.figures


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(final_state="FAILED"), "not COMPLETED"),
        (dict(rank_nodes=((0, "n1"), (1, "n1"))), "fewer than 2"),
        (dict(error="sbatch failed: no partition"), "sbatch failed"),
    ],
)
def test_training_fails(change, why):
    r = judge_training(clean(**change), expected_world=4)
    assert r.status is Status.FAIL and why in r.detail


def test_training_fails_on_missing_ranks_and_on_no_job():
    r = judge_training(clean(rank_nodes=NODES[:3], world_size=4), expected_world=4)
    assert r.status is Status.FAIL and "expected 4 ranks, the job recorded 3" in r.detail
    assert (
        judge_training(clean(rank_nodes=NODES[:3], world_size=4), expected_world=4).status
        is Status.FAIL
    )
    assert judge_training(None).status is Status.FAIL


# -- step 2 ------------------------------------------------------------------------------------


def rows(n=4, nic="lo"):
    return tuple((r, "n1" if r < 2 else "n2", nic, ()) for r in range(n))


def test_map_passes_and_says_cpu():
    r = judge_map(MapResult(5, 4, True, rows()))
    assert r.status is Status.PASS and "GPUs none (CPU job)" in r.figures and "NICs lo" in r.figures


def test_map_with_gpus_counts_them():
    m = MapResult(5, 2, True, ((0, "n1", "ib0", ("GPU-a",)), (1, "n2", "ib0", ("GPU-b",))))
    assert "GPUs 2" in judge_map(m).figures


@pytest.mark.parametrize(
    "m, why",
    [
        (MapResult(5, 4, False, rows()), "had not ended"),
        (MapResult(5, 4, True, rows(3)), "ranks missing from the map: [3]"),
        (MapResult(5, 4, True, rows(nic="")), "without a NIC: [0, 1, 2, 3]"),
        (MapResult(5, 4, True, error="no evidence for job 5"), "no evidence"),
        (MapResult(5, 0, True, ()), "missing"),
    ],
)
def test_map_fails(m, why):
    r = judge_map(m)
    assert r.status is Status.FAIL and why in r.detail


# -- step 3 ------------------------------------------------------------------------------------


def test_injection_pass_fail_skip():
    assert judge_injection("3a", "stall", stall()).status is Status.PASS
    r = judge_injection("3a", "stall", stall(injected_at=0.0))
    assert r.status is Status.FAIL and "never fired" in r.detail
    r = judge_injection("3a", "stall", stall(verdict_kind=""))
    assert r.status is Status.FAIL and "no verdict" in r.detail
    assert judge_injection("3a", "stall", None).status is Status.FAIL
    r = judge_injection("3d", "slow link", None, skip_reason="no per-node link on loopback")
    assert r.status is Status.SKIPPED and r.detail == "no per-node link on loopback"


# -- steps 4, 5 --------------------------------------------------------------------------------


def test_measurements_pass_with_figures():
    r = judge_measurements([stall(), sdc()], [clean()])
    assert r.status is Status.PASS
    assert "stall: detect 6.2 s, verdict 6.9 s, kept 20 files, 39.1 KiB" in r.figures
    assert "false positives: 0 of 1 clean runs" in r.figures


def test_a_clean_run_that_names_someone_is_a_false_positive():
    fp = clean(verdict_kind="hang", named=((2, "n2"),))
    r = judge_measurements([stall()], [clean(), fp])
    assert (
        r.status is Status.FAIL
        and "false positives: 1 of 2" in r.figures
        and "a clean run was called" in r.detail
    )


@pytest.mark.parametrize(
    "case, why",
    [
        (stall(detected_at=0.0), "no detection time"),
        (stall(verdict_at=0.0), "no localisation time"),
        (stall(incident=None), "kept no files"),
        (stall(incident=IncidentFiles(0, 0)), "kept no files"),
    ],
)
def test_measurements_fail_on_missing_evidence(case, why):
    r = judge_measurements([case], [clean()])
    assert r.status is Status.FAIL and why in r.detail


def test_measurements_need_cases_and_clean_runs():
    assert "no clean run" in judge_measurements([stall()], []).detail
    assert "no injected case" in judge_measurements([], [clean()]).detail


def test_naming_says_rank_node_and_component():
    r = judge_naming([stall(), sdc()])
    assert r.status is Status.PASS
    assert "stall: hang: rank 1 on node n1 (right)" in r.figures
    assert "numerical: sdc: rank 0 on node n1; component weights (right)" in r.figures


@pytest.mark.parametrize(
    "case, why",
    [
        (stall(named=((2, "n2"),)), "expected rank 1 on n1"),
        (stall(verdict_kind="inconclusive", named=()), "expected hang, verdict said inconclusive"),
        (stall(named=((1, "n1"), (2, "n2"))), "expected rank 1 on n1"),
        (stall(rank_nodes=()), "no place record for rank 1"),
        (stall(verdict_kind=""), "no verdict"),
    ],
)
def test_naming_wrong(case, why):
    r = judge_naming([case])
    assert r.status is Status.FAIL and why in r.detail


def test_naming_of_a_group():
    c = stall(verdict_kind="inconclusive", named=(), group=(0, 2))
    assert naming(c) == "inconclusive: communication group of ranks 0,2"
    assert not is_right(c)[0]


# -- step 6 ------------------------------------------------------------------------------------


def ck(**kw) -> CheckpointResult:
    base = CheckpointResult(
        job_id=7,
        fault_step=12,
        first_suspect_step=11,
        rows=(
            CheckpointRow(0, 5, "eligible", "vote at 10 agreed"),
            CheckpointRow(0, 10, "eligible", "vote at 10 agreed"),
            CheckpointRow(0, 15, "rejected", "saved at or after the first suspect step 11"),
        ),
        recovery_point="/ck/step-10.pt",
        recovery_step=10,
        rule="newest eligible checkpoint strictly before the first suspect step 11: step 10",
    )
    return dataclasses.replace(base, **kw)


def test_checkpoints_pass_and_show_the_rule():
    r = judge_checkpoints(ck())
    assert r.status is Status.PASS and r.detail.startswith("rule: newest eligible")
    assert "step 10 eligible, step 15 rejected" in r.figures


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(rows=(CheckpointRow(0, 15, "rejected", "x"),)), "no checkpoint before the fault"),
        (dict(rows=(CheckpointRow(0, 10, "eligible", "x"),)), "no checkpoint after the fault"),
        (
            dict(
                rows=(CheckpointRow(0, 10, "eligible", "x"), CheckpointRow(0, 15, "eligible", "x"))
            ),
            "after the first suspect step are eligible: [15]",
        ),
        (dict(recovery_step=15), "not before the first suspect step"),
        (dict(recovery_step=-1), "no recovery point"),
        (dict(rule=""), "no rule"),
        (dict(first_suspect_step=-1), "no first suspect step"),
        (dict(error="no verdict: checkpoints not listed"), "no verdict"),
    ],
)
def test_checkpoints_fail(change, why):
    r = judge_checkpoints(ck(**change))
    assert r.status is Status.FAIL and why in r.detail


def test_a_rerun_checkpoint_does_not_count_as_after_the_event():
    r = judge_checkpoints(
        ck(rows=(CheckpointRow(0, 10, "eligible", "x"), CheckpointRow(1, 15, "candidate", "x")))
    )
    assert r.status is Status.FAIL and "no checkpoint after the fault" in r.detail


# -- step 7 ------------------------------------------------------------------------------------


def resumed(**kw) -> ResumeResult:
    base = ResumeResult(
        job_id=7,
        restarts=1,
        final_state="COMPLETED",
        resumed_from="/ck/step-10.pt",
        recovery_point="/ck/step-10.pt",
        final_digest="1.0 2.0 sha256=ab",
        reference_digest="1.0 2.0 sha256=ab",
        compared=("model", "optimizer", "scheduler", "RNG"),
    )
    return dataclasses.replace(base, **kw)


def test_resume_bit_for_bit_passes():
    r = judge_resume(
        resumed(
            resume_check=(
                "resume verified: rank 0 restored step-10.pt",
                "resume verified: rank 1 restored step-10.pt",
            )
        )
    )
    assert r.status is Status.PASS and "2 of 2 rank records say resume verified" in r.detail
    assert "model, optimizer, scheduler, RNG" in r.figures
    assert "none recorded" in judge_resume(resumed()).detail


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(final_digest="1.0 2.0 sha256=ac"), "differs from the uninterrupted run"),
        (dict(final_digest=""), "digest is missing"),
        (dict(reference_digest=""), "digest is missing"),
        (dict(resumed_from=""), "did not say which checkpoint"),
        (dict(resumed_from="/ck/step-15.pt"), "the rule chose /ck/step-10.pt"),
        (dict(restarts=0), "not requeued"),
        (dict(final_state="FAILED"), "ended FAILED"),
        (dict(resume_check=("rank 0: resume MISMATCH: optimizer",)), "MISMATCH"),
        (dict(error="no evidence folder"), "no evidence folder"),
    ],
)
def test_resume_fails(change, why):
    r = judge_resume(resumed(**change))
    assert r.status is Status.FAIL and why in r.detail


# -- step 8 ------------------------------------------------------------------------------------

LOAD = LoadResult(
    seconds=40.0, tcp_bytes=40 * 64 << 20, disk_bytes=40 * 16 << 20, disk_path="/ev", pids=(11, 12)
)


def test_under_load_passes_with_rates():
    r = judge_under_load(
        LOAD, [stall(name="stall under load", under_load=True), clean(name="clean under load")]
    )
    assert r.status is Status.PASS and "(64 MiB/s)" in r.figures and "(16 MiB/s)" in r.figures


@pytest.mark.parametrize(
    "load, cases, why",
    [
        (dataclasses.replace(LOAD, tcp_bytes=0), [stall()], "TCP generator moved no data"),
        (dataclasses.replace(LOAD, disk_bytes=0), [stall()], "disk writer wrote nothing"),
        (dataclasses.replace(LOAD, stopped=False), [stall()], "not all stopped: pids [11, 12]"),
        (
            dataclasses.replace(LOAD, error="load generator pid 11 had already ended"),
            [stall()],
            "already ended",
        ),
        (LOAD, [], "no case ran under load"),
        (LOAD, [stall(named=((3, "n2"),))], "expected rank 1 on n1"),
        (None, [stall()], "no load was started"),
    ],
)
def test_under_load_fails(load, cases, why):
    r = judge_under_load(load, cases)
    assert r.status is Status.FAIL and why in r.detail


# -- the whole ---------------------------------------------------------------------------------


def test_overall_and_table():
    ok = StepResult("1", "a", Status.PASS, "x")
    skip = StepResult("3d", "slow link", Status.SKIPPED, detail="no link to shape")
    bad = StepResult("2", "b", Status.FAIL, "y | z", "why")
    assert (
        overall([ok, skip]) and not overall([ok, bad]) and not overall([skip]) and not overall([])
    )
    table = summary_table([ok, skip, bad])
    assert "| 3d slow link | SKIPPED (no link to shape) |" in table
    assert "| 2 b | FAIL (why) | y / z |" in table  # a pipe in the figures does not break the row


def link(**kw) -> CaseRun:
    base = CaseRun(
        name="slow link",
        fault="tbf rate 8mbit on n3",
        expected_kind="straggler",
        expected_rank=None,
        expected_on_node="n3",
        job_id=9,
        final_state="COMPLETED",
        world_size=4,
        rank_nodes=((0, "n1"), (1, "n2"), (2, "n3"), (3, "n4")),
        injected_at=10.0,
        detected_at=15.0,
        verdict_at=20.0,
        verdict_kind="straggler",
        named=((2, "n3"),),
        component="communication",
        incident=KEPT,
    )
    return dataclasses.replace(base, **kw)


def test_a_slow_link_is_right_when_the_ranks_on_its_node_are_named():
    assert is_right(link()) == (True, "rank 2 on n3, straggler")
    assert judge_injection("3d", "slow link", link()).status is Status.PASS
    ok, why = is_right(link(named=((3, "n4"),)))
    assert not ok and "expected rank 2 on n3" in why
    ok, why = is_right(link(rank_nodes=((0, "n1"), (1, "n2"))))
    assert not ok and "no rank was placed on node n3" in why
