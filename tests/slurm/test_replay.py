"""Issue 6 (in-situ replay): compute corruption on one rank (its activations or gradients) spreads
through the all-reduce, so every replica's state agrees; the replay names the rank anyway, under
DDP, FSDP2 and HSDP, including when the faulty rank is the replay's source; clean runs name nobody.
4 ranks on 2 nodes of the real lab cluster, gloo on CPU.

Replay schedule with --scout-replay-every=2 (scout_slurm.bootstrap.replicas.replay_plan): the n-th
replay (step 2(n+1)) takes layer n mod L from source rank (n // L + n mod L) mod 4."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import scoutjobs as sj

from scout_slurm.evidence.records import Finding, FindingKind
from scout_slurm.evidence.store import read_record
from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]

FSDP2 = Path(__file__).resolve().parent.parent / "jobs" / "train_fsdp2.py"

# the last field: whether the faulty layer had agreed on every rank at an earlier replay. Only
# then does the mismatch end the rank (exit 88); a layer whose very first replay differs may be a
# kernel that computes otherwise on that rank's GPU, so the finding is written (the verdict names
# the rank) but the rank runs on and the layer is replayed no more (issue 44)
CASES = [
    # DDP, layers 0 and 2: layer 0 agreed at step 2, is replayed after step 3 at step 6, from rank
    # 1: the faulty rank is the source
    ("ddp", "scale,factor=1.5,rank=1,step=3,every=1,target=activations", 1, 6, True),
    # DDP, rank 0, the gradient entering layer 0's backward (source of step 6 is rank 1)
    ("ddp", "noise,sigma=1e-3,rank=0,step=3,every=1,target=gradients", 0, 6, True),
    # HSDP 2x2, layers 0, 2, 4: layer 2 is first replayed at step 4 from rank 1, after the onset
    ("hsdp", "sign,element=3,rank=2,step=3,until=12,target=activations,layer=2", 2, 4, False),
    # pure FSDP2: layer 4 is first replayed at step 6 from rank 2, after the onset
    ("fsdp", "noise,sigma=1e-3,rank=1,step=3,every=1,target=gradients,layer=4", 1, 6, False),
]


def _script(lab, mode: str, scout_args: str) -> str:
    if mode == "ddp":
        return sj.batch_script(lab, train_args="--steps 14 --step-sleep 0", scout_args=scout_args)
    return sj.batch_script(
        lab,
        train=FSDP2,
        train_args="--steps 14" + (" --hsdp" if mode == "hsdp" else ""),
        scout_args=scout_args,
    )


def _findings(lab, job) -> list[Finding]:
    d = sj.folder(lab, job).findings_dir(0)
    return [read_record(p, Finding) for p in sorted(d.glob("*.json"))]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "mode,fault,rank,step,agreed",
    CASES,
    ids=[f"{c[0]}-rank{c[2]}-{c[1].split(',')[0]}" for c in CASES],
)
def test_replay_names_the_rank_whose_compute_is_corrupt(
    lab, clean_drains, mode, fault, rank, step, agreed
):
    job = sj.submit(
        lab,
        _script(
            lab, mode, f"--scout-consensus-every=2 --scout-replay-every=2 --scout-inject={fault}"
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    node = sj.places(lab, job)[rank].node
    assert shown["kind"] == "sdc", (shown, out[-3000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, node)]
    sdc = [f for f in _findings(lab, job) if f.kind == FindingKind.SDC]
    # only the replay saw it: the state votes (every 2 steps) agreed, the corruption having spread
    assert [(f.rank, f.component, f.step) for f in sdc] == [(rank, "compute", step)], sdc
    assert "compute corruption" in sdc[0].summary
    if agreed:
        assert (
            f"rank {rank}'s recomputation of layer" in out
            and f"at step {step}; ending this rank (exit 88)" in out
        ), out[-3000:]
    else:
        assert "ending this rank" not in out, out[-3000:]
        assert "did not reproduce before it ever agreed" in out, out[-3000:]
        assert "the rank was not ended" in sdc[0].summary


@pytest.mark.timeout(180)
def test_clean_hsdp_run_with_replay_every_step_names_nobody(lab, clean_drains):
    job = sj.submit(
        lab,
        _script(lab, "hsdp", "--scout-consensus-every=1 --scout-replay-every=1"),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    assert shown["kind"] == "clean" and shown["suspects"] == [], (shown, out[-3000:])
    assert (
        "replica groups [(0, 2), (1, 3)]" in out
        and "in-situ replay every 1 steps over layers ['0', '2', '4']" in out
    )
    assert [f for f in _findings(lab, job) if f.kind != FindingKind.INFO] == []
    # two replicas a shard: no majority, so the at-rest witness keeps every window (after steps 1 to
    # 13)
    assert (shown["coverage"]["at_rest_windows"], shown["coverage"]["at_rest_stopped"]) == (
        13,
        "",
    ), shown["coverage"]


@pytest.mark.timeout(180)
def test_hsdp_weight_fault_with_two_replicas_is_inconclusive_and_names_the_pair(lab, clean_drains):
    # HSDP 2x2: rank 2's shard has one replica (rank 0); a difference has no majority, so nobody is
    # drained.
    # The flip comes after step 3, outside the at-rest witness's window (steps 2 -> 3 and 4 -> 5
    # with
    # votes every 2): no witness, so the verdict stays inconclusive (the witness case is below)
    job = sj.submit(
        lab,
        _script(
            lab,
            "hsdp",
            "--scout-consensus-every=2 --scout-replay-every=2 "
            "--scout-inject=bitflip,bit=20,rank=2,step=3,target=weights",
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "inconclusive" and shown["suspects"] == [], (
        shown,
        sj.output(lab, job)[-3000:],
    )
    unsure = [f for f in _findings(lab, job) if f.component == "weights"]
    assert unsure and all(f.kind == FindingKind.NO_MAJORITY and f.step >= 4 for f in unsure)
    assert (
        "no strict majority among 2 replicas (ranks 0, 2) for weights at step 4: inconclusive"
        in {f.summary for f in unsure}
    )
    assert "rank 0: " in unsure[0].details[0] and "rank 2: " in unsure[0].details[0]


NAN_CASES = [
    # pure FSDP2, rank 3, the output of layer 0 on steps 3.. : the NaN reaches every rank's weights
    # through the
    # gradient reduction of step 3; replay (layer 2 from rank 1 at step 4 per the schedule) cannot
    # see it then
    ("fsdp", "nan,rank=3,step=3,every=1,target=activations", 3),
    # HSDP 2x2, rank 0 (the lowest rank, which otherwise writes the findings)
    ("hsdp", "nan,rank=0,step=3,every=1,target=activations", 0),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "mode,fault,rank", NAN_CASES, ids=[f"{c[0]}-rank{c[2]}" for c in NAN_CASES]
)
def test_nan_is_named_on_the_rank_where_it_began(lab, clean_drains, mode, fault, rank):
    job = sj.submit(
        lab,
        _script(
            lab, mode, f"--scout-consensus-every=2 --scout-replay-every=2 --scout-inject={fault}"
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    node = sj.places(lab, job)[rank].node
    assert shown["kind"] == "sdc", (shown, out[-3000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, node)]
    sdc = [f for f in _findings(lab, job) if f.kind == FindingKind.SDC]
    began = [f for f in sdc if "became non-finite at step 3" in f.summary]
    assert [(f.rank, f.component, f.step) for f in began] == [(rank, "compute", 3)], sdc
    assert {f.rank for f in sdc} == {rank}
    # every rank's own note: the injected one from step 3, the others from step 4 (or not at all, if
    # the vote at
    # step 4 came before they read their flags)
    notes = {
        f.rank: f.step
        for f in _findings(lab, job)
        if f.kind == FindingKind.INFO and "non-finite since" in f.summary
    }
    assert notes.get(rank) == 3 and all(s == 4 for r, s in notes.items() if r != rank), notes
    assert (
        f"rank {rank}'s loss became non-finite first, at step 3; ending this rank (exit 88)" in out
    ), out[-3000:]


@pytest.mark.timeout(180)
def test_nan_on_every_rank_at_once_is_divergence_and_drains_nobody(lab, clean_drains):
    job = sj.submit(
        lab,
        _script(
            lab,
            "fsdp",
            "--scout-consensus-every=2 --scout-replay-every=2 "
            "--scout-inject=nan,rank=all,step=3,every=1,target=activations",
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    assert shown["kind"] == "inconclusive" and shown["suspects"] == [], (shown, out[-3000:])
    findings = _findings(lab, job)
    assert [f for f in findings if f.kind == FindingKind.SDC] == []
    unsure = [f for f in findings if "non-finite loss at step 3: inconclusive" in f.summary]
    assert len(unsure) == 1 and "the training itself diverged" in unsure[0].summary, findings
    assert "exit 88" not in out


@pytest.mark.timeout(240)
def test_the_onset_of_a_replay_finding_is_bounded_by_the_last_replay_of_that_layer(
    lab, clean_drains
):
    """Issue 19: corruption of layer '2' (index 1) from step 9, between the replays of other layers.
    Replays every 2 steps over layers 0 and 2: layer 1 passes at step 8, layer 0 passes at step 10,
    layer 1 fails at step 12. The onset is step 9 (the last pass of that layer + 1), not 11 (the
    last
    pass of any replay + 1), and the rerun resumes from the checkpoint at step 5, not the one at
    10."""
    ckpt = lab.paths.work / f"ckpt-onset-{time.time_ns()}"
    fault = "scale,factor=1.5,rank=3,step=9,every=1,target=activations,layer=2"
    script = sj.batch_script(
        lab,
        train_args=f"--steps 14 --step-sleep 0 --ckpt-dir {ckpt} --ckpt-every 5",
        scout_args=f"--scout-consensus-every=2 --scout-replay-every=2 --scout-inject={fault}",
    )
    job = sj.submit(lab, script)
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    assert shown["kind"] == "sdc" and [s["rank"] for s in shown["suspects"]] == [3], (
        shown,
        out[-3000:],
    )
    sdc = [f for f in _findings(lab, job) if f.kind == FindingKind.SDC]
    assert [(f.rank, f.step, f.since_step) for f in sdc] == [(3, 12, 9)], sdc
    assert "the last replay of layer '2' that passed was at step 8" in sdc[0].summary
    assert shown["first_suspect_step"] == 9 <= 9  # no later than the fault's first step
    info = sj.wait_completed(lab, job)
    assert info.state == "COMPLETED" and info.restart_count == 1, (
        info,
        sj.output(lab, job)[-3000:],
    )
    resume = [a for a in sj.actions(lab, job, 0).actions if a.kind.value == "resume_from"]
    assert len(resume) == 1 and resume[0].target.endswith("step-5.pt"), resume
    assert sj.output(lab, job).count(f"resumed from {ckpt}/step-5.pt at step 5") == 4


# ---- issue 23: witnesses where no majority exists -----------------------------------------------

WITNESS_CASES = [
    # HSDP 2x2, votes every 2: the flip after step 4 is a tie for the vote (ranks 0 and 2), and the
    # at-rest witness (step 4 -> 5) names rank 2 alone
    ("hsdp", "bitflip,bit=20,rank=2,step=4,target=weights", 2, "weights", "changed at rest"),
    # pure FSDP2: no replica at all; the optimizer state (AdamW's first moment) of rank 1's shard
    ("fsdp", "bitflip,bit=12,rank=1,step=4,target=optimizer", 1, "optimizer", "changed at rest"),
    # DDP: rank 3's own gradient of layer 0's weight counted twice before the all-reduce: every
    # replica applies the same wrong update; rank 3's local gradient, as the replay source, tells
    (
        "ddp",
        "scale,factor=2,rank=3,step=3,every=1,target=local_gradients",
        3,
        "compute",
        "training-time weight gradient",
    ),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "mode,fault,rank,component,said",
    WITNESS_CASES,
    ids=[f"{c[0]}-rank{c[2]}-{c[3]}" for c in WITNESS_CASES],
)
def test_a_witness_names_the_rank_where_no_majority_can(
    lab, clean_drains, mode, fault, rank, component, said
):
    job = sj.submit(
        lab,
        _script(
            lab, mode, f"--scout-consensus-every=2 --scout-replay-every=2 --scout-inject={fault}"
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    node = sj.places(lab, job)[rank].node
    assert shown["kind"] == "sdc", (shown, out[-3000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, node)], (
        shown,
        out[-3000:],
    )
    sdc = [f for f in _findings(lab, job) if f.kind == FindingKind.SDC]
    assert [(f.rank, f.component) for f in sdc] == [(rank, component)], sdc
    assert said in sdc[0].summary, sdc[0].summary


@pytest.mark.timeout(180)
def test_a_wrong_optimizer_update_without_replicas_is_named_and_drained(lab, clean_drains):
    """Pure FSDP2 (no copy of any shard anywhere): rank 1's optimizer update goes wrong from step 3
    on,
    as a faulty unit would (its recomputations of updates too). The at-rest seal signs what the
    update
    wrote and no vote exists; the update replay (every 2 steps; at step 4 rank 2 is the source and
    rank 1 recomputes its update wrongly) names rank 1, and its node is drained."""
    fault = "bitflip,bit=20,rank=1,step=3,every=1,target=update"
    job = sj.submit(
        lab,
        _script(
            lab, "fsdp", f"--scout-consensus-every=2 --scout-replay-every=0 --scout-inject={fault}"
        ),
        extra=("--no-requeue",),
    )
    sj.wait_finished(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    out = sj.output(lab, job)
    node = sj.places(lab, job)[1].node
    assert shown["kind"] == "sdc", (shown, out[-3000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(1, node)]
    sdc = [f for f in _findings(lab, job) if f.kind == FindingKind.SDC]
    assert [(f.rank, f.component, f.step) for f in sdc] == [(1, "optimizer", 4)], sdc
    assert (
        "optimizer update replay every 2 steps" in out
        and "rank 1's optimizer update differs" in out
    ), out[-3000:]
    assert shown["coverage"]["update_rounds"] >= 1, shown["coverage"]
    drained = {
        n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained
    }
    assert drained.get(node, "").startswith(f"scout: sdc rank 1 job {job}"), drained
