"""Hang detection latency and failure-to-rerun time on a real local Slurm cluster (the lab: a
slurmctld and four slurmd on this machine, in their own state folder and ports, brought down
afterwards also on failure). 2 nodes x 2 ranks of the demo DDP trainer under scout-srun.

    python benchmarks/bench_lab_latency.py [--repeats 3] [--stall-floor 4]

Hang: a rank sleeps before a collective at step 10 (`--scout-inject=sleep`); from the moment
the bootstrap recorded the injection to the watchdogs' stall decision and to the controller
Epilog's verdict, set against the stall threshold the culprit's watchdog applied (the floor,
or 10 x the observed step time). Target: verdict within threshold + 2 s. Each run also prints
where the time went, every moment from the evidence: the culprit's last progress (as its
watchdog saw it), the first stall_suspect finding, the decision, the culprit's and the last
rank's exit records, the node Epilogs' records, the verdict. `--only hang|rerun` runs one half.
Rerun: a rank exits with code 3 at step 25 (checkpoints every 10 steps); from the failure (the
exit record's time) to the first rank of the requeued run starting on other nodes. Every run's
verdict is checked to name the planted rank and its node; drained nodes are resumed between runs.
Wall clocks of one machine: the lab's nodes share it, so the differences are exact.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ExitRecord,
    Finding,
    FindingKind,
    RankPlace,
    StallDecision,
    Verdict,
)
from scout_slurm.evidence.store import list_records, read_record
from scout_slurm.hooks.nodeevidence import NodeEvidence
from scout_slurm.lab.cluster import CLUSTER_NAME, Lab, LabSpec, free_port_base, lab_site_config
from scout_slurm.lab.demo import TRAIN
from scout_slurm.slurm import ops
from scout_slurm.task.watchdog import confirm_window_s


def script(inject: str, floor: float, train_args: str) -> str:
    py = sys.executable
    return f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={Path(py).parent}:$PATH
scout-srun --scout-stall-floor={floor} --scout-inject={inject} {py} {TRAIN} {train_args}
"""


def submit(lab: Lab, text: str, *extra: str) -> int:
    out = lab.paths.work / "bench-%j.out"
    return ops.submit_batch(
        text,
        ["-N2", "--ntasks-per-node=2", "--open-mode=append", f"--output={out}", *extra],
        timeout=20,
        env=lab.client_env(),
    )


def wait_for(what: str, ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def records(folder: JobFolder, directory: Path, pattern: str, cls) -> list:
    found, _ = (
        list_records(directory, pattern, cls, root=folder.root) if directory.exists() else ([], [])
    )
    return found


def check_named(v: Verdict, kind: str, rank: int, node: str, job: int) -> None:
    named = [(s.rank, s.node) for s in v.suspects]
    if v.kind.value != kind or named != [(rank, node)]:
        raise SystemExit(
            f"job {job}: verdict {v.kind.value} naming {named}, expected {kind} naming "
            f"{[(rank, node)]}"
        )


def resume_drains(lab: Lab) -> None:
    env = lab.client_env()
    for n in ops.list_nodes(timeout=10, env=env):
        if n.is_drained and n.reason.startswith("scout:"):
            ops.resume_node(n.name, timeout=10, env=env)


def hang_once(lab: Lab, rank: int, floor: float) -> dict:
    job = submit(
        lab,
        script(f"sleep,rank={rank},step=10", floor, "--steps 400 --step-sleep 0.02"),
        "--no-requeue",
    )
    folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job)
    wait_for(f"the verdict of job {job}", folder.verdict_path(0).exists, 240)
    v = read_record(folder.verdict_path(0), Verdict, root=folder.root)
    places = {p.rank: p for p in records(folder, folder.ranks_dir(0), "rank-*.json", RankPlace)}
    check_named(v, "hang", rank, places[rank].node, job)
    injected = records(folder, folder.findings_dir(0), "injected-*.json", Finding)
    d = read_record(folder.stall_decision_path(0), StallDecision, root=folder.root)
    exits = {e.rank: e for e in records(folder, folder.ranks_dir(0), "exit-*.json", ExitRecord)}
    last = exits[rank].last_progress if rank in exits else None
    threshold = last.threshold_s if last is not None and last.threshold_s > 0 else floor
    fault_at = min(f.at for f in injected)
    wait_for(
        f"job {job} to finish",
        lambda: ops.job_info(job, timeout=10, env=lab.client_env()).is_finished,
        120,
    )
    resume_drains(lab)  # scout drained the culprit's node: the next run needs it
    # the timeline, every moment from the evidence (one machine: one wall clock)
    found = records(folder, folder.findings_dir(0), "*.json", Finding)
    suspect = [f.at for f in found if f.kind == FindingKind.STALL_SUSPECT]
    epilogs = [
        read_record(folder.node_dir(n) / "epilog.json", NodeEvidence, root=folder.root).collected_at
        for n in {p.node for p in places.values()}
        if (folder.node_dir(n) / "epilog.json").exists()
    ]
    moments = {
        "last progress": last.published_at - last.idle_s if last is not None else None,
        "threshold passed": (last.published_at - last.idle_s + threshold)
        if last is not None
        else None,
        "stall suspect": min(suspect) if suspect else None,
        "decision": d.at,
        "culprit exited": exits[rank].at if rank in exits else None,
        "last rank exited": max(e.at for e in exits.values()) if exits else None,
        "node epilogs done": max(epilogs) if epilogs else None,
        "verdict": v.created_at,
    }
    return {
        "job": job,
        "threshold": threshold,
        "decision": d.at - fault_at,
        "verdict": v.created_at - fault_at,
        "timeline": {k: (t - fault_at if t is not None else None) for k, t in moments.items()},
    }


def rerun_once(lab: Lab, rank: int, floor: float) -> dict:
    ckpt = lab.paths.work / f"bench-ckpt-{time.time_ns()}"
    job = submit(
        lab,
        script(
            f"exit,rank={rank},step=25,code=3",
            floor,
            f"--steps 40 --step-sleep 0.02 --ckpt-dir {ckpt} --ckpt-every 10",
        ),
    )
    folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job)
    wait_for(f"the verdict of job {job}", folder.verdict_path(0).exists, 240)
    wait_for(
        f"the rerun of job {job}",
        lambda: len(records(folder, folder.ranks_dir(1), "rank-*.json", RankPlace)) == 4,
        240,
    )
    v = read_record(folder.verdict_path(0), Verdict, root=folder.root)
    run0 = {p.rank: p for p in records(folder, folder.ranks_dir(0), "rank-*.json", RankPlace)}
    run1 = records(folder, folder.ranks_dir(1), "rank-*.json", RankPlace)
    check_named(v, "crash", rank, run0[rank].node, job)
    if run0[rank].node in {p.node for p in run1}:
        raise SystemExit(f"job {job}: the rerun used the suspect node {run0[rank].node}")
    wait_for(
        f"job {job} to finish",
        lambda: ops.job_info(job, timeout=10, env=lab.client_env()).is_finished,
        240,
    )
    info = ops.job_info(job, timeout=10, env=lab.client_env())
    if info.state != "COMPLETED":
        raise SystemExit(f"job {job}: the rerun ended {info.state}")
    resume_drains(lab)
    return {
        "job": job,
        "failure_to_verdict": v.created_at - v.first_failure_at,
        "failure_to_rerun": min(p.started_at for p in run1) - v.first_failure_at,
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stall-floor", type=float, default=4.0)
    ap.add_argument(
        "--only", choices=("hang", "rerun"), default=None, help="run one of the two measurements"
    )
    ap.add_argument(
        "--state-dir",
        default=None,
        help="the lab's folder (default: a new one under /tmp, removed)",
    )
    args = ap.parse_args()
    state = Path(args.state_dir or f"/tmp/scout-bench-lab-{os.getpid()}")
    lab = Lab(
        LabSpec(
            state_dir=state,
            nodes=4,
            port_base=free_port_base(6, 40000, 50000),
            python=sys.executable,
        )
    )
    load0 = os.getloadavg()[0]
    confirm_s = confirm_window_s(lab_site_config(lab.spec).watchdog)
    hangs, reruns = [], []
    try:
        lab.up()
        for i in range(args.repeats if args.only != "rerun" else 0):
            hangs.append(hang_once(lab, 1 + i % 3, args.stall_floor))
            print(
                f"  hang {i + 1}: decision {hangs[-1]['decision']:.2f} s after the fault "
                f"(threshold {hangs[-1]['threshold']:.1f} s); "
                + ", ".join(
                    f"{k} {'-' if t is None else f'{t:+.2f}'}"
                    for k, t in hangs[-1]["timeline"].items()
                ),
                file=sys.stderr,
                flush=True,
            )
        for i in range(args.repeats if args.only != "hang" else 0):
            reruns.append(rerun_once(lab, 1 + i % 3, args.stall_floor))
            print(
                f"  rerun {i + 1}: {reruns[-1]['failure_to_rerun']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        try:
            lab.down()
        finally:
            if not args.state_dir:
                shutil.rmtree(state, ignore_errors=True)
    print(
        f"lab: 4 slurmd on this machine, 2 nodes x 2 ranks, stall floor {args.stall_floor:g} "
        "s, confirmation "
        f"window {confirm_s:g} s; {args.repeats} runs each; {os.cpu_count()} CPUs, load "
        f"average {load0:.1f} at "
        f"start, {os.getloadavg()[0]:.1f} at end"
    )
    print(f"{'what':<44} {'median (min, max)':>30}")
    if hangs:
        print("hang timeline, seconds after the fault:")
        for k in hangs[0]["timeline"]:
            got = [h["timeline"][k] for h in hangs if h["timeline"][k] is not None]
            if got:
                print(f"{'  ' + k:<44} {spread(got):>30}")
        print(f"{'hang: fault -> stall decision':<44} {spread([h['decision'] for h in hangs]):>30}")
        print(
            f"{'hang: decision - threshold':<44} "
            f"{spread([h['decision'] - h['threshold'] for h in hangs]):>30}"
        )
        print(
            f"{'hang: fault -> verdict (controller Epilog)':<44} "
            f"{spread([h['verdict'] for h in hangs]):>30}"
        )
        print(
            f"{'hang: verdict - threshold':<44} "
            f"{spread([h['verdict'] - h['threshold'] for h in hangs]):>30}"
        )
        print(
            f"SUMMARY\thang detection, fault to verdict (lab)\tthreshold "
            f"+ {spread([h['verdict'] - h['threshold'] for h in hangs])} (stall decision at "
            "threshold "
            f"+ {spread([h['decision'] - h['threshold'] for h in hangs])})\tthreshold + 2 s"
        )
    if reruns:
        print(
            f"{'crash: failure -> verdict':<44} "
            f"{spread([r['failure_to_verdict'] for r in reruns]):>30}"
        )
        print(
            f"{'crash: failure -> rerun started elsewhere':<44} "
            f"{spread([r['failure_to_rerun'] for r in reruns]):>30}"
        )
        print(
            "SUMMARY\tfailure to rerun on other nodes "
            f"(lab)\t{spread([r['failure_to_rerun'] for r in reruns])}\t"
        )
    print(
        "threshold: the stall threshold the culprit's watchdog applied (max of the floor and "
        "10 x its step time). "
        "The rerun time includes Slurm's own requeue (the job is held while its nodes finish "
        "their Epilogs)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
