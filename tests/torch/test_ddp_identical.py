"""DDP under scout reduces through its own C++ path (a recording wrapper of its group, no comm hook)
and gives plain DDP's bits at world sizes 2, 3 and 4, with several buckets in flight; each bucket
is still in the progress record. And the wrapper never holds the GIL where gloo's worker threads
need it (the deadlock that killed lab jobs at their second step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scout_slurm.evidence.records import ScoutCost
from scout_slurm.evidence.store import read_record
from tests.torch.test_bootstrap import JOBS, bare_env, read_progress, run_ranks, scout_env

pytestmark = [pytest.mark.torch]
JOB = JOBS / "ddp_buckets.py"


def _outputs(folder: Path, world: int) -> list[str]:
    return [(folder / f"final-rank-{r}.txt").read_text().split() for r in range(world)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ddp_under_scout_gives_plain_ddps_bits(tmp_path, world):
    argv = [str(JOB), "--steps", "5", "--out", "final"]
    plain = run_ranks(argv, bare_env(), cwd=tmp_path / "bare", world=world, deadline_s=100)
    run_dir = tmp_path / "scout" / "run"
    for d in ("findings", "ranks"):  # as scout-task prepares them
        (run_dir / d).mkdir(parents=True)
    scout = run_ranks(
        argv,
        scout_env(tmp_path / "scout", SCOUT_RUN_DIR=str(run_dir)),
        cwd=tmp_path / "scout",
        world=world,
        deadline_s=100,
    )
    for r in (*plain, *scout):
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stderr}"
    bare, hooked = _outputs(tmp_path / "bare", world), _outputs(tmp_path / "scout", world)
    assert len({b[0] for b in bare}) == 1  # DDP's replicas hold the same bytes
    assert [h[0] for h in hooked] == [b[0] for b in bare]  # and scout's the same as plain DDP's
    # DDP's own reduction path: no comm hook, the buckets through scout's recording wrapper
    assert {tuple(h[1:]) for h in hooked} == {("hooks=0", "group=RecordingGroup")}
    assert {tuple(b[1:]) for b in bare} == {("hooks=0", "group=ProcessGroup")}
    for rank in range(world):
        view = read_progress(tmp_path / "scout", rank)
        buckets = [e for e in view.recent if e.op == "ddp_bucket_all_reduce"]
        assert view.opt_steps == 5 and view.coll_entered == view.coll_completed
        # DDP reduces step 1 in one bucket and rebuilds its buckets after it: several a step from
        # step 2 on
        assert len(buckets) >= 1 + 4 * 2, [e.nbytes for e in buckets]
        assert all(e.left_ns >= e.entered_ns > 0 for e in buckets)
        # each rank's measure of scout's own cost: the 4 steps after the first, its buckets among
        # the collectives
        cost = read_record(run_dir / "ranks" / f"cost-{rank}.json", ScoutCost)
        assert (cost.rank, cost.steps) == (rank, 4) and cost.wrapper_calls >= 4 * 2
        assert cost.hooks_cpu_ns > 0 and cost.step_wall_ns > 0 and cost.per_step_ms > 0


@pytest.mark.timeout(120)
def test_the_wrapper_never_holds_the_gil_into_gloos_queue(tmp_path):
    """Regression: DDP's own calls into the wrapped group (here `_broadcast_coalesced`, as in
    `_rebuild_buckets`) against gloo worker threads freeing works the job launched and dropped.
    Without
    the pass-through collectives in pgwrap, both ranks deadlocked within a few hundred iterations
    (measured: every run, at 2000 iterations)."""
    env = bare_env()
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    runs = run_ranks(
        [str(JOBS / "pg_wrapper_stress.py"), "--iterations", "1500", "--hang-s", "60"],
        env,
        cwd=tmp_path,
        world=2,
        deadline_s=90,
    )
    for r in runs:
        assert r.returncode == 0, (
            f"rank {r.rank} exited {r.returncode} (1 with every thread dumped: "
            f"deadlocked)\n{r.stdout}\n{r.stderr}"
        )
        assert f"rank {r.rank}: 1500 iterations through the wrapper in" in r.stdout, r.stdout


@pytest.mark.timeout(60)
def test_buckets_are_left_at_the_end_of_their_backward(tmp_path):
    """The wrapper leaves the all-reduces launched in a backward together, at its end (autograd's
    final callback: no Python on gloo's threads per bucket); inside the backward they are open; a
    backward that raised has its entries left with the next backward's, or at the next settle
    (DDP's forward); an all-reduce launched outside any backward is left as it completes."""
    import json
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(JOBS / "pg_wrapper_record.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "inside": [2, 0],
        "after": [2, 2],
        "inside_failing": [4, 2],
        "after_failed": [4, 2],
        "next_backward": [6, 6],
        "settled": [8, 8],
        "outside": [9, 9],
    }, seen


@pytest.mark.timeout(120)
def test_a_bucket_still_in_flight_at_the_end_of_a_backward_is_left_on_the_training_thread(tmp_path):
    """Rank 1 reaches its last bucket 0.4 s late in every backward, so rank 0's backward graph ends
    with that all-reduce still in flight. DDP's own final callback waits for it; scout's record
    leaves it after that one, on the training thread: no Python of scout's on gloo's threads, where
    taking the GIL while the interpreter ends aborts the process ("terminate called without an
    active exception", exit -6, seen on ranks that had finished their job)."""
    run_dir = tmp_path / "run"
    for d in ("findings", "ranks"):
        (run_dir / d).mkdir(parents=True)
    runs = run_ranks(
        [str(JOB), "--steps", "3", "--out", "final", "--late-rank", "1", "--late-s", "0.4"],
        scout_env(tmp_path, SCOUT_RUN_DIR=str(run_dir)),
        cwd=tmp_path,
        world=2,
        deadline_s=100,
    )
    for r in runs:
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stderr}"
    for rank in range(2):
        view = read_progress(tmp_path, rank)
        assert view.opt_steps == 3 and view.coll_entered == view.coll_completed
        cost = read_record(run_dir / "ranks" / f"cost-{rank}.json", ScoutCost)
        assert cost.comm_thread_calls == 0, (
            f"rank {rank}: scout's Python ran {cost.comm_thread_calls} times on gloo's threads"
        )
