"""A job whose SCOUT_* settings are not valid (issue 20): scout-task says so once in the job's
output, naming the variable and the closest valid name, and the job still runs (the site's
default `[watchdog] on_bad_setting = "disable"`: scout's in-job checks off, the watchdog on)."""

from __future__ import annotations

import time

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(180)
def test_a_misspelt_setting_is_said_once_and_the_job_runs(lab, clean_drains):
    script = sj.batch_script(lab, train_args="--steps 10", pre="export SCOUT_CONSENSUS_EVRY=10")
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    out = sj.output(lab, job)
    said = (
        "scout:   SCOUT_CONSENSUS_EVRY='10': unknown scout setting; did you mean "
        "SCOUT_CONSENSUS_EVERY?"
    )
    assert out.count(said) == 1, out[-3000:]
    assert out.count("in-job checks OFF") == 1, out[-3000:]
    assert f"scout: watching job {job}" not in out, "no banner that claims checks which are off"
    assert out.count("rank 0: done") == 1 and out.count("rank 3: done") == 1, out[
        -3000:
    ]  # the job ran
    shown = sj.show_json(lab, job, restart=0)
    # nobody named, and not called clean: no check ran inside the job (no coverage record)
    assert shown["kind"] == "unchecked" and shown["suspects"] == [] and shown["coverage"] is None, (
        shown
    )


@pytest.mark.timeout(180)
def test_a_bad_value_under_on_bad_setting_fail_does_not_start_the_job(lab, clean_drains):
    script = sj.batch_script(
        lab,
        train_args="--steps 10",
        pre="export SCOUT_WATCHDOG_ON_BAD_SETTING=fail SCOUT_SDC_POLICY=drain",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    deadline = time.monotonic() + 120
    while not ops.job_info(
        job, timeout=10, env=lab.client_env()
    ).is_finished:  # no verdict waited for:
        assert time.monotonic() < deadline, sj.output(lab, job)[-3000:]  # no rank ever started
        time.sleep(0.5)
    out = sj.output(lab, job)
    said = "scout:   SCOUT_SDC_POLICY='drain': not a valid choice; expected one of exit, continue"
    assert out.count(said) == 1, out[-3000:]
    assert (
        out.count('the job is not started (the site\'s [watchdog] on_bad_setting = "fail")') == 1
    ), out[-3000:]
    assert "done" not in out and "step 1 loss" not in out, out[-3000:]  # the command never started
