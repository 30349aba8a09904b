"""A job whose SCOUT_* settings are not valid (issue 20): scout-task says so once in the job's
output, naming the variable and the closest valid name, and the job still runs (the site's
default `[watchdog] on_bad_setting = "disable"`: scout's in-job checks off, the watchdog on)."""

from __future__ import annotations

import pytest

import scoutjobs as sj

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(180)
def test_a_misspelt_setting_is_said_once_and_the_job_runs(lab, clean_drains):
    script = sj.batch_script(lab, train_args="--steps 10", pre="export SCOUT_CONSENSUS_EVRY=10")
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    out = sj.output(lab, job)
    said = "scout:   SCOUT_CONSENSUS_EVRY='10': unknown scout setting; did you mean SCOUT_CONSENSUS_EVERY?"
    assert out.count(said) == 1, out[-3000:]
    assert out.count("in-job checks OFF") == 1, out[-3000:]
    assert f"scout: watching job {job}" not in out, "no banner that claims checks which are off"
    assert out.count("rank 0: done") == 1 and out.count("rank 3: done") == 1, out[-3000:]  # the job ran
    shown = sj.show_json(lab, job, restart=0)
    # nobody named, and not called clean: no check ran inside the job (no coverage record)
    assert shown["kind"] == "unchecked" and shown["suspects"] == [] and shown["coverage"] is None, shown
