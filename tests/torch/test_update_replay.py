"""The optimizer update replay in real multi-rank jobs (CPU, gloo, no Slurm): a rank's optimizer
update of a slice of its own state, kept before its step and recomputed by every rank. Where no
replica can outvote a wrong update (pure FSDP2, HSDP 2x2, DDP over two ranks) it names the rank
whose update was wrong: in training only (transient), or in every update it computes (persistent,
also outvoted in its recomputation of others' updates). Clean runs name nobody (CPU floating point
checked bit for bit, not assumed); where every shard has three replicas it is off (said)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bootstrap import JOBS, TRAIN, run_ranks, scout_env

from scout_slurm.bootstrap.update import ALIGN, decide, hyperparameters, plan_segments

pytestmark = [pytest.mark.torch]
SDC_EXIT = 88


def _run(
    tmp_path: Path, world: int, *extra: str, steps: int = 10, job: str = "fsdp2", **scout: str
):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="1",
        SCOUT_REPLAY_EVERY="0",
        SCOUT_AT_REST="0",
        **scout,
    )
    script = [str(JOBS / "train_fsdp2.py")] if job == "fsdp2" else [str(TRAIN), "--step-sleep", "0"]
    runs = run_ranks(
        [*script, "--steps", str(steps), "--timeout", "60", *extra],
        env,
        cwd=run_dir,
        world=world,
        deadline_s=180,
    )
    return run_dir, runs


def _findings(run_dir: Path) -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text())
        for p in (run_dir / "findings").glob("*.json")
        if not p.name.startswith("injected-")
    }


def test_decide_rule():
    # every recomputation agrees with the training-time result: nobody
    assert decide([5, 5, 5, 5], 5, 1) == ([], "")
    # every recomputation agrees, the source's training-time result differs: a transient fault on it
    assert decide([5, 5, 5, 5], 4, 1) == ([1], "")
    # the source repeats its own wrong result: outvoted in its recomputation too
    assert decide([5, 4, 5, 5], 4, 1) == ([1], "")
    # another rank recomputes wrongly (a persistent fault on it), the source is right
    assert decide([5, 5, 7, 5], 5, 1) == ([2], "")
    # a rank that could not recompute is left out, not named
    assert decide([5, None, 5, 5], 5, 1) == ([], "")
    # two ranks that differ: no majority, nobody named, said why
    named, why = decide([5, 4], 4, 1)
    assert named == [] and "no majority" in why
    # two ranks whose recomputations agree outvote the source's training-time result
    assert decide([5, 5], 4, 1) == ([1], "")
    # the source could not sign its own result (0): the recomputations still vote among themselves
    assert decide([5, 5, 5], 0, 1) == ([], "") and decide([5, 7, 5], 0, 0) == ([1], "")


def test_plan_segments_rotates_over_every_element_once():
    sizes = [3000, 10, 0, 5000]
    covered = {i: set() for i in range(len(sizes))}
    cursor, rounds = 0, 0
    while sum(len(v) for v in covered.values()) < sum(sizes) and rounds < 100:
        segs, cursor = plan_segments(sizes, cursor, 2048)
        assert segs and sum(hi - lo for _, lo, hi in segs) <= 2048 + ALIGN
        for i, lo, hi in segs:
            assert lo % ALIGN == 0 and 0 <= lo < hi <= sizes[i]
            covered[i] |= set(range(lo, hi))
        rounds += 1
    assert [len(covered[i]) for i in range(len(sizes))] == sizes and rounds <= 5
    # a budget larger than everything: every element once, in one round
    segs, _ = plan_segments(sizes, 0, 1 << 30)
    assert segs == [(0, 0, 3000), (1, 0, 10), (3, 0, 5000)]
    assert plan_segments([], 0, 10) == ([], 0)


def test_hyperparameters_are_plain_values_or_none():
    assert hyperparameters({"params": [1], "lr": 0.1, "betas": (0.9, 0.99), "foreach": None}) == {
        "lr": 0.1,
        "betas": [0.9, 0.99],
        "foreach": None,
    }
    import torch

    assert hyperparameters({"params": [], "lr": torch.tensor(0.1)}) is None


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "spec,rank,first",
    [
        ("bitflip,bit=12,every=1", 2, 3),  # persistent: outvoted as a recomputer at step 3
        ("sign,every=1,transient=1", 1, 5),  # in training only: named when it is the source (5 % 4)
    ],
)
def test_pure_fsdp_wrong_update_is_named(tmp_path, spec, rank, first):
    run_dir, runs = _run(tmp_path, 4, SCOUT_INJECT=f"{spec},rank={rank},step=3,target=update")
    assert runs[rank].returncode == SDC_EXIT, runs[rank].stderr[-3000:]
    found = _findings(run_dir)
    assert list(found) == [f"sdc-update-rank-{rank}-step-{first}.json"], found
    f = found[f"sdc-update-rank-{rank}-step-{first}.json"]
    assert f["rank"] == rank and f["kind"] == "sdc" and f["component"] == "optimizer", f
    assert f["since_step"] <= 3 <= f["step"], f


@pytest.mark.timeout(240)
def test_hsdp_pair_wrong_update_is_named(tmp_path):
    """HSDP 2x2: the vote between rank 3 and its one replica has no majority; the update replay
    names it.
    """
    run_dir, runs = _run(
        tmp_path,
        4,
        "--hsdp",
        SCOUT_INJECT="scale,factor=1.0001,rank=3,step=3,target=update,every=1",
    )
    assert runs[3].returncode == SDC_EXIT, runs[3].stderr[-3000:]
    named = {f["rank"] for f in _findings(run_dir).values() if f["kind"] == "sdc"}
    assert named == {3}, _findings(run_dir)


@pytest.mark.timeout(400)
def test_clean_runs_name_nobody_and_three_replicas_turn_it_off(tmp_path):
    for name, world, extra, job in (
        ("fsdp", 4, (), "fsdp2"),
        ("hsdp", 4, ("--hsdp",), "fsdp2"),
        ("ddp2", 2, ("--momentum", "0.9"), "ddp"),
    ):
        run_dir, runs = _run(
            tmp_path / name, world, *extra, steps=12, job=job, SCOUT_UPDATE_MAX_BYTES="4096"
        )
        assert all(r.returncode == 0 for r in runs), (name, runs[0].stderr[-3000:])
        assert _findings(run_dir) == {}, name
        assert "optimizer update replay every 1 steps" in runs[0].stderr, (
            name,
            runs[0].stderr[-2000:],
        )
        votes = json.loads((run_dir / "votes.json").read_text())
        assert votes["update_rounds"] == 12, (name, votes)
    # DDP over four ranks: the state vote among four replicas names a wrong update; no replay
    run_dir, runs = _run(tmp_path / "ddp4", 4, job="ddp", steps=4)
    assert all(r.returncode == 0 for r in runs)
    assert "optimizer update replay" not in runs[0].stderr  # nothing said: the state votes cover it
    assert json.loads((run_dir / "votes.json").read_text()).get("update_rounds") is None
