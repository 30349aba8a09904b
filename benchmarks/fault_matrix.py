"""The fault matrix of issue 6: inject numerical faults (kinds x magnitudes x targets x ranks,
including rank 0 and the replay source) into small 4-rank training jobs under DDP, FSDP2 and HSDP
on a private lab cluster (4 slurmd, 2 nodes x 2 ranks a job), and the state faults into 8-rank HSDP
jobs with 4 replicas per shard (all 4 nodes), plus clean runs; each run is scored
against what scout named: the injected rank, its node and the component (weights, optimizer,
compute), nobody for clean runs.

    .venv/bin/python benchmarks/fault_matrix.py [--limit N] [--clean N] [--concurrency 2] [--json
    out.json]

Prints one row per cell (parallelism x target x kind: injected / named correctly / wrong /
inconclusive /
missed) and the clean runs, and writes every run to JSON. Takes about 12 s of 2 cores per run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scout_slurm.errors import SlurmError  # noqa: E402
from scout_slurm.evidence.layout import JobFolder  # noqa: E402
from scout_slurm.evidence.records import (  # noqa: E402
    ExitRecord,
    Finding,
    FindingComponent,
    FindingKind,
    RankPlace,
    Verdict,
    VerdictKind,
)
from scout_slurm.evidence.store import list_records, read_record  # noqa: E402
from scout_slurm.lab.cluster import CLUSTER_NAME, Lab, LabSpec, free_port_base  # noqa: E402
from scout_slurm.localise.verdict import is_cascade  # noqa: E402
from scout_slurm.remediation.plan import is_scout_drain  # noqa: E402
from scout_slurm.slurm import ops  # noqa: E402

JOBS = {
    "ddp": ROOT / "tests" / "jobs" / "train_ddp.py",
    "fsdp2": ROOT / "tests" / "jobs" / "train_fsdp2.py",
    "hsdp": ROOT / "tests" / "jobs" / "train_fsdp2.py",
    "hsdp4": ROOT / "tests" / "jobs" / "train_fsdp2.py",
}
TRAIN_ARGS = {
    "ddp": "--steps 12 --step-sleep 0 --momentum 0.9",
    "fsdp2": "--steps 12",
    "hsdp": "--steps 12 --hsdp",
    "hsdp4": "--steps 12 --hsdp --shard 2",
}
# hsdp: 4 ranks on 2 nodes, a 2x2 mesh (2 replicas per shard: a state difference has no strict
# majority);
# hsdp4: 8 ranks on all 4 nodes, a 4x2 mesh (4 replicas per shard), for the state faults
NODES = {"ddp": 2, "fsdp2": 2, "hsdp": 2, "hsdp4": 4}
STEPS = 12
EVERY = 1  # state votes and replay every step: a NaN caught before the all-reduce spreads it
FAULT_STEP = 3

# (kind spec, target) by target; compute faults recur (a faulty unit keeps corrupting)
STATE_FAULTS = [
    ("bitflip,bit=0", "weights"),
    ("bitflip,bit=12", "weights"),
    ("bitflip,bit=23", "weights"),
    ("bitflip,bit=31", "weights"),
    ("scale,factor=1.0001", "weights"),
    ("sign", "weights"),
    ("noise,sigma=1e-6", "weights"),
    ("nan", "weights"),
    ("inf", "weights"),
    ("sign", "optimizer"),
    ("bitflip,bit=0", "optimizer"),
    ("scale,factor=2", "optimizer"),
]
COMPUTE_FAULTS = [
    ("bitflip,bit=10,element=1", "activations"),
    ("bitflip,bit=30,element=1", "activations"),
    ("scale,factor=1.5", "activations"),
    ("sign,element=2", "activations"),
    ("noise,sigma=1e-3", "activations"),
    ("nan", "activations"),
    ("inf", "activations"),
    ("noise,sigma=1e-3", "gradients"),
    ("scale,factor=2", "gradients"),
    ("bitflip,bit=23", "gradients"),
    ("sign", "gradients"),
    # transient: in training only, right again when the replay asks (the source as a witness)
    ("sign,element=2,transient=1", "activations"),
    ("scale,factor=1.5,transient=1", "activations"),
]
# this rank's own weight gradient before the all-reduce (every replica then applies the same wrong
# update): noise, a gradient counted twice, one bit; seen where the replay source's own local
# gradient is comparable (DDP: FSDP2 reduce-scatters its unsharded copies before scout sees them)
LOCAL_GRADIENT_FAULTS = [
    ("noise,sigma=1e-4", "local_gradients"),
    ("scale,factor=2", "local_gradients"),
    ("bitflip,bit=20", "local_gradients"),
]
# a fault in this rank's optimizer update itself (what the step wrote, changed before scout signs
# it);
# persistent (the rank's recomputations of updates are wrong too) or transient (in training only).
# Where a shard has fewer than 3 replicas (pure FSDP2, HSDP 2x2) the update replay names it; DDP's
# 4 replicas name it by the state vote (seen there as weights that differ)
UPDATE_FAULTS = [
    ("bitflip,bit=0", "update"),
    ("bitflip,bit=23", "update"),
    ("sign", "update"),
    ("scale,factor=1.0001", "update"),
    ("noise,sigma=1e-6", "update"),
    ("bitflip,bit=12,transient=1", "update"),
    ("sign,transient=1", "update"),
]
# pure FSDP holds no replicated state and HSDP 2x2 two replicas: their state faults are named by the
# at-rest witness (each rank's own state re-signed across one step in K; here K = 1)
PLAN = {
    "ddp": STATE_FAULTS + COMPUTE_FAULTS + LOCAL_GRADIENT_FAULTS + UPDATE_FAULTS[:2],
    "hsdp": STATE_FAULTS + COMPUTE_FAULTS + UPDATE_FAULTS,
    "fsdp2": STATE_FAULTS + COMPUTE_FAULTS + UPDATE_FAULTS,
    "hsdp4": STATE_FAULTS[:6],
}


@dataclass(frozen=True)
class Run:
    parallelism: str
    kind: str  # "clean" or the fault kind and magnitude ("bitflip 23": bit 23; "scale 1.5")
    target: str
    spec: str  # the SCOUT_INJECT text ("" for clean)
    rank: int  # injected rank (-1: clean)
    job_id: int = 0
    node: str = ""
    verdict: str = ""
    named: tuple = ()
    components: tuple = ()
    outcome: str = (
        ""  # correct / wrong / inconclusive / missed / clean / nobody / false-positive / error
    )
    seconds: float = 0.0
    # ranks that failed after their distributed work had finished (exit records)
    failed_at_exit: tuple = ()


def runs(
    limit: int,
    clean: int,
    seed: int,
    pars: tuple[str, ...] = (),
    targets: tuple[str, ...] = (),
    transient_only: bool = False,
) -> list[Run]:
    out = []
    n = 0
    for par, faults in PLAN.items():
        for spec, target in faults:
            if (
                (pars and par not in pars)
                or (targets and target not in targets)
                or (transient_only and "transient" not in spec)
            ):
                n += 1
                continue
            world = 2 * NODES[par]
            for rank in (
                n % world,
                (n + world // 2) % world,
            ):  # every kind meets every rank; rank 0 and the replay source included
                recur = (
                    ",every=1"
                    if target in ("activations", "gradients", "local_gradients", "update")
                    else ""
                )
                text = f"{spec},rank={rank},step={FAULT_STEP},target={target}{recur}"
                label = " ".join(
                    "transient" if x == "transient=1" else x.split("=")[-1] if "=" in x else x
                    for x in spec.split(",")
                    if not x.startswith("element")
                )
                out.append(Run(par, label, target, text, rank))
            n += 1
    random.Random(seed).shuffle(out)
    out = out[:limit] if limit else out
    kinds = [p for p in PLAN if not pars or p in pars]
    cleans = [Run(kinds[i % len(kinds)], "clean", "-", "", -1) for i in range(clean)]
    # clean runs spread among the faults, so a run cut short by --minutes still has some of each
    mixed: list[Run] = []
    for i, r in enumerate(out):
        mixed.append(r)
        while cleans and len(cleans) * max(len(out), 1) > (len(out) - i - 1) * clean:
            mixed.append(cleans.pop(0))
    return mixed + cleans


def script(run: Run) -> str:
    inject = f"--scout-inject={run.spec}" if run.spec else ""
    return f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={os.path.dirname(sys.executable)}:$PATH
scout-srun --scout-consensus-every={EVERY} --scout-replay-every={EVERY} {inject} \\
  {sys.executable} {JOBS[run.parallelism]} {TRAIN_ARGS[run.parallelism]}
"""


def one(lab: Lab, run: Run, deadline_epoch: float = 0.0) -> Run:
    if deadline_epoch and time.time() > deadline_epoch:
        return Run(**{**asdict(run), "outcome": "skipped"})  # out of time: not run, not counted
    env = lab.client_env()
    t0 = time.monotonic()
    job = ops.submit_batch(
        script(run),
        [
            f"-N{NODES[run.parallelism]}",
            "--ntasks-per-node=2",
            "--no-requeue",
            f"--output={lab.paths.work / 'job-%j.out'}",
        ],
        timeout=20,
        env=env,
    )
    folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job)
    deadline = time.monotonic() + 420  # an 8-rank job waits for the whole lab
    while time.monotonic() < deadline:
        if folder.verdict_path(0).exists() and ops.job_info(job, timeout=10, env=env).is_finished:
            break
        time.sleep(0.5)
    else:
        return Run(
            **{**asdict(run), "job_id": job, "outcome": "error", "seconds": time.monotonic() - t0}
        )
    verdict = read_record(folder.verdict_path(0), Verdict)
    places, _ = list_records(folder.ranks_dir(0), "rank-*.json", RankPlace, root=folder.root)
    node = {p.rank: p.node for p in places}.get(run.rank, "")
    findings, _ = list_records(folder.findings_dir(0), "*.json", Finding, root=folder.root)
    comps = tuple(sorted({f.component for f in findings if f.kind == FindingKind.SDC}))
    exits, _ = list_records(folder.ranks_dir(0), "exit-*.json", ExitRecord, root=folder.root)
    at_exit = tuple(
        sorted(
            e.rank
            for e in exits
            if (e.signal or e.exit_code)
            and not is_cascade(e)
            and e.last_progress is not None
            and not e.last_progress.bootstrap_active
            and not e.last_progress.in_collective
        )
    )
    named = tuple((s.rank, s.node) for s in verdict.suspects)
    want_comp = {
        "weights": FindingComponent.WEIGHTS,
        "optimizer": FindingComponent.OPTIMIZER,
        "update": FindingComponent.OPTIMIZER,
    }.get(run.target, FindingComponent.COMPUTE).value
    kind = verdict.kind.value
    if run.rank < 0:
        # "nobody": not a clean verdict, but nobody named (a rank failed at exit, after the work)
        outcome = (
            "false-positive"
            if named
            else "clean"
            if verdict.kind is VerdictKind.CLEAN
            else "nobody"
        )
    elif (
        verdict.kind is VerdictKind.SDC
        and named == ((run.rank, node),)
        and (
            comps == (want_comp,)
            or (run.target == "update" and comps in (("weights",), ("optimizer",)))
        )
    ):
        # update: named by the update replay (optimizer), or by a state vote among 3+ replicas
        # (weights)
        outcome = "correct"
    elif verdict.kind is VerdictKind.SDC or named:
        outcome = "wrong"
    elif verdict.kind is VerdictKind.INCONCLUSIVE:
        outcome = "inconclusive"
    else:
        outcome = "missed"
    # a detected fault drains its node: return it to service for the next runs
    # (two runs at a time: the other one may have resumed it first)
    for n in ops.list_nodes(timeout=10, env=env):
        if n.is_drained and is_scout_drain(n.reason):
            try:
                ops.resume_node(n.name, timeout=10, env=env)
            except SlurmError:
                if any(
                    m.name == n.name and m.is_drained for m in ops.list_nodes(timeout=10, env=env)
                ):
                    raise
    return Run(
        **{
            **asdict(run),
            "job_id": job,
            "node": node,
            "verdict": kind,
            "named": named,
            "components": comps,
            "outcome": outcome,
            "seconds": round(time.monotonic() - t0, 1),
            "failed_at_exit": at_exit,
        }
    )


def table(done: list[Run]) -> str:
    cells: dict[tuple[str, str, str], dict[str, int]] = {}
    for r in done:
        if r.rank < 0:
            continue
        c = cells.setdefault((r.parallelism, r.target, r.kind), {})
        c[r.outcome] = c.get(r.outcome, 0) + 1
    cols = ("injected", "correct", "wrong", "inconclusive", "missed", "error")
    lines = [
        f"{'parallelism':<11} {'target':<12} {'kind':<16} " + " ".join(f"{c:>12}" for c in cols)
    ]
    total = {c: 0 for c in cols}
    for key in sorted(cells):
        c = cells[key]
        row = {"injected": sum(c.values()), **{k: c.get(k, 0) for k in cols[1:]}}
        for k in cols:
            total[k] += row[k]
        lines.append(
            f"{key[0]:<11} {key[1]:<12} {key[2]:<16} " + " ".join(f"{row[k]:>12}" for k in cols)
        )
    lines.append(f"{'all':<11} {'':<12} {'':<16} " + " ".join(f"{total[k]:>12}" for k in cols))
    clean = [r for r in done if r.rank < 0]
    for par in PLAN:
        mine = [r for r in clean if r.parallelism == par]
        if mine:
            ok = sum(r.outcome == "clean" for r in mine)
            nobody = sum(r.outcome == "nobody" for r in mine)
            lines.append(
                f"clean runs {par:<6}: {len(mine)} run, {ok + nobody} named nobody ({nobody} "
                "of them not "
                f"a clean verdict), {len(mine) - ok - nobody} named someone"
            )
    at_exit = [r for r in done if r.failed_at_exit]
    lines.append(
        f"runs where a rank failed at exit, after its distributed work: {len(at_exit)} of "
        f"{len(done)}"
        + "".join(
            f"\n  {r.parallelism} {r.kind} job {r.job_id}: ranks {list(r.failed_at_exit)}, "
            f"verdict {r.verdict}, named {list(r.named)}"
            for r in at_exit
        )
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--limit", type=int, default=0, help="run only the first N faults (after a seeded shuffle)"
    )
    ap.add_argument(
        "--clean", type=int, default=30, help="clean runs (spread over DDP, FSDP2, HSDP)"
    )
    ap.add_argument(
        "--concurrency", type=int, default=2, help="jobs at once (2-node jobs on a 4-node lab)"
    )
    ap.add_argument("--seed", type=int, default=6)
    ap.add_argument(
        "--parallelism", default="", help="only these, comma-separated (ddp, hsdp, fsdp2, hsdp4)"
    )
    ap.add_argument("--targets", default="", help="only these fault targets, comma-separated")
    ap.add_argument(
        "--transient-only", action="store_true", help="of the faults, only the transient ones"
    )
    ap.add_argument("--json", default="fault_matrix.json")
    ap.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="submit no new run after this many minutes (0: no limit)",
    )
    args = ap.parse_args()
    todo = runs(
        args.limit,
        args.clean,
        args.seed,
        tuple(p for p in args.parallelism.split(",") if p),
        tuple(t for t in args.targets.split(",") if t),
        args.transient_only,
    )
    state = Path(f"/tmp/scout-fault-matrix-{os.getpid()}")
    lab = Lab(
        LabSpec(
            state_dir=state,
            nodes=4,
            port_base=free_port_base(6, 40000, 50000),
            python=sys.executable,
            cpus_per_node=16,
        )
    )
    done: list[Run] = []
    t0 = time.monotonic()
    try:
        lab.up()
        with ThreadPoolExecutor(args.concurrency) as pool:
            stop = time.time() + args.minutes * 60 if args.minutes else 0.0
            for r in pool.map(lambda run: one(lab, run, stop), todo):
                if r.outcome == "skipped":
                    continue
                done.append(r)
                print(
                    f"[{len(done)}/{len(todo)} {time.monotonic() - t0:.0f}s] {r.parallelism} "
                    f"{r.spec or 'clean'}: "
                    f"{r.outcome} (verdict {r.verdict}, named {list(r.named)}, "
                    f"{list(r.components)})",
                    flush=True,
                )
    finally:
        lab.down()
        shutil.rmtree(state, ignore_errors=True)
    print()
    print(table(done))
    Path(args.json).write_text(
        json.dumps(
            {
                "steps": STEPS,
                "every": EVERY,
                "fault_step": FAULT_STEP,
                "wall_s": round(time.monotonic() - t0, 1),
                "runs": [asdict(r) for r in done],
            },
            indent=1,
        )
    )
    print(f"\n{len(done)} runs in {time.monotonic() - t0:.0f} s; every run in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
