"""Issue 43: Lightning with gloo never calls destroy_process_group, so scout's end-of-training vote
runs at the Trainer's teardown of a fit instead (real ranks, gloo, Lightning's own DDP loop): a
clean run's last vote is at its final step, and a weight bitflip planted after the last periodic
vote is named, with its rank, by that final vote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the rank runner of test_bootstrap.py
from test_bootstrap import JOBS, run_ranks, scout_env

pytestmark = [pytest.mark.torch]

LIGHTNING_JOB = JOBS / "train_lightning.py"
DEADLINE_S = 150  # ranks starting torch and Lightning on a loaded 2-core machine
SDC_EXIT = 88


def _run(tmp_path: Path, world: int, *extra: str, **scout: str):
    pytest.importorskip("lightning", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)  # scout-task makes it in a real job
    env = scout_env(run_dir, SCOUT_RUN_DIR=str(run_dir), OMP_NUM_THREADS="1", **scout)
    job = [str(LIGHTNING_JOB), "--steps", "12", "--devices", str(world), *extra]
    runs = run_ranks(job, env, cwd=tmp_path, world=world, deadline_s=DEADLINE_S)
    cov = json.loads((run_dir / "votes.json").read_text())
    found = sorted(p.name for p in (run_dir / "findings").glob("*.json"))
    return runs, cov, found


@pytest.mark.timeout(240)
def test_lightnings_fit_ends_with_the_final_vote_at_its_last_step(tmp_path):
    # the script destroys the group itself after the fit: the vote is made once, at the teardown
    # (a second one at destroy_process_group would say "not needed: the last vote was at ...")
    runs, cov, found = _run(tmp_path, 2, "--destroy", SCOUT_CONSENSUS_EVERY="5")
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    # votes at steps 5 and 10, then the end-of-training vote at step 12, at the Trainer's teardown
    assert (cov["votes"], cov["last_vote_step"], cov["last_clean_step"]) == (3, 12, 12), cov
    assert cov["final_vote"].startswith("at step 12: every replica agreed"), cov
    assert found == [], found
    assert all("rank 0: done" in r.stdout or r.rank != 0 for r in runs), runs[0].stdout


@pytest.mark.timeout(300)
def test_a_bitflip_after_the_last_periodic_vote_is_named_by_lightnings_final_vote(tmp_path):
    runs, cov, found = _run(
        tmp_path,
        3,
        SCOUT_CONSENSUS_EVERY="5",
        SCOUT_AT_REST="off",  # the final vote, not the at-rest witness, must find it
        SCOUT_INJECT="bitflip,bit=23,rank=1,step=11,target=weights",
    )
    codes = [r.returncode for r in runs]
    assert codes == [0, SDC_EXIT, 0], (codes, runs[1].stderr[-3000:])
    assert cov["last_vote_step"] == 12 and cov["last_clean_step"] == 10, cov
    assert cov["final_vote"].startswith("at step 12: replicas disagreed"), cov
    assert [f for f in found if f.startswith("sdc")] == ["sdc-weights-rank-1-step-12.json"], found
    assert "rank 1's state differs from the replicas' majority at step 12" in runs[1].stderr, runs[
        1
    ].stderr[-3000:]


@pytest.mark.timeout(240)
def test_a_rank_late_to_the_teardown_vote_makes_it_skipped_not_a_hang(tmp_path):
    """Rank 1 sleeps 8 s as the fit ends (a long last save); the vote waits 2 s: no vote, said in
    the coverage, and both ranks finish."""
    runs, cov, _ = _run(
        tmp_path, 2, "--end-sleep", "1,8", SCOUT_CONSENSUS_EVERY="5", SCOUT_FINAL_VOTE_TIMEOUT_S="2"
    )
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    assert cov["final_vote"].startswith("not made: not every rank arrived within 2 s"), cov
    assert (cov["votes"], cov["last_vote_step"]) == (2, 10), cov


@pytest.mark.timeout(240)
def test_a_fit_that_raises_makes_no_vote_at_its_teardown(tmp_path):
    runs, cov, _ = _run(tmp_path, 2, "--raise-at", "7", SCOUT_CONSENSUS_EVERY="5")
    assert all(r.returncode == 1 for r in runs), [r.returncode for r in runs]
    assert "the job's own error at step 7" in runs[0].stderr, runs[0].stderr[-3000:]
    assert cov["final_vote"] == (
        "not made: Lightning's Trainer teardown ran while RuntimeError was raised"
    ), cov


@pytest.mark.timeout(240)
def test_scouts_failure_at_the_teardown_is_said_once_and_the_fit_finishes(tmp_path):
    runs, cov, _ = _run(tmp_path, 2, SCOUT_CONSENSUS_EVERY="5", SCOUT_BREAK="end of training")
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    said = runs[0].stderr
    assert said.count("scout's end of training failed inside scout on") == 1, said[-3000:]
    assert "rank 0: done" in runs[0].stdout, runs[0].stdout[-2000:]
    assert any(off.startswith("end of training:") for off in cov["checks_off"]), cov
    assert cov["final_vote"].startswith("not made"), cov
