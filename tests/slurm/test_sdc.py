"""Issue (consensus, first part): state votes among DDP replicas name the rank whose weights or
optimizer state were corrupted, on the real lab cluster (4 replicas on 2 nodes)."""

from __future__ import annotations

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

CASES = [
    ("bitflip,bit=0", 2, "weights"),  # lowest mantissa bit
    ("bitflip,bit=12", 0, "weights"),
    ("bitflip,bit=23", 3, "weights"),  # lowest exponent bit: the value doubles or halves
    # (bit 30 makes the value ~1e35: the next all-reduce spreads Inf/NaN to every replica, so all
    #  replicas agree again; only in-situ replay can localise that, and it is not built yet)
    ("bitflip,bit=31", 1, "weights"),  # sign bit
    ("scale,factor=1.0001", 1, "weights"),
    ("sign", 3, "optimizer"),
    # (bit 0 of the momentum element it hits, -9.545392822474241e-05, is 7e-12: four steps of
    #  momentum 0.9 plus the gradients round it away, the replicas' exact signatures are equal again
    #  at the vote at step 10 and `clean` is the true answer; bit 12 (a change of 5e-4 of the value)
    #  outlives them)
    ("bitflip,bit=12", 0, "optimizer"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "fault,rank,target", CASES, ids=[f"{c[0]}-rank{c[1]}-{c[2]}" for c in CASES]
)
def test_corruption_is_named(lab, clean_drains, fault, rank, target):
    inject = f"{fault},rank={rank},step=6,target={target}"
    script = sj.batch_script(
        lab,
        train_args="--steps 40 --momentum 0.9",
        scout_args=f"--scout-consensus-every=5 --scout-inject={inject}",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    node = sj.places(lab, job)[rank].node
    assert shown["kind"] == "sdc", (shown, sj.output(lab, job)[-2000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, node)]
    assert any("step 10" in line for line in shown["reasoning"])  # the first vote after step 6
    out = sj.output(lab, job)
    assert (
        f"rank {rank}'s state differs from the replicas' majority at step 10; ending this "
        "rank (exit 88)" in out
    )
    drained = {
        n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained
    }
    assert drained.get(node, "").startswith(f"scout: sdc rank {rank} job {job}"), drained


@pytest.mark.timeout(180)
def test_clean_run_with_votes_every_step_names_nobody(lab, clean_drains):
    script = sj.batch_script(
        lab, train_args="--steps 30 --momentum 0.9", scout_args="--scout-consensus-every=1"
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "clean" and shown["suspects"] == [], shown
    # the job's output is the user's: scout's banner and nothing of its structured log (issue 19)
    out = sj.output(lab, job)
    assert out.count(f"scout: watching job {job} (run 0, 4 ranks)") == 1, out[-3000:]
    assert not [
        line for line in out.splitlines() if line.lstrip().startswith("{") and '"event"' in line
    ], out[-3000:]
    # and it says what it checked: a vote every step, none needed at the end
    cov = shown["coverage"]
    assert (
        cov["votes"] == 30
        and cov["last_clean_step"] == 30
        and cov["final_vote"].startswith("not needed")
    ), cov
    # four replicas: the at-rest witness ran its first window, then left the state to the votes (all
    # ranks at once)
    assert cov["at_rest_windows"] == 1 and cov["at_rest_stopped"].startswith(
        "left to the state votes: every replica group has 4 or more ranks"
    ), cov
    assert "at-rest witness in its first window, then left to the state votes" in out, out[-3000:]
    assert "nothing found by the checks that ran:" in shown["reasoning"], shown
    folder = sj.folder(lab, job)
    for rank in range(4):
        own = folder.task_log_path(0, rank).read_text()
        assert '"event": "watchdog.child_exited"' in own, own[-2000:]


@pytest.mark.timeout(180)
def test_a_run_shorter_than_k_is_checked_at_its_end(lab, clean_drains):
    """40 steps with the default K = 50: no periodic vote ever runs, the end-of-training vote at
    destroy_process_group names the rank whose weights were corrupted (issue 19)."""
    script = sj.batch_script(
        lab,
        train_args="--steps 40 --momentum 0.9",
        scout_args="--scout-inject=bitflip,bit=23,rank=2,step=6,target=weights",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    node = sj.places(lab, job)[2].node
    assert shown["kind"] == "sdc", (shown, sj.output(lab, job)[-2000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(2, node)]
    cov = shown["coverage"]
    assert cov["votes"] == 1 and cov["votes_every"] == 50 and cov["last_vote_step"] == 40, cov
    assert "rank 2's state differs from the replicas' majority at step 40" in sj.output(lab, job)


@pytest.mark.timeout(180)
def test_a_short_run_with_votes_off_is_unchecked_not_clean(lab):
    script = sj.batch_script(lab, train_args="--steps 10", scout_args="--scout-consensus-every=0")
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "unchecked" and shown["suspects"] == [], shown
    cov = shown["coverage"]
    assert (cov["votes"], cov["replay_rounds"], cov["timing_rounds"], cov["steps"]) == (
        0,
        None,
        0,
        10,
    ), cov
    assert cov["final_vote"] == "not made: state votes are off", cov
    assert any("not checked" in line for line in shown["reasoning"]), shown
    assert sj.actions(lab, job) is None or not sj.actions(lab, job).actions
