"""The at-rest witness in real multi-rank FSDP2 jobs (CPU, gloo, no Slurm): a rank's own weights or
optimizer state changed between two optimizer steps is named without any replica (pure FSDP) and
where two replicas cannot outvote each other (HSDP 2x2); clean runs name nobody; a job that changes
its weights on purpose on every rank turns the witness off, saying so, and names nobody. Where every
replica group has three ranks (DDP over three) it stops after its first window, on every rank at
once, and the state vote names a change at rest by majority."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bootstrap import JOBS, TRAIN, run_ranks, scout_env

from scout_slurm.bootstrap.atrest import changed_ranks

pytestmark = [pytest.mark.torch]
SDC_EXIT = 88


def _run(tmp_path: Path, world: int, *extra: str, steps: int = 12, **scout: str):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="5",
        SCOUT_REPLAY_EVERY="0",
        **scout,
    )
    runs = run_ranks(
        [str(JOBS / "train_fsdp2.py"), "--steps", str(steps), "--timeout", "60", *extra],
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


def test_changed_ranks_rule():
    assert changed_ranks([0, 1, 0, 0]) == ([1], False)
    assert changed_ranks([1, 1, 1, 1]) == ([], True)  # every rank: the job's own code
    assert changed_ranks([0, 0]) == ([], False)
    assert changed_ranks([1, 0]) == ([0], False)  # two ranks: the other's is unchanged
    assert changed_ranks([1]) == ([], False)  # one rank alone tells nothing apart


@pytest.mark.timeout(240)
@pytest.mark.parametrize("target,bit", [("weights", 30), ("weights", 0), ("optimizer", 12)])
def test_pure_fsdp_corruption_at_rest_is_named_without_replicas(tmp_path, target, bit):
    run_dir, runs = _run(
        tmp_path, 2, SCOUT_INJECT=f"bitflip,bit={bit},rank=1,step=5,target={target}"
    )
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    component = "weights" if target == "weights" else "optimizer"
    found = _findings(run_dir)
    assert list(found) == [f"sdc-at-rest-{component}-rank-1-step-5.json"], found
    f = found[f"sdc-at-rest-{component}-rank-1-step-5.json"]
    assert f["rank"] == 1 and f["kind"] == "sdc" and "without any replica" in f["summary"], f


@pytest.mark.timeout(300)
def test_the_device_signature_path_names_a_flip_and_nobody_in_a_clean_run(tmp_path):
    # the lane sums a GPU's tensors are signed by, run here on CPU tensors: low mantissa bit
    run_dir, runs = _run(
        tmp_path / "flip",
        2,
        SCOUT_SIGN_ON_DEVICE="1",
        SCOUT_INJECT="bitflip,bit=0,rank=1,step=5,target=weights",
    )
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    assert "CPU tensors signed by the device path" in runs[0].stderr
    assert list(_findings(run_dir)) == ["sdc-at-rest-weights-rank-1-step-5.json"]
    run_dir, runs = _run(tmp_path / "clean", 2, SCOUT_SIGN_ON_DEVICE="1", steps=21)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    assert "CPU tensors signed by the device path" in runs[0].stderr
    assert _findings(run_dir) == {}


@pytest.mark.timeout(240)
def test_hsdp_two_replicas_the_at_rest_witness_breaks_the_tie(tmp_path):
    run_dir, runs = _run(tmp_path, 4, "--hsdp", SCOUT_INJECT="bitflip,bit=20,rank=2,step=10")
    assert runs[2].returncode == SDC_EXIT, runs[2].stderr[-3000:]
    names = sorted(_findings(run_dir))
    # the vote at step 10 saw the flip among two replicas (ranks 0 and 2): a tie; the witness named
    # it
    assert names == [
        "inconclusive-weights-rank--1-step-10-group-0.json",
        "sdc-at-rest-weights-rank-2-step-10.json",
    ], names


@pytest.mark.timeout(240)
def test_clean_runs_and_a_job_that_clips_its_weights_name_nobody(tmp_path):
    run_dir, runs = _run(tmp_path / "clean", 2, steps=21)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    assert _findings(run_dir) == {}
    run_dir, runs = _run(tmp_path / "clip", 2, "--clip-weights", "0.05", steps=21)
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    assert _findings(run_dir) == {}
    assert (
        "scout: at-rest witness off: every rank's weights changed between optimizer steps 5 and 6"
        in runs[0].stderr
    )


def test_the_seal_is_the_votes_signature_when_the_optimizer_holds_the_voted_parameters():
    """The state vote of a sealed step takes the seal's signatures instead of signing the same bytes
    again: only when they are the vote's own (the same tensors under the vote's names), for that
    step and optimizer."""
    from types import SimpleNamespace

    import torch

    from scout_slurm.bootstrap.atrest import AtRest
    from scout_slurm.bootstrap.consensus import Consensus, optimizer_tensors, state_signature

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    voted = lambda: Consensus.voted_parameters(SimpleNamespace(modules=[model]))  # noqa: E731
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    witness = AtRest(every=5, rank=0, world=2, side=None, run_dir=None, node="n", voted=voted)
    witness.seal(5, opt)
    as_voted = (state_signature(voted()), state_signature(optimizer_tensors(opt)))
    assert witness.signed_at(5, opt) == as_voted
    assert (
        witness.signed_at(6, opt) is None
        and witness.signed_at(5, torch.optim.SGD(model.parameters())) is None
    )
    # an optimizer over other tensors than the voted ones (DeepSpeed's flat master copies): its own
    # list, not shared
    part = torch.optim.AdamW(model[0].parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    part.step()
    witness.seal(10, part)
    assert witness.signed_at(10, part) is None
    assert witness.sealed[2] == state_signature(
        [(f"g0.p{i}", p) for i, p in enumerate(model[0].parameters())]
    )


@pytest.mark.timeout(400)
def test_three_ddp_replicas_leave_it_to_the_votes_after_one_window_two_replicas_keep_it(tmp_path):
    """auto: with three replicas a change at rest persists into the next vote, which names the rank
    by
    majority, so the witness stops after its first window (decided in that window's exchange: every
    rank stops together, and the job runs on in step); two replicas, and SCOUT_AT_REST=on, keep
    it."""

    def run(name: str, world: int, **scout: str):
        run_dir = tmp_path / name
        (run_dir / "findings").mkdir(parents=True)
        env = scout_env(
            run_dir,
            SCOUT_RUN_DIR=str(run_dir),
            SCOUT_CONSENSUS_EVERY="5",
            SCOUT_REPLAY_EVERY="0",
            **scout,
        )
        runs = run_ranks(
            [str(TRAIN), "--step-sleep", "0", "--steps", "16", "--timeout", "60"],
            env,
            cwd=run_dir,
            world=world,
            deadline_s=240,
        )
        return run_dir, runs, json.loads((run_dir / "votes.json").read_text())

    run_dir, runs, cov = run("ddp3", 3)
    assert [r.returncode for r in runs] == [0, 0, 0], runs[0].stderr[-3000:]
    assert _findings(run_dir) == {} and cov["votes"] >= 3 and cov["last_clean_step"] >= 15, cov
    assert cov["at_rest_windows"] == 1, (
        cov
    )  # the window after step 5, then none after steps 10 and 15
    assert cov["at_rest_stopped"].startswith(
        "left to the state votes: every replica group has 3 or more ranks"
    ), cov
    assert (
        "at-rest witness in its first window, then left to the state votes if they sign all"
        in runs[0].stderr
    )
    for name, world, scout in (("ddp3-on", 3, {"SCOUT_AT_REST": "on"}), ("ddp2", 2, {})):
        run_dir, runs, cov = run(name, world, **scout)
        assert all(r.returncode == 0 for r in runs) and _findings(run_dir) == {}, (
            name,
            runs[0].stderr[-3000:],
        )
        assert (cov["at_rest_windows"], cov["at_rest_stopped"]) == (3, ""), (name, cov)
    # after it stopped: rank 1's weight flipped after step 12 is named by the vote at step 15
    run_dir, runs, cov = run(
        "ddp3-flip", 3, SCOUT_INJECT="bitflip,bit=20,rank=1,step=12,target=weights"
    )
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    found = _findings(run_dir)
    assert list(found) == ["sdc-weights-rank-1-step-15.json"], found
    assert found["sdc-weights-rank-1-step-15.json"]["since_step"] == 11, found
