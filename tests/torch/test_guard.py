"""scout never harms the job it watches: each of scout's checks and patched entry points made to
fail inside scout in turn (SCOUT_BREAK), in a real 2-rank DDP job with checkpoints on CPU/gloo.
The job completes with the same final bits as without scout, each rank that met the failure says
it once, loudly, and the evidence lists the check as not run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from scout_slurm.bootstrap.guard import CHECKS

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bootstrap import TRAIN, bare_env, run_ranks, scout_env

pytestmark = [pytest.mark.torch]

ARGS = ["--steps", "12", "--ckpt-every", "5", "--step-sleep", "0"]
# what only the lowest rank meets in this job: it alone writes the coverage record (every rank
# patches
# renames and reads a checkpoint back, so the checkpoint record and busy mark are met on every rank)
RANK0_ONLY = {"coverage record"}
# every 5 steps: votes, replay, at-rest, update replay and timing rounds all run within 12 steps
FAST = dict(SCOUT_CONSENSUS_EVERY="5", SCOUT_TIMING_EVERY="5")


def _train(tmp: Path, env: dict[str, str]) -> tuple[str, list]:
    out = tmp / "final.txt"
    ranks = run_ranks(
        [str(TRAIN), *ARGS, "--ckpt-dir", str(tmp / "ckpt"), "--out", str(out)],
        env,
        cwd=tmp / "cwd",
        deadline_s=180,
    )
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr[-2000:] for r in ranks]
    return out.read_text(), ranks


@pytest.fixture(scope="module")
def without_scout(tmp_path_factory) -> str:
    final, _ = _train(tmp_path_factory.mktemp("bare"), bare_env())
    return final


def _scout_env(run_dir: Path, **extra: str) -> dict[str, str]:
    for sub in ("findings", "ranks"):  # as scout-task makes them
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    return scout_env(
        run_dir,
        SCOUT_RUN_DIR=str(run_dir),
        SCOUT_CHECKPOINTS_DIR=str(run_dir / "checkpoints"),
        **FAST,
        **extra,
    )


def test_scout_itself_changes_no_bit_and_says_nothing_failed(tmp_path, without_scout):
    final, ranks = _train(tmp_path, _scout_env(tmp_path / "run"))
    assert final == without_scout
    assert not any("failed inside scout" in r.stderr for r in ranks)
    coverage = json.loads((tmp_path / "run" / "votes.json").read_text())
    assert coverage["checks_off"] == [] and coverage["votes"] >= 2, coverage


@pytest.mark.parametrize("check", CHECKS)
def test_a_check_failing_inside_scout_never_reaches_the_job(tmp_path, without_scout, check):
    run_dir = tmp_path / "run"
    final, ranks = _train(tmp_path, _scout_env(run_dir, SCOUT_BREAK=check))
    assert final == without_scout, f"{check} failing inside scout changed the job's numbers"
    loud = f"scout: ERROR: scout's {check} failed inside scout"
    for r in ranks:
        assert r.stderr.count(loud) <= 1, (
            r.rank,
            r.stderr[-3000:],
        )  # once, however often it is met
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    expected = [r.rank for r in ranks if loud in r.stderr]
    assert expected == ([0] if check in RANK0_ONLY else [0, 1]), [r.stderr[-3000:] for r in ranks]
    # the evidence: a finding per rank that met it (the verdict lists these as checks not run)...
    slug = "".join(ch if ch.isalnum() else "-" for ch in check)
    for rank in expected:
        if check == "process group start":
            break  # failed before the rank knew its number: said, but no finding of a rank to write
        finding = json.loads(
            (run_dir / "findings" / f"check-off-{slug}-rank-{rank}.json").read_text()
        )
        assert finding["kind"] == "check_off" and check in finding["summary"], finding
    # ...and the lowest rank's coverage record, where it could still write one
    coverage_path = run_dir / "votes.json"
    if check not in ("coverage record", "process group start"):
        coverage = json.loads(coverage_path.read_text())
        assert any(off.startswith(f"{check}: ") for off in coverage["checks_off"]), coverage


@pytest.mark.parametrize("backend", ["aot_eager", "eager"])
def test_a_compiled_ddp_job_gets_the_same_bits_with_scout(tmp_path, backend):
    """DDP wrapped in torch.compile: scout's parts stay out of the graphs (the job crashed at its
    first forward before), and the numbers are the job's own."""
    args = ["--compile", backend]
    bare = run_ranks(
        [str(TRAIN), *ARGS, *args, "--out", str(tmp_path / "bare.txt")],
        bare_env(),
        cwd=tmp_path / "bare",
        deadline_s=180,
    )
    run_dir = tmp_path / "run"
    scouted = run_ranks(
        [str(TRAIN), *ARGS, *args, "--out", str(tmp_path / "scout.txt")],
        _scout_env(run_dir),
        cwd=tmp_path / "scout",
        deadline_s=180,
    )
    assert [r.returncode for r in bare + scouted] == [0] * 4, [r.stderr[-2000:] for r in scouted]
    assert (tmp_path / "scout.txt").read_text() == (tmp_path / "bare.txt").read_text()
    assert not any("failed inside scout" in r.stderr or "global hooks" in r.stderr for r in scouted)
    coverage = json.loads((run_dir / "votes.json").read_text())
    assert coverage["votes"] >= 2 and coverage["checks_off"] == [], coverage


def test_the_jobs_own_exception_still_reaches_the_job(tmp_path):
    """An exception of the job's step (the injected `raise` fault stands for one; it fires from
    scout's optimizer hook) is not scout's failure: it propagates to the job unchanged, and no check
    is switched off for it."""
    ranks = run_ranks(
        [str(TRAIN), *ARGS, "--timeout", "10"],
        _scout_env(tmp_path / "run", SCOUT_INJECT="raise,rank=1,step=3"),
        cwd=tmp_path / "cwd",
        deadline_s=120,
    )
    assert ranks[1].returncode not in (0, None), ranks[1].stderr[-2000:]
    assert "RuntimeError: scout injected exception at step 3" in ranks[1].stderr, ranks[1].stderr[
        -2000:
    ]
    assert not any("failed inside scout" in r.stderr for r in ranks), [
        r.stderr[-2000:] for r in ranks
    ]
