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
from test_bootstrap import TRAIN, run_ranks, scout_env  # noqa: E402

from scout_slurm.bootstrap.replay import source_witness

pytestmark = [pytest.mark.torch]
SDC_EXIT = 88


def _run(tmp_path: Path, world: int, steps: int = 14, **scout: str):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(run_dir, SCOUT_RUN_DIR=str(run_dir), SCOUT_CONSENSUS_EVERY="1", SCOUT_REPLAY_EVERY="1", **scout)
    runs = run_ranks([str(TRAIN), "--steps", str(steps), "--step-sleep", "0", "--timeout", "60"], env,
                     cwd=run_dir, world=world, deadline_s=180)
    return run_dir, runs


def _sdc(run_dir: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (run_dir / "findings").glob("*.json")
            if not p.name.startswith("injected-")}


def test_source_witness_rule():
    row = lambda out, gw, t_out=0, t_gw=0: (1, out, 7, gw, 9, t_out, t_gw)  # noqa: E731
    assert source_witness([row(5, 6, 5, 6), row(5, 6), row(5, 6)], 0, True) == ([], ["output", "weight gradient"])
    assert source_witness([row(5, 6, 4, 6), row(5, 6), row(5, 6)], 0, True) == (["output"], ["weight gradient"])
    assert source_witness([row(5, 6), row(5, 6, 5, 3), row(5, 6)], 1, True) == (["weight gradient"], ["output"])
    assert source_witness([row(5, 6), row(5, 6, 5, 3), row(5, 6)], 1, False) == ([], ["output"])  # no gradient replayed
    assert source_witness([row(5, 6, 4, 6), row(5, 6), row(8, 6)], 0, True) == ([], ["weight gradient"])  # split
    assert source_witness([row(5, 6, 0, 0), row(5, 6), row(5, 6)], 0, True) == ([], [])        # not comparable


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inject,what", [
    ("sign,element=2,rank=1,step=3,until=14,target=activations,transient=1", "output"),
    ("noise,sigma=1e-4,rank=1,step=3,until=14,target=local_gradients", "weight gradient"),
    ("scale,factor=2,rank=1,step=3,until=14,target=local_gradients", "weight gradient"),   # counted twice
    ("bitflip,bit=20,rank=1,step=3,until=14,target=local_gradients", "weight gradient"),
])
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
    run_dir, runs = _run(tmp_path, 3, steps=16,
                         SCOUT_INJECT="sign,element=2,rank=all,step=1,until=16,target=activations,transient=1")
    assert [r.returncode for r in runs] == [0, 0, 0], runs[0].stderr[-3000:]
    assert _sdc(run_dir) == {}
    assert "no earlier comparison on this layer agreed" in runs[0].stderr, runs[0].stderr[-3000:]
