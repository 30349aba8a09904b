"""What everything scout runs inside the training process costs per optimizer step: the same
DDP job (gloo, CPU, a 12.6M-parameter MLP with AdamW) run bare and under scout's bootstrap
(collective wrappers, progress record, optimizer hook; state votes and in-situ replay every K
steps), with K = 1, 10, 50 and votes off. Runs are interleaved in a shuffled order per repeat
so that the machine's load falls on every condition alike; each repeat's figure is divided by
the same repeat's bare run.

    python benchmarks/bench_step_overhead.py [--repeats 3] [--steps 100] [--world 2] [--ks 1,10,50]

The figure per run is rank 0's mean CPU time per step over its steps after 5 warm-up steps
(CPU time: on a shared machine the wall clock moves with other work; a mean, not a median: a
vote every K steps is a spike that a median would hide); the wall-clock mean is printed beside. Every run's final
parameters after the same number of steps are checked to be the bare run's, bit for bit: scout
changes no numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
WARMUP = 5


def rank_job(args: argparse.Namespace) -> int:
    """One rank of the reference job (started by the parent with RANK, WORLD_SIZE, MASTER_*)."""
    import datetime
    import hashlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    width = args.width
    model = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, 2 * width), torch.nn.GELU(),
                                torch.nn.Linear(2 * width, width))
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)
    times, cpu = [], []
    digest = ""
    for step in range(WARMUP + args.steps):
        x = torch.randn(args.batch, width, generator=gen)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if step + 1 == WARMUP + args.digest_at:   # runs of different lengths compare at the same step
            digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    if rank == 0:
        print(json.dumps({"params": params, "times": times[WARMUP:], "cpu": cpu[WARMUP:], "digest": digest}), flush=True)
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_for(k: int | None, args: argparse.Namespace) -> int:
    """Bare and votes-off runs: --steps; with votes every K: at least one vote's worth (K steps:
    one vote and one replay per K steps, the steady rate)."""
    return args.steps if not k else max(args.vote_steps_min, k)


def run(condition: str, k: int | None, args: argparse.Namespace, work: Path, *, replay: bool = True) -> dict:
    """Start the ranks; k None: bare (no bootstrap on PYTHONPATH)."""
    import scout_slurm
    bootstrap = Path(scout_slurm.__file__).resolve().parent / "bootstrap" / "site"
    env = {key: v for key, v in os.environ.items() if not key.startswith("SCOUT_") and key != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    run_dir = Path(tempfile.mkdtemp(prefix=f"{condition}-", dir=work))
    if k is not None:
        for d in ("progress", "findings"):
            (run_dir / d).mkdir()
        env.update(PYTHONPATH=str(bootstrap), SCOUT_PROGRESS_DIR=str(run_dir / "progress"),
                   SCOUT_RUN_DIR=str(run_dir), SCOUT_PACKAGE_DIR=str(bootstrap.parent.parent),
                   SCOUT_CONSENSUS_EVERY=str(k))
        if not replay:
            env["SCOUT_REPLAY_EVERY"] = "0"
    port = free_port()
    procs = []
    argv = [sys.executable, str(HERE), "--rank-job", "--steps", str(steps_for(k, args)), "--width", str(args.width),
            "--batch", str(args.batch),
            "--digest-at", str(min(args.steps, args.vote_steps_min))]
    try:
        for rank in range(args.world):
            procs.append(subprocess.Popen(argv, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank),
                                                         WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1",
                                                         MASTER_PORT=str(port)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise SystemExit(f"{condition}: rank {rank} exited {p.returncode}:\n{err[-3000:]}")
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    scout_lines = [ln for _, err in outs for ln in err.splitlines() if ln.startswith("scout:")]
    if k is not None and any("disagree" in ln or "outlier" in ln for ln in scout_lines):
        raise SystemExit(f"{condition}: scout reported a disagreement in a clean run: {scout_lines[:5]}")
    return dict(result, condition=condition, wall=statistics.fmean(result["times"]),
                mean=statistics.fmean(result["cpu"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="measured steps of a bare or votes-off run (after 5 warm-up)")
    ap.add_argument("--vote-steps-min", type=int, default=20,
                    help="measured steps of a run with votes every K: max(this, K)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ks", default="1,10,50", help="vote intervals K to measure")
    ap.add_argument("--width", type=int, default=1024, help="model width (1024: 12.6M parameters)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0, help="order of the interleaved runs")
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--digest-at", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        return rank_job(args)

    ks = [int(k) for k in args.ks.split(",") if k]
    conditions = [("bare", None, True), ("scout, votes off", 0, True)] + [(f"scout, K={k}", k, True) for k in ks]
    if 1 in ks:   # what the in-situ replay adds to the votes, at its most frequent
        conditions.append(("scout, K=1 no replay", 1, False))
    order = random.Random(args.seed)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in conditions}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="scout-step-") as tmp:
        for rep in range(args.repeats):
            todo = list(conditions)
            order.shuffle(todo)
            for name, k, replay in todo:
                r = run(name, k, args, Path(tmp), replay=replay)
                results[name].append(r)
                print(f"  repeat {rep + 1}: {name}: mean step {r['mean'] * 1e3:.1f} ms CPU, {r['wall'] * 1e3:.1f} ms wall",
                      file=sys.stderr, flush=True)
    digests = {r["digest"] for rs in results.values() for r in rs}
    if len(digests) != 1:
        raise SystemExit(f"the runs ended with different parameters ({len(digests)} digests): scout changed numbers")
    params = results["bare"][0]["params"]
    print(f"per-step cost of scout in the training process: {args.world} gloo ranks on CPU, {params / 1e6:.1f}M-parameter "
          f"MLP, AdamW, batch {args.batch}, {args.steps} steps a bare run (with votes: max({args.vote_steps_min}, K)), "
          f"{args.repeats} interleaved repeats; "
          f"{os.cpu_count()} CPUs, load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"{'condition':<22} {'CPU ms/step':>11} {'ratio to bare (median)':>23} {'ratios of the repeats':>30} "
          f"{'wall ms/step':>12} {'wall ratio':>10}")
    for name, _, _ in conditions:
        means = [r["mean"] for r in results[name]]
        ratios = [m / b["mean"] for m, b in zip(means, results["bare"])]
        walls = [r["wall"] / b["wall"] for r, b in zip(results[name], results["bare"])]
        print(f"{name:<22} {statistics.median(means) * 1e3:>11.1f} {statistics.median(ratios):>23.4f} "
              f"{' '.join(f'{x:.4f}' for x in ratios):>30} {statistics.median(r['wall'] for r in results[name]) * 1e3:>12.1f} "
              f"{statistics.median(walls):>10.3f}")
    for name, _, _ in conditions[1:]:
        ratios = [r["mean"] / b["mean"] for r, b in zip(results[name], results["bare"])]
        print(f"SUMMARY\tper-step cost in the training process, {name}\tratio {statistics.median(ratios):.4f} "
              f"(repeats {min(ratios):.4f} to {max(ratios):.4f}; {params / 1e6:.1f}M params, "
              f"{statistics.median(r['mean'] for r in results['bare']) * 1e3:.0f} ms steps)\tunder 1 % at K = 50")
    print("CPU: rank 0's process CPU time per step (all its threads, gloo's included), the steady figure on a "
          "shared machine; wall: the same steps by the clock, which moves with the machine's load. ratio: a repeat's mean "
          "step time over the same repeat's bare run; the spread of the repeats is the noise "
          "of this machine. Every run had the bare run's parameters after the same steps, bit for bit.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
