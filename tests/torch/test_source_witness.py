"""The replay source as a witness, in real multi-rank DDP jobs (CPU, gloo, no Slurm): the source's
own training-time output and local weight gradient, set against every rank's recomputation of the
same input. A transient fault in its forward (absent when asked again) and a corrupted local
gradient before the all-reduce (noise, a doubled gradient, one bit) reach every replica alike, so
neither state votes nor recomputations alone see them; the source's own values do. Clean runs
name nobody (CPU floating point checked bit for bit, not assumed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bootstrap import JOBS, TRAIN, run_ranks, scout_env

from scout_slurm.bootstrap.replay import source_witness, trust

pytestmark = [pytest.mark.torch]
SDC_EXIT = 88


def _run(tmp_path: Path, world: int, steps: int = 14, **scout: str):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="1",
        SCOUT_REPLAY_EVERY="1",
        **scout,
    )
    runs = run_ranks(
        [str(TRAIN), "--steps", str(steps), "--step-sleep", "0", "--timeout", "60"],
        env,
        cwd=run_dir,
        world=world,
        deadline_s=180,
    )
    return run_dir, runs


def _sdc(run_dir: Path) -> dict[str, dict]:
    return {
        p.name: json.loads(p.read_text())
        for p in (run_dir / "findings").glob("*.json")
        if not p.name.startswith("injected-")
    }


def test_source_witness_rule():
    row = lambda out, gw, t_out=0, t_gw=0: (1, out, 7, gw, 9, t_out, t_gw)  # noqa: E731
    assert source_witness([row(5, 6, 5, 6), row(5, 6), row(5, 6)], 0, True) == (
        [],
        ["output", "weight gradient"],
    )
    assert source_witness([row(5, 6, 4, 6), row(5, 6), row(5, 6)], 0, True) == (
        ["output"],
        ["weight gradient"],
    )
    assert source_witness([row(5, 6), row(5, 6, 5, 3), row(5, 6)], 1, True) == (
        ["weight gradient"],
        ["output"],
    )
    assert source_witness([row(5, 6), row(5, 6, 5, 3), row(5, 6)], 1, False) == (
        [],
        ["output"],
    )  # no gradient replayed
    assert source_witness([row(5, 6, 4, 6), row(5, 6), row(8, 6)], 0, True) == (
        [],
        ["weight gradient"],
    )  # split
    assert source_witness([row(5, 6, 0, 0), row(5, 6), row(5, 6)], 0, True) == (
        [],
        [],
    )  # not comparable


def test_a_difference_before_the_layer_is_trusted_is_named_once_another_source_agrees():
    trusted, pending = set(), {}
    # layer 0 first compared at step 4 with rank 1 the source, already faulty: held, nobody named
    assert trust(trusted, pending, 0, 1, 4, ["output"], []) == []
    assert pending == {(0, "output"): {1: 4}} and trusted == set()
    # another layer agreeing says nothing of layer 0
    assert trust(trusted, pending, 2, 0, 5, [], ["output"]) == [] and (0, "output") in pending
    # rank 1 again, step 7: still held, at its first step
    assert trust(trusted, pending, 0, 1, 7, ["output"], []) == [] and pending[(0, "output")] == {
        1: 4
    }
    # rank 2's values of layer 0 agree at step 10: the layer computes alike; rank 1's step 4 is
    # named
    assert trust(trusted, pending, 0, 2, 10, [], ["output"]) == [(1, 4, "output")]
    assert (0, "output") in trusted and (0, "output") not in pending
    # held for two sources (kernels that differ whoever the source is): dropped, nobody named
    trusted, pending = set(), {}
    trust(trusted, pending, 0, 0, 2, ["output", "weight gradient"], [])
    trust(trusted, pending, 0, 1, 3, ["output"], ["weight gradient"])
    assert trust(trusted, pending, 0, 2, 4, [], ["output"]) == []
    # the weight gradient, held for rank 0 alone, was named when rank 1's agreed at step 3
    assert trusted == {(0, "output"), (0, "weight gradient")} and pending == {}
    trusted, pending = set(), {}
    trust(trusted, pending, 0, 0, 2, ["weight gradient"], [])
    assert trust(trusted, pending, 0, 1, 3, [], ["output", "weight gradient"]) == [
        (0, 2, "weight gradient")
    ]


@pytest.mark.timeout(240)
def test_a_transient_fault_present_before_its_layers_first_comparison_is_named_under_pure_fsdp(
    tmp_path,
):
    """Pure FSDP2 at world 4, replay every step over 3 layers: the faulty layer is first compared at
    step 4, with rank 1 (faulty since step 3) the source, before any comparison on it agreed
    (measured
    in the fault matrix: missed before). Another source's agreement on that layer names rank 1."""
    run_dir = tmp_path / "run"
    for d in ("findings", "ranks"):  # as scout-task prepares them
        (run_dir / d).mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="1",
        SCOUT_REPLAY_EVERY="1",
        SCOUT_INJECT="sign,element=2,rank=1,step=3,until=14,target=activations,transient=1",
    )
    runs = run_ranks(
        [str(JOBS / "train_fsdp2.py"), "--steps", "14", "--timeout", "60"],
        env,
        cwd=run_dir,
        world=4,
        deadline_s=200,
        # its peers can only wait out their collective timeout once rank 1 has ended itself
        after_a_failure_s=15,
    )
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    found = {n: f for n, f in _sdc(run_dir).items() if n.startswith("sdc-")}
    assert list(found) == ["sdc-compute-rank-1-step-4-output.json"], found
    f = found["sdc-compute-rank-1-step-4-output.json"]
    assert (f["rank"], f["component"], f["step"], f["since_step"]) == (1, "compute", 4, 4), f
    assert (
        "training-time output of layer '0' at step 4 differed from every recomputation"
        in f["summary"]
    )
    # why only the output is compared here (sharded weights) is said at most once for the job, by
    # rank 0,
    # not once a source and layer (it was 9 lines in 12 steps)
    said = [
        (r.rank, line)
        for r in runs
        for line in r.stderr.splitlines()
        if "output only compared" in line
    ]
    assert len(said) <= 1 and all(rank == 0 for rank, _ in said), said
    assert (
        "rank 1's training-time values of layer '0' differed from every recomputation at step 4; "
        "ending this rank (exit 88)" in runs[1].stderr
    )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "inject,what",
    [
        ("sign,element=2,rank=1,step=3,until=14,target=activations,transient=1", "output"),
        ("noise,sigma=1e-4,rank=1,step=3,until=14,target=local_gradients", "weight gradient"),
        (
            "scale,factor=2,rank=1,step=3,until=14,target=local_gradients",
            "weight gradient",
        ),  # counted twice
        ("bitflip,bit=20,rank=1,step=3,until=14,target=local_gradients", "weight gradient"),
    ],
)
def test_a_fault_only_the_sources_own_values_show_is_named(tmp_path, inject, what):
    run_dir, runs = _run(tmp_path, 3, SCOUT_INJECT=inject)
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    found = _sdc(run_dir)
    names = [n for n in found if n.startswith("sdc-")]
    assert len(names) == 1 and names[0].startswith("sdc-compute-rank-1-step-"), found
    f = found[names[0]]
    assert f"rank 1's training-time {what} of layer '0'" in f["summary"], f
    assert f["since_step"] == f["step"]


@pytest.mark.timeout(300)
def test_clean_runs_name_nobody(tmp_path):
    for world in (2, 3):
        run_dir, runs = _run(tmp_path / f"w{world}", world, steps=30)
        assert [r.returncode for r in runs] == [0] * world, runs[0].stderr[-3000:]
        assert _sdc(run_dir) == {}
        assert "not compared" not in runs[0].stderr + runs[1].stderr


@pytest.mark.timeout(240)
def test_a_layer_whose_training_values_never_match_the_replay_is_not_named(tmp_path):
    """Every rank's training-time output of layer '0' differs from its eager recomputation, every
    step (as compiled or fused kernels may): never trusted, so nobody is named, and it is said."""
    run_dir, runs = _run(
        tmp_path,
        3,
        steps=16,
        SCOUT_INJECT="sign,element=2,rank=all,step=1,until=16,target=activations,transient=1",
    )
    assert [r.returncode for r in runs] == [0, 0, 0], runs[0].stderr[-3000:]
    assert _sdc(run_dir) == {}
    assert "no earlier comparison on this layer agreed" in runs[0].stderr, runs[0].stderr[-3000:]
