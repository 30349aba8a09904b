"""scout's bootstrap in real multi-rank torch jobs (CPU, gloo, no Slurm): what the progress record
holds after a run, that the hooks change no numbers, that a site's own sitecustomize and a user's
DDP comm hook keep working, that the hooks come off again, checkpoint notes, injected faults."""

from __future__ import annotations

import json
import os
import site
import socket
import subprocess
import sys
import textwrap
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import scout_slurm
from scout_slurm.task import progress

pytestmark = [pytest.mark.torch]

JOBS = Path(__file__).resolve().parents[1] / "jobs"
TRAIN = JOBS / "train_ddp.py"
USER_HOOK_JOB = JOBS / "ddp_user_hook.py"
BOOTSTRAP_DIR = Path(scout_slurm.__file__).resolve().parent / "bootstrap" / "site"
# What the parent's environment must not leak into a rank: these are set per run.
_RUN_KEYS = (
    "PYTHONPATH",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_RESTART_COUNT",
    "TORCH_FR_BUFFER_SIZE",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _RUN_KEYS and not k.startswith("SCOUT_")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def scout_env(run_dir: Path, *, extra_path: tuple[Path, ...] = (), **scout: str) -> dict[str, str]:
    """What scout-task gives a rank: the bootstrap first on PYTHONPATH and a progress folder."""
    progress_dir = run_dir / "progress"
    progress_dir.mkdir(parents=True, exist_ok=True)
    env = bare_env()
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in (BOOTSTRAP_DIR, *extra_path))
    env["SCOUT_PROGRESS_DIR"] = str(progress_dir)
    env["SCOUT_PACKAGE_DIR"] = str(BOOTSTRAP_DIR.parent.parent)
    env.update(scout)
    return env


@dataclass(frozen=True)
class RankRun:
    rank: int
    returncode: int | None  # None: still running at the deadline, killed by the test
    stdout: str
    stderr: str


def run_ranks(
    argv: list[str],
    env: dict[str, str],
    *,
    cwd: Path,
    world: int = 2,
    deadline_s: float = 60.0,
    python: str = sys.executable,
    after_a_failure_s: float | None = None,
) -> list[RankRun]:
    """Start `world` ranks of `python argv...` as a gloo job on 127.0.0.1, wait for them until the
    deadline, and kill (by pid) any of them still running then. `after_a_failure_s`: once a rank
    has exited non-zero, the others get that long before they are killed (a test whose peers can
    only wait out their collective timeout then, as under a launcher that ends the job)."""
    cwd.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs: list[subprocess.Popen] = []
    codes: list[int | None] = []
    try:
        for rank in range(world):
            rank_env = dict(
                env,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            with (
                open(cwd / f"rank-{rank}.out", "wb") as out,
                open(cwd / f"rank-{rank}.err", "wb") as err,
            ):
                procs.append(
                    subprocess.Popen(
                        [python, *argv],
                        env=rank_env,
                        cwd=cwd,
                        stdout=out,
                        stderr=err,
                        stdin=subprocess.DEVNULL,
                    )
                )
        end = time.monotonic() + deadline_s
        if after_a_failure_s is not None:
            while time.monotonic() < end and any(p.poll() is None for p in procs):
                if any(p.poll() not in (None, 0) for p in procs):
                    end = min(end, time.monotonic() + after_a_failure_s)
                    break
                time.sleep(0.2)
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(0.1, end - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [
        RankRun(
            rank,
            codes[rank],
            (cwd / f"rank-{rank}.out").read_text(errors="replace"),
            (cwd / f"rank-{rank}.err").read_text(errors="replace"),
        )
        for rank in range(world)
    ]


def assert_clean(runs: list[RankRun]) -> None:
    for r in runs:
        assert r.returncode == 0, f"rank {r.rank} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
        assert f"rank {r.rank}: done" in r.stdout
        # rank 0 announces what replay covers and, at its first vote (the end-of-training one in a
        # run shorter than K), the replica groups; anything else scout says on stderr is a warning
        said = [
            line
            for line in r.stderr.splitlines()
            if "scout:" in line
            and not line.startswith(
                ("scout: in-situ replay every ", "scout: state votes every ", "scout: framework: ")
            )
        ]
        assert said == [], r.stderr


def read_progress(run_dir: Path, rank: int) -> progress.ProgressView:
    view = progress.read(run_dir / "progress" / f"rank-{rank}.bin")
    assert view is not None, f"no progress record for rank {rank} in {run_dir}"
    return view


def tensor_bytes(checkpoint: Path) -> list[bytes]:
    """The raw storages in a torch.save archive, in order (the archive's own name and
    serialization id differ between files, the tensors' bytes must not)."""
    with zipfile.ZipFile(checkpoint) as z:
        names = [n for n in z.namelist() if n.split("/")[-2:-1] == ["data"]]
        return [z.read(n) for n in sorted(names, key=lambda n: int(n.rsplit("/", 1)[1]))]


def checkpoint_notes(folder: Path) -> dict[str, dict]:
    return (
        {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
        if folder.exists()
        else {}
    )


@pytest.fixture(scope="module")
def scout_run(tmp_path_factory) -> tuple[Path, list[RankRun]]:
    """One 2-rank, 20-step run of the demo job under the bootstrap, shared by several tests."""
    run_dir = tmp_path_factory.mktemp("scout-run")
    env = scout_env(run_dir, SCOUT_CHECKPOINTS_DIR=str(run_dir / "notes"))
    runs = run_ranks(
        [
            str(TRAIN),
            "--steps",
            "20",
            "--step-sleep",
            "0",
            "--timeout",
            "30",
            "--ckpt-dir",
            "ckpt",
            "--ckpt-every",
            "10",
        ],
        env,
        cwd=run_dir,
    )
    return run_dir, runs


@pytest.mark.timeout(90)
def test_progress_record_counts_every_collective_and_step(scout_run):
    run_dir, runs = scout_run
    assert_clean(runs)
    for rank in (0, 1):
        view = read_progress(run_dir, rank)
        assert (view.rank, view.world_size) == (rank, 2)
        assert view.opt_steps == 20
        # the job's: per step one DDP bucket and one logging all_reduce (40); scout's own on its
        # side group,
        # recorded as scout_vote: none during the 20 steps (the checkpoint exchange rides on the
        # vote steps,
        # none at K = 50), then at destroy_process_group the checkpoint flag (1) and one signature
        # exchange
        # for both saves (1), and the end-of-training state vote (1)
        assert view.coll_entered == view.coll_completed == 40 + 1 + 1 + 1
        assert view.recent[-1].op == "scout_vote"  # the last: the end-of-training vote
        assert view.recent[-2].op == "scout_vote"  # before it: the saves' exchange
        assert not view.in_collective and view.current_op == "none"
        assert not view.active  # atexit marked the record as finished
        ops = [e.op for e in view.recent]
        assert [e.seq for e in view.recent] == list(range(1, 44))
        assert [op for op in ops if op != "scout_vote"] == [
            "ddp_bucket_all_reduce",
            "all_reduce",
        ] * 20
        assert ops.count("scout_vote") == 3
        # the flag is one int64 summed over the side group, not one per rank gathered
        # (at 100k ranks: 800 KB and 100k output tensors); the exchange after the saves gathers
        assert [e.nbytes for e in view.recent if e.op == "scout_vote"].count(8) == 1
        assert {e.nbytes for e in view.recent if e.op == "all_reduce"} == {4}
        assert all(e.left_ns >= e.entered_ns > 0 for e in view.recent)
    assert [(e.seq, e.op, e.nbytes) for e in read_progress(run_dir, 0).recent] == [
        (e.seq, e.op, e.nbytes) for e in read_progress(run_dir, 1).recent
    ]


@pytest.mark.timeout(90)
def test_bootstrap_changes_no_numbers(tmp_path):
    """Three ranks, not two: scout's DDP hook must scale as DDP does (times 1/3, not divided by
    3; the two round differently), which a world of two cannot show."""
    argv = [
        str(TRAIN),
        "--steps",
        "5",
        "--step-sleep",
        "0",
        "--timeout",
        "30",
        "--out",
        "checksum.txt",
        "--ckpt-dir",
        "ckpt",
        "--ckpt-every",
        "5",
    ]
    hooked = run_ranks(argv, scout_env(tmp_path / "scout"), cwd=tmp_path / "scout", world=3)
    plain = run_ranks(argv, bare_env(), cwd=tmp_path / "bare", world=3)
    assert_clean(hooked)
    assert_clean(plain)
    assert (
        read_progress(tmp_path / "scout", 2).coll_entered == 10 + 1
    )  # and the end-of-training vote
    assert not (tmp_path / "bare" / "progress").exists()
    assert (tmp_path / "scout" / "checksum.txt").read_text() == (
        tmp_path / "bare" / "checksum.txt"
    ).read_text()
    with_scout = tensor_bytes(tmp_path / "scout" / "ckpt" / "step-5.pt")
    without = tensor_bytes(tmp_path / "bare" / "ckpt" / "step-5.pt")
    # 4 parameters, plus the RNG states the demo saves since its checkpoints restore them
    assert len(with_scout) == len(without) >= 4
    assert with_scout == without  # every tensor of the checkpoint, bit for bit


@pytest.mark.timeout(90)
def test_torch_save_by_rank0_writes_checkpoint_notes(scout_run):
    run_dir, runs = scout_run
    assert_clean(runs)
    notes = checkpoint_notes(run_dir / "notes")
    assert sorted(notes) == ["run-0-step-10-rank-0.json", "run-0-step-20-rank-0.json"]
    for step in (10, 20):
        note = notes[f"run-0-step-{step}-rank-0.json"]
        assert note["record_kind"] == "checkpoint-note"
        assert (note["step"], note["rank"], note["restart"]) == (step, 0, 0)
        assert note["path"] == str(run_dir / "ckpt" / f"step-{step}.pt")
        assert note["size_bytes"] == (run_dir / "ckpt" / f"step-{step}.pt").stat().st_size


@pytest.mark.timeout(60)
def test_user_comm_hook_composes_and_dot_saves_write_no_note(tmp_path):
    env = scout_env(tmp_path, SCOUT_CHECKPOINTS_DIR=str(tmp_path / "notes"))
    runs = run_ranks(
        [str(USER_HOOK_JOB), "--steps", "4", "--save-dir", str(tmp_path), "--timeout", "30"],
        env,
        cwd=tmp_path,
    )
    assert_clean(runs)
    for rank in (0, 1):
        view = read_progress(tmp_path, rank)
        assert view.opt_steps == 4
        # the user's hook calls dist.all_reduce itself: still one entry per bucket, not two
        # (and scout's own: the checkpoint flag and signatures for final.pt at the end, no flag per
        # step,
        # and the end-of-training vote)
        assert view.coll_entered == view.coll_completed == 8 + 2 + 1
        assert [e.op for e in view.recent if e.op != "scout_vote"] == [
            "ddp_bucket_all_reduce",
            "all_reduce",
        ] * 4
    assert (tmp_path / ".scratch.pt").exists() and (tmp_path / "final.pt").exists()
    notes = checkpoint_notes(tmp_path / "notes")
    assert list(notes) == ["run-0-step-4-rank-0.json"]
    assert notes["run-0-step-4-rank-0.json"]["path"] == str(tmp_path / "final.pt")


@pytest.mark.timeout(60)
def test_site_sitecustomize_still_runs_under_the_bootstrap(tmp_path):
    user_site = tmp_path / "user-site"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text(
        "import os\nwith open(os.environ['USER_SITE_MARKER'], 'a') as fh:\n    "
        "fh.write(f'{os.getpid()}\\n')\n"
    )
    env = scout_env(tmp_path, extra_path=(user_site,), USER_SITE_MARKER=str(tmp_path / "marker"))
    runs = run_ranks(
        [str(TRAIN), "--steps", "3", "--step-sleep", "0", "--timeout", "30"],
        env,
        cwd=tmp_path,
        world=1,
    )
    assert_clean(runs)
    assert len((tmp_path / "marker").read_text().split()) == 1
    view = read_progress(tmp_path, 0)
    assert (view.opt_steps, view.coll_entered, view.coll_completed) == (3, 6, 6)


@pytest.mark.timeout(60)
def test_job_runs_with_a_warning_where_scout_is_not_importable(tmp_path):
    """The job's interpreter lacks scout_slurm (as in a container or another environment) and
    SCOUT_PACKAGE_DIR names a folder that is not there: the job runs, scout says so once."""
    if sys.prefix == sys.base_prefix:
        pytest.skip(
            "needs a virtual environment: its base interpreter is the one without scout_slurm"
        )
    base_python = getattr(sys, "_base_executable", "") or os.path.join(
        sys.base_prefix, "bin", "python3"
    )
    missing = tmp_path / "not-here"
    env = scout_env(
        tmp_path,
        extra_path=tuple(Path(p) for p in site.getsitepackages()),  # torch, not scout
        SCOUT_PACKAGE_DIR=str(missing),
    )
    # a job that imports nothing of scout's (the demo job finds its code through the package)
    runs = run_ranks(
        [str(USER_HOOK_JOB), "--steps", "2", "--timeout", "30"],
        env,
        cwd=tmp_path,
        world=1,
        python=base_python,
    )
    run = runs[0]
    assert run.returncode == 0, run.stderr
    assert "rank 0: done" in run.stdout
    scout_lines = [line for line in run.stderr.splitlines() if line.startswith("scout:")]
    assert len(scout_lines) == 1, run.stderr
    assert scout_lines[0].startswith("scout: bootstrap not installed")
    assert str(missing) in scout_lines[0]
    assert not list((tmp_path / "progress").iterdir())


_REVERSIBLE_AFTER_IMPORT = textwrap.dedent("""
    import datetime, gc, sys
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP
    from scout_slurm.bootstrap import patches
    from scout_slurm.task import progress

    progress_dir, port = Path(sys.argv[1]), int(sys.argv[2])
    def current():
        return {"dist.all_reduce": dist.all_reduce, "c10d.all_reduce": c10d.all_reduce,
                "dist.init_process_group": dist.init_process_group,
                "c10d.init_process_group": c10d.init_process_group,
                "DDP.register_comm_hook": DDP.register_comm_hook, "DDP.forward": DDP.forward,
                "torch.save": torch.save}
    originals = current()
    handle = patches.install(progress_dir)
    assert patches.install(progress_dir) is handle, "installing twice must be a no-op"
    assert dist.all_reduce is c10d.all_reduce is not originals["dist.all_reduce"]
    assert dist.all_reduce.__scout_original__ is originals["dist.all_reduce"]
    assert dist.init_process_group is not originals["dist.init_process_group"]
    late = ("DDP.register_comm_hook", "DDP.forward", "torch.save")
    assert all(current()[k] is originals[k] for k in late), "patched before init_process_group"

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=20))
    assert all(current()[k] is not originals[k] for k in originals), "not all patched after init"
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    dist.all_reduce(torch.ones(1))
    view = progress.read(progress_dir / "rank-0.bin")
    assert (view.opt_steps, view.coll_entered, view.coll_completed) == (1, 2, 2), view

    handle.remove()
    assert all(current()[k] is originals[k] for k in originals), "not all restored"
    opt.step()
    dist.all_reduce(torch.ones(1))
    view = progress.read(progress_dir / "rank-0.bin")
    assert (view.opt_steps, view.coll_entered) == (1, 2), ("still counting after remove()", view)
    again = patches.install(progress_dir)
    assert again is not handle and dist.all_reduce is not originals["dist.all_reduce"]
    again.remove()
    assert all(current()[k] is originals[k] for k in originals)
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    print("reversible: ok")
""")

_REVERSIBLE_BEFORE_IMPORT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from scout_slurm.bootstrap import patches
    assert "torch" not in sys.modules, "the hooks module must not import torch"

    def finders():
        return [f for f in sys.meta_path if isinstance(f, patches.PatchAfterImport)]
    first = patches.install(Path(sys.argv[1]))
    assert len(finders()) == 1 and patches.install(Path(sys.argv[1])) is first
    first.remove()
    assert not finders(), "remove() left the import hook behind"

    handle = patches.install(Path(sys.argv[1]))
    import torch.distributed as dist  # patched by the import hook, before this line sees the module
    from torch.distributed import distributed_c10d as c10d
    assert dist.all_reduce is c10d.all_reduce
    bare = dist.all_reduce.__scout_original__
    assert not hasattr(bare, "__scout_original__"), (
        "wrapped twice: the removed import hook still ran"
    )
    handle.remove()
    assert not finders()
    assert dist.all_reduce is bare and c10d.all_reduce is bare
    print("reversible: ok")
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "script",
    [_REVERSIBLE_AFTER_IMPORT, _REVERSIBLE_BEFORE_IMPORT],
    ids=["after-torch-import", "import-hook"],
)
def test_hooks_are_reversible(script, tmp_path):
    """In a fresh process each, so the module's state starts clean and no test hook is needed."""
    (tmp_path / "progress").mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "progress"), str(free_port())],
        env=bare_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert "reversible: ok" in proc.stdout


@pytest.mark.timeout(90)
def test_skip_allreduce_desyncs_the_named_rank(tmp_path):
    (tmp_path / "run" / "findings").mkdir(
        parents=True
    )  # scout-task prepares the run's evidence folder
    env = scout_env(
        tmp_path, SCOUT_INJECT="skip_allreduce,rank=1,step=3", SCOUT_RUN_DIR=str(tmp_path / "run")
    )
    runs = run_ranks(
        [str(TRAIN), "--steps", "8", "--step-sleep", "0", "--timeout", "5"],
        env,
        cwd=tmp_path,
        deadline_s=40,
    )
    assert "scout: injecting fault skip_allreduce on rank 1 at step 3" in runs[1].stderr
    assert "scout: injection not recorded" not in runs[1].stderr
    assert "injecting" not in runs[0].stderr
    assert not all(r.returncode == 0 for r in runs), "a desynchronised job cannot finish cleanly"
    r0, r1 = read_progress(tmp_path, 0), read_progress(tmp_path, 1)
    assert r0.opt_steps == r1.opt_steps == 3
    ops0, ops1 = {e.seq: e.op for e in r0.recent}, {e.seq: e.op for e in r1.recent}
    assert [ops0[s] for s in range(1, 6)] == [ops1[s] for s in range(1, 6)]
    # step 3's logging all_reduce (seq 6): rank 0 entered it, rank 1 skipped to step 4's bucket
    assert (ops0[6], ops1[6]) == ("all_reduce", "ddp_bucket_all_reduce")
    injected = sorted(p.name for p in (tmp_path / "run" / "findings").glob("*.json"))
    assert len(injected) == 1 and injected[0].startswith("injected-rank-1-")


@pytest.mark.timeout(60)
def test_exit_fault_gives_its_code_on_the_named_rank(tmp_path):
    env = scout_env(tmp_path, SCOUT_INJECT="exit,rank=0,step=2,code=3")
    runs = run_ranks(
        [str(TRAIN), "--steps", "6", "--step-sleep", "0", "--timeout", "10"],
        env,
        cwd=tmp_path,
        deadline_s=40,
    )
    assert runs[0].returncode == 3, runs[0].stderr
    assert "scout: injecting fault exit on rank 0 at step 2" in runs[0].stderr
    assert runs[1].returncode != 0 and "injecting" not in runs[1].stderr
    r0 = read_progress(tmp_path, 0)
    assert r0.opt_steps == 2 and not r0.active
    assert r0.coll_entered == r0.coll_completed == 3  # step 2's logging all_reduce never came


_FORWARDING_JOB = textwrap.dedent("""
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    out = torch.zeros(2 * dist.get_world_size())
    # torch 2.13 forwards it to all_gather_single
    dist.all_gather_into_tensor(out, torch.ones(2))
    dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2 * dist.get_world_size()))
    # all_gather inside
    dist.all_gather_object([None] * dist.get_world_size(), {"rank": dist.get_rank()})
    dist.destroy_process_group()
""")


def test_fsdp2_collectives_recorded_and_forwarded_ones_once(tmp_path):
    """FSDP2 on torch 2.13 calls all_gather_single and reduce_scatter_single: in the record (before,
    every FSDP2 rank stood at 0 collectives). A collective torch forwards to another is one
    entry."""
    runs = run_ranks(
        [str(JOBS / "train_fsdp2.py"), "--steps", "4"],
        scout_env(tmp_path / "fsdp"),
        cwd=tmp_path / "a",
    )
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    views = [read_progress(tmp_path / "fsdp", rank) for rank in (0, 1)]
    ops = [e.op for e in views[0].recent]
    assert ops.count("all_gather_single") >= 4 and ops.count("reduce_scatter_single") >= 4, ops
    assert views[0].coll_entered == views[1].coll_entered == views[0].coll_completed > 8, views

    job = tmp_path / "forwarding.py"
    job.write_text(_FORWARDING_JOB)
    runs = run_ranks([str(job)], scout_env(tmp_path / "fwd"), cwd=tmp_path / "b")
    assert [r.returncode for r in runs] == [0, 0], [r.stderr[-2000:] for r in runs]
    view = read_progress(tmp_path / "fwd", 0)
    assert [e.op for e in view.recent if e.op != "scout_vote"] == [
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_gather_object",
    ], view.recent
