"""The in-situ replay's determinism policy in real 3-rank DDP jobs (CPU, gloo, no Slurm): a layer
whose recomputation does not repeat on one rank (as a kernel that differs by GPU would) is taken
for non-determinism at its first mismatch, since it never agreed: said once, left out of later
rounds, recorded in the coverage record, and no rank ends. A fault in a layer that has agreed
still ends the rank (exit 88), as before.

Schedule (SCOUT_REPLAY_EVERY=1, layers fc0, wobbly, fc2, 3 ranks; replicas.replay_plan): step 2
replays wobbly (source 1), step 3 fc2 (source 2), step 4 fc0, step 5 wobbly again, step 6 fc2
(source 0), step 9 fc2 (source 1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_bootstrap import JOBS, run_ranks, scout_env

pytestmark = [pytest.mark.torch]
SDC_EXIT = 88
UNREPRODUCED = "did not reproduce before it ever agreed"


def _run(tmp_path: Path, steps: int = 12, world: int = 3, noisy: str = "2", **scout: str):
    run_dir = tmp_path / "run"
    (run_dir / "findings").mkdir(parents=True)
    env = scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CONSENSUS_EVERY="5",
        SCOUT_REPLAY_EVERY="1",
        **scout,
    )
    runs = run_ranks(
        [
            str(JOBS / "train_unreproducible.py"),
            *("--steps", str(steps), "--noisy-ranks", noisy, "--timeout", "60"),
        ],
        env,
        cwd=run_dir,
        world=world,
        deadline_s=180,
    )
    findings = {
        p.name: json.loads(p.read_text())
        for p in (run_dir / "findings").glob("*.json")
        if not p.name.startswith("injected-")
    }
    return run_dir, runs, findings


@pytest.mark.timeout(240)
def test_a_layer_that_never_agreed_is_left_out_at_its_first_mismatch_and_ends_no_rank(tmp_path):
    run_dir, runs, findings = _run(tmp_path)
    assert [r.returncode for r in runs] == [0, 0, 0], runs[2].stderr[-3000:]
    said = [line for r in runs for line in r.stderr.splitlines() if UNREPRODUCED in line]
    assert len(said) == 1, said
    assert "replay of layer 'wobbly' at step 2" in said[0] and "no longer replayed" in said[0]
    assert "ending this rank" not in "".join(r.stderr for r in runs)
    # the evidence stays: rank 2 was outvoted, and the finding says why it was not ended
    assert sorted(findings) == ["sdc-compute-rank-2-step-2.json"], findings
    f = findings["sdc-compute-rank-2-step-2.json"]
    assert "no earlier replay of this layer had agreed" in f["summary"], f
    cov = json.loads((run_dir / "votes.json").read_text())
    assert cov["replay_not_checked"] == [
        "wobbly: did not reproduce before it ever agreed (step 2): treated as non-deterministic, "
        "not as a fault"
    ], cov
    # wobbly's later turns (steps 5, 8, 11) run no round: 11 replay steps, 3 of them its own
    assert cov["replay_rounds"] == 8, cov


@pytest.mark.timeout(240)
def test_a_bitflip_after_the_layer_agreed_still_ends_the_rank(tmp_path):
    # fc2 agreed at step 3; rank 1's outputs of fc2 carry a flipped bit from step 5 on
    run_dir, runs, findings = _run(
        tmp_path,
        SCOUT_INJECT="bitflip,bit=28,rank=1,step=5,every=1,target=activations,layer=fc2",
    )
    assert runs[1].returncode == SDC_EXIT, runs[1].stderr[-3000:]
    assert (
        "rank 1's recomputation of layer 'fc2' differs from the replicas' majority at step 6; "
        "ending this rank (exit 88)" in runs[1].stderr
    ), runs[1].stderr[-3000:]
    f = findings["sdc-compute-rank-1-step-6.json"]
    assert (f["rank"], f["component"], f["step"]) == (1, "compute", 6), f
    assert "no earlier replay" not in f["summary"] and "since_step" in f
    # the unreproducible layer was still left out, without ending anyone
    assert sum(UNREPRODUCED in r.stderr for r in runs) == 1
    assert set(findings) == {"sdc-compute-rank-2-step-2.json", "sdc-compute-rank-1-step-6.json"}


@pytest.mark.timeout(240)
def test_two_ranks_whose_recomputations_both_wobble_are_left_out_once(tmp_path):
    """Two ranks, noise on both (as atomics would make it): no majority, so the finding is
    inconclusive, as before; the layer is left out after it, said once, and nobody ends."""
    run_dir, runs, findings = _run(tmp_path, world=2, noisy="all")
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-3000:]
    assert sum(r.stderr.count(UNREPRODUCED) for r in runs) == 1
    # one round of wobbly compared (step 2); its later turns ran none
    assert [n for n in findings if "compute" in n] == ["inconclusive-compute-output-step-2.json"]
    cov = json.loads((run_dir / "votes.json").read_text())
    assert [n.split(":")[0] for n in cov["replay_not_checked"]] == ["wobbly"], cov
