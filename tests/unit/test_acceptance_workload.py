"""The acceptance steps judged on a buyer's own workload (`scout acceptance --train`): each step
passes only on what it saw; what the workload cannot show is SKIPPED with the reason, never passed.
Plain records in, as in test_acceptance_steps.py."""

from __future__ import annotations

import dataclasses

import pytest

from scout_slurm.acceptance.run import check_train_command, render_markdown
from scout_slurm.acceptance.steps import (
    CheckpointRow,
    LoadResult,
    ResumeResult,
    Status,
    Workload,
    judge_checkpoints,
    judge_injection,
    judge_measurements,
    judge_naming,
    judge_resume,
    judge_under_load,
    workload_cannot,
)
from tests.unit.test_acceptance_steps import ck, clean, sdc, stall

BUYER = Workload(command="python train.py --steps 20", steps=20, replicas=4, checkpoints=5)
LOAD = LoadResult(seconds=10, tcp_bytes=1 << 20, disk_bytes=1 << 20, disk_path="/e")


# -- the workload's facts ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "workload, kw, says",
    [
        (BUYER, dict(at_step=8), ""),
        (dataclasses.replace(BUYER, steps=-1), dict(at_step=8), ""),  # not recorded: no excuse
        (dataclasses.replace(BUYER, steps=5), dict(at_step=8), "ended at step 5"),
        (dataclasses.replace(BUYER, steps=12), dict(at_step=6, needs_steps=16), "reach step 16"),
        (dataclasses.replace(BUYER, replicas=1), dict(at_step=12, votes=True), "no replicas"),
        (dataclasses.replace(BUYER, replicas=2), dict(at_step=12, votes=True), "no majority"),
        (dataclasses.replace(BUYER, replicas=1), dict(at_step=8), ""),  # a stall needs no votes
        (dataclasses.replace(BUYER, replicas=0), dict(at_step=12, votes=True), ""),
    ],
)
def test_what_a_workload_cannot_show(workload, kw, says):
    got = workload_cannot(workload, **kw)
    assert (says in got) if says else got == "", got


# -- step 3 ------------------------------------------------------------------------------------


def test_a_fault_that_never_fired_in_a_short_workload_is_skipped_with_why():
    why = workload_cannot(dataclasses.replace(BUYER, steps=5), at_step=8)
    r = judge_injection("3a", "inject a process stall", stall(injected_at=0.0), cannot=why)
    assert r.status is Status.SKIPPED and "ended at step 5" in r.detail
    # the same fault with nothing in the way fails: it should have fired
    r = judge_injection("3a", "inject a process stall", stall(injected_at=0.0))
    assert r.status is Status.FAIL and "never fired" in r.detail


def test_a_numerical_fault_without_replicas_to_vote_is_skipped_not_passed():
    why = workload_cannot(dataclasses.replace(BUYER, replicas=1), at_step=12, votes=True)
    unnamed = sdc(verdict_kind="clean", named=(), component="")
    r = judge_injection("3c", "inject a numerical perturbation", unnamed, cannot=why)
    assert r.status is Status.SKIPPED and "no replicas to vote" in r.detail
    assert "verdict clean: nobody" in r.detail
    # named right all the same (another check saw it): it passes on what it showed
    assert judge_injection("3c", "x", sdc(), cannot=why).status is Status.PASS


def test_a_fault_shown_with_the_workload_passes_as_with_the_built_in_job():
    assert judge_injection("3a", "x", stall(), cannot="").status is Status.PASS


def test_measurements_and_naming_leave_out_what_the_workload_could_not_show():
    m = judge_measurements([stall()], [clean()], not_shown=["numerical"])
    assert m.status is Status.PASS and "not shown with this workload: numerical" in m.figures
    n = judge_naming([stall()], not_shown=["numerical"])
    assert n.status is Status.PASS and "not shown with this workload: numerical" in n.figures
    for r in (
        judge_measurements([], [clean()], not_shown=["stall"]),
        judge_naming([], not_shown=["stall"]),
    ):
        assert r.status is Status.SKIPPED and "no injected fault could be shown" in r.detail
    # nothing run and nothing excused still fails
    assert judge_naming([]).status is Status.FAIL


# -- step 6 ------------------------------------------------------------------------------------


def test_a_workload_that_never_saves_skips_the_checkpoint_step():
    none = dataclasses.replace(BUYER, checkpoints=0)
    r = judge_checkpoints(ck(rows=(), recovery_step=-1, rule=""), none)
    assert r.status is Status.SKIPPED and "saved no checkpoint scout saw" in r.detail
    # a listing that could not be read is no sign the workload never saves
    r = judge_checkpoints(ck(rows=(), error="no verdict: checkpoints not listed"), none)
    assert r.status is Status.FAIL
    # the built-in job always saves: the same listing fails there
    assert judge_checkpoints(ck(rows=(), recovery_step=-1)).status is Status.FAIL


def test_a_workload_saving_only_after_the_fault_has_nothing_to_recover_to():
    only_after = (CheckpointRow(0, 16, "rejected", "after the first suspect step"),)
    r = judge_checkpoints(ck(rows=only_after, recovery_step=-1), BUYER)
    assert r.status is Status.SKIPPED and "before the fault at step 12" in r.detail
    assert "saves at steps 16" in r.detail and "nothing to recover to" in r.detail


def test_a_workload_checkpoint_listing_is_judged_as_the_built_in_ones():
    assert judge_checkpoints(ck(), BUYER).status is Status.PASS
    bad = ck(rows=(CheckpointRow(0, 10, "eligible", "x"), CheckpointRow(0, 15, "eligible", "x")))
    assert judge_checkpoints(bad, BUYER).status is Status.FAIL


def test_no_numerical_event_skips_the_checkpoint_and_resume_steps():
    why = "the workload has no replicas to vote"
    assert judge_checkpoints(ck(), BUYER, cannot=why).status is Status.SKIPPED
    for w in (BUYER, Workload()):
        r = judge_resume(None, w, cannot=why)
        assert r.status is Status.SKIPPED and why in r.detail


# -- step 7 ------------------------------------------------------------------------------------

VERIFIED = tuple(
    f"resume verified: rank {r} restored /ck/step-10.pt (step 10); model, optimizer equal the "
    "record"
    for r in range(4)
)


def rerun(**kw) -> ResumeResult:
    base = ResumeResult(
        job_id=7,
        restarts=1,
        final_state="COMPLETED",
        resumed_from="/ck/step-10.pt",
        recovery_point="/ck/step-10.pt",
        final_digest="",
        reference_digest="",
        resume_check=VERIFIED,
    )
    return dataclasses.replace(base, **kw)


def test_a_workload_resume_passes_on_scouts_restored_state_check():
    r = judge_resume(rerun(), BUYER)
    assert r.status is Status.PASS and "4 of 4 rank records say resume verified" in r.figures
    assert "not compared with an uninterrupted run" in r.detail
    same = rerun(
        final_digest="step 20: model ab",
        reference_digest="step 20: model ab",
        compared=("step 20", "model"),
    )
    assert "equals the clean run's" in judge_resume(same, BUYER).detail
    # a workload whose own resume is not deterministic still resumed where scout chose: a figure
    other = dataclasses.replace(same, final_digest="step 20: model cd")
    r = judge_resume(other, BUYER)
    assert r.status is Status.PASS and "DIFFERS from the clean run's" in r.detail
    assert "(step 20, model) in model: the workload's own resume is not bit-exact" in r.detail


def test_a_workload_that_ignores_the_resume_checkpoint_is_told_so():
    ignored = tuple(
        f"this rank did not load the resume checkpoint /ck/step-10.pt before its first optimizer "
        f"step (rank {r})"
        for r in range(4)
    )
    r = judge_resume(rerun(resume_check=ignored, resumed_from=""), BUYER)
    assert r.status is Status.SKIPPED and "ignores SCOUT_RESUME_CHECKPOINT" in r.detail


@pytest.mark.parametrize(
    "change, why",
    [
        (dict(restarts=0), "not requeued"),
        (dict(final_state="FAILED"), "ended FAILED"),
        (dict(recovery_point=""), "no checkpoint"),
        (
            dict(resume_check=("RESUME MISMATCH: rank 0's state restored from x differs",)),
            "MISMATCH",
        ),
        (dict(resume_check=()), "no rank of the rerun recorded"),
        (dict(resumed_from="/ck/step-5.pt"), "scout chose /ck/step-10.pt"),
        (dict(error="no evidence folder"), "no evidence folder"),
    ],
)
def test_a_workload_resume_fails(change, why):
    r = judge_resume(rerun(**change), BUYER)
    assert r.status is Status.FAIL and why in r.detail, r


# -- step 8 ------------------------------------------------------------------------------------


def test_under_load_with_a_workload_too_short_for_the_stall_is_skipped():
    why = workload_cannot(dataclasses.replace(BUYER, steps=5), at_step=8)
    loaded = [stall(name="stall under load", injected_at=0.0, verdict_kind="clean", named=())]
    r = judge_under_load(LOAD, loaded, cannot=why)
    assert r.status is Status.SKIPPED and "ended at step 5" in r.detail
    assert judge_under_load(LOAD, loaded).status is Status.FAIL
    assert (
        judge_under_load(LOAD, [stall(name="stall under load")], cannot=why).status is Status.PASS
    )


# -- the command -------------------------------------------------------------------------------


def test_the_train_command_is_one_shell_line():
    cmd = "python train.py --ckpt 'ck dir/$SLURM_JOB_ID' --steps 30"
    assert check_train_command(f"  {cmd} ") == cmd
    assert check_train_command("") == ""
    for bad, says in (("python 'train.py", "not a shell command line"), ("a\nb", "line breaks")):
        with pytest.raises(ValueError, match=says):
            check_train_command(bad)


def test_the_report_names_the_workload_it_ran():
    steps = [judge_naming([stall()])]
    md = render_markdown(steps, [stall()], 0.0, 60.0, True, "python train.py --steps 30")
    assert "The buyer's training command (`--train`): `python train.py --steps 30`" in md
    assert "The built-in training job." in render_markdown(steps, [stall()], 0.0, 60.0, True)
