"""What everything scout runs inside the training process costs per optimizer step: the same
DDP job (gloo, CPU, an MLP with AdamW: 12.6M parameters at --width 1024, 3.1M at 512) run bare and
under scout's bootstrap (DDP reducing through scout's recording wrapper of its group, collective
wrappers, progress record, optimizer hooks; state votes and in-situ replay every K steps), with
K = 50 and votes off by default. Runs are interleaved in a shuffled order per repeat so that the
machine's load falls on every condition alike; each repeat's figure is divided by the same
repeat's bare run.

    python benchmarks/bench_step_overhead.py [--repeats 5] [--steps 50] [--world 2] [--ks 50]
    [--width 1024]

Two measures. The ratio: rank 0's mean CPU time per step over its steps after 5 warm-up steps
(CPU time: on a shared machine the wall clock moves with other work; a mean, not a median: a
vote every K steps is a spike that a median would hide), over the same repeat's bare run; the
wall-clock mean is printed beside. Two noisy runs compared: it cannot resolve 1 % here.
The direct measure: inside the same scout runs, every piece of scout's per-step work is wrapped
with a timer from outside scout before the first step (`account_scout`: the objects reachable from
`patches.STATE`, the global optimizer hooks, DDP's recording group), and its seconds per step are
divided by the step's, per component. Runs with votes are whole periods of K and of the timing
votes (every 25 steps), so each periodic piece counts at its steady rate. Scout runs get
SCOUT_CHECKPOINTS_DIR as under scout-srun (the checkpoint agreement is exchanged at the vote
steps). Beside them, scout's own measure of itself (ranks/cost-R.json, what `scout show` prints).
Every run's final parameters after the same number of steps are checked to be the bare run's,
bit for bit: scout changes no numbers.
"""

from __future__ import annotations

import argparse
import json
import math
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
TIMING_EVERY = (
    25  # the timing votes' default interval (SCOUT_TIMING_EVERY): not K, but per-step work too
)

# The direct measure's components, in print order. "wrappers" is the recording wrapper DDP reduces
# its
# buckets through (its Python and the progress record; the all_reduce launch inside it is the job's,
# as a
# bare DDP launches it too) plus the torch.distributed wrappers.
COMPONENTS = (
    "vote",
    "at-rest witness",
    "update replay",
    "replay",
    "timing",
    "checkpoint flag",
    "finite check",
    "wrappers",
    "progress record",
    "hook glue",
)
# run from DDP's reducer (during backward, while gloo reduces earlier buckets on its own threads):
# CPU is the calling thread's; every other component runs when no training work is in flight, so its
# CPU is the process's (gloo's threads working on scout's own collectives included)
THREAD_CPU = ("wrappers",)
JOB = "job"  # the job's own work inside a scout wrapper (a wrapped collective itself): not scout's


class Account:
    """Exclusive wall and CPU seconds per component, for functions wrapped in the worker from
    outside
    scout. Each timed call reads the wall clock (cheap) and one CPU clock: the calling thread's for
    THREAD_CPU components, the process's for the others (two CPU clocks a call would double the
    timers' own cost, which is counted in). Nested wrapped calls are taken out of the enclosing
    call's figure, read on the enclosing call's clock (so a vote's gather is the vote's, the
    wrapper's all_reduce launch is the job's); `inherit` wrappers (the progress record's
    enter/leave) count as whatever encloses them, or as their own component when nothing does."""

    def __init__(self) -> None:
        import threading

        self.local = threading.local()
        self.lock = threading.Lock()
        self.on = False
        self.totals: dict[str, list[float]] = {}  # component -> [wall, CPU, calls]

    def wrap(self, component: str, fn, *, inherit: bool = False):
        import functools

        acct = self
        clock, pcpu, tcpu = time.perf_counter, time.process_time, time.thread_time
        own_thread = component in THREAD_CPU

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            stack = getattr(acct.local, "stack", None)
            if stack is None:
                stack = acct.local.stack = []
            if inherit and stack:
                return fn(*args, **kwargs)
            thread = stack[-1][2] if stack else own_thread
            cpu = tcpu if thread else pcpu
            inner = [0.0, 0.0, thread]
            stack.append(inner)
            w0, c0 = clock(), cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                dc, dw = cpu() - c0, clock() - w0
                stack.pop()
                if stack:
                    outer = stack[-1]
                    outer[0] += dw
                    outer[1] += dc
                if acct.on:
                    with acct.lock:
                        tot = acct.totals.setdefault(component, [0.0, 0.0, 0])
                        tot[0] += dw - inner[0]
                        tot[1] += dc - inner[1]
                        tot[2] += 1

        return timed


def timer_cost(calls: int = 2000) -> float:
    """CPU seconds one timed call adds (the wrapper's clock reads and bookkeeping), from an empty
    function timed as scout's are, called back to back (warm caches): included in the figures,
    said beside them. `COLD` times the same empty call after each backward, where scout's own
    calls come after the job's compute has evicted the interpreter's data from the caches."""
    acct = Account()
    acct.on = True
    timed = acct.wrap("x", lambda: None)
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        for _ in range(calls):
            timed()
        best = min(best, (time.process_time() - t0) / calls)
    return best


COLD = (
    "empty timed call after backward"  # the timers' own cost where the caches are cold: not scout's
)


def _cell(fn, name: str):
    """The closure cell holding `name` in function `fn` (None when scout's code no longer has
    it).
    """
    code = getattr(fn, "__code__", None)
    if code is None or name not in code.co_freevars or not fn.__closure__:
        return None
    return fn.__closure__[code.co_freevars.index(name)]


def account_scout(acct: Account) -> list[str]:
    """Wrap everything scout runs per step in this process with `acct`'s timers, from outside scout
    (bound methods on the objects reachable from patches.STATE, the global optimizer hooks, closure
    cells), before the first forward. Returns what could not be reached, to be said."""
    import torch.distributed.distributed_c10d as c10d
    import torch.optim.optimizer as optim_mod

    from scout_slurm.bootstrap import ckptstate, patches

    state = patches.STATE
    missing: list[str] = []

    def methods(obj, names, component, what):
        if obj is None:
            missing.append(f"{what} (off)")
            return
        for name in names:
            if hasattr(obj, name):
                setattr(obj, name, acct.wrap(component, getattr(obj, name)))

    # the optimizer pre/post step hooks scout registered: their own lines are "hook glue"
    for hooks_dict in (
        optim_mod._global_optimizer_pre_hooks,
        optim_mod._global_optimizer_post_hooks,
    ):
        for key, h in list(hooks_dict.items()):
            if getattr(h, "__module__", "").startswith("scout_slurm"):
                hooks_dict[key] = acct.wrap("hook glue", h)
    methods(state.consensus, ("maybe_vote", "track"), "vote", "state votes")
    methods(getattr(state, "atrest", None), ("seal", "check"), "at-rest witness", "at-rest witness")
    methods(
        getattr(state, "update", None),
        ("before_step", "after_step"),
        "update replay",
        "update replay",
    )
    methods(state.timing, ("pause", "resume", "after_step"), "timing", "timing votes")
    methods(ckptstate.WATCH, ("before_step", "exchange"), "checkpoint flag", "checkpoint agreement")
    methods(
        getattr(state, "finite", None),
        ("_note", "after_step", "resolve"),
        "finite check",
        "finite check",
    )
    replay = state.replay
    methods(replay, ("before_step",), "replay", "replay")
    if replay is not None:  # the capture hooks are made at the first step: wrap what makes them
        for name in ("_pre_hook", "_post_hook"):
            make = getattr(replay, name, None)
            if make is not None:
                setattr(replay, name, lambda idx, make=make: acct.wrap("replay", make(idx)))
    writer = state.writer
    if writer is None:
        missing.append("progress record")
    else:
        for name in ("enter", "leave", "leave_many"):
            setattr(writer, name, acct.wrap("wrappers", getattr(writer, name), inherit=True))
        writer.step = acct.wrap("progress record", writer.step)
        writer.beat = acct.wrap("progress record", writer.beat)  # each forward of a model: progress
    # DDP's buckets: through scout's recording wrapper of its group (pgwrap), DDP's own C++ path
    # otherwise;
    # the wrapper's lines are "wrappers", the launch of the group's all_reduce inside it is the
    # job's
    from scout_slurm.bootstrap import pgwrap

    group = pgwrap.recording(state.default_pg)
    if group is None:
        missing.append("DDP's recording group (DDP reduced through scout's comm hook instead)")
    else:

        class TimedGroup:
            """The wrapped group as the wrapper calls it: its all_reduce launch timed as the
            job's.
            """

            def __init__(self, pg) -> None:
                self._pg = pg
                self.allreduce = acct.wrap(JOB, pg.allreduce)

            def __getattr__(self, name):
                return getattr(self._pg, name)

        group._pg = TimedGroup(group._pg)
        pgwrap.RecordingGroup.allreduce = acct.wrap("wrappers", pgwrap.RecordingGroup.allreduce)
        # the buckets are left at the end of the backward (a wait inside it for a bucket still in
        # flight
        # blocks; DDP would wait for it right there too), or, outside a backward, as each completes
        pgwrap.RecordingGroup._backward_done = acct.wrap(
            "wrappers", pgwrap.RecordingGroup._backward_done
        )
        pgwrap._left = acct.wrap("wrappers", pgwrap._left)
    # torch.distributed's collectives as the job calls them: the wrapper's own time only
    for name in patches.COLLECTIVES:
        fn = getattr(c10d, name, None)
        inner_cell = (
            _cell(fn, "fn") if getattr(fn, "__scout_original__", None) is not None else None
        )
        if inner_cell is None:
            continue
        inner_cell.cell_contents = acct.wrap(JOB, inner_cell.cell_contents)
        timed = acct.wrap("wrappers", fn)
        for owner in (c10d, __import__("torch.distributed", fromlist=["x"])):
            if getattr(owner, name, None) is fn:
                setattr(owner, name, timed)
    return missing


def rank_job(args: argparse.Namespace) -> int:
    """One rank of the reference job (started by the parent with RANK, WORLD_SIZE, MASTER_*)."""
    import datetime
    import hashlib

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=300))
    rank = dist.get_rank()
    # "cuda": each rank its own GPU (LOCAL_RANK); "cuda:N": every rank on GPU N
    device = torch.device(
        f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if args.device == "cuda" else args.device
    )
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    width = args.width
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width),
        torch.nn.GELU(),
        torch.nn.Linear(2 * width, 2 * width),
        torch.nn.GELU(),
        torch.nn.Linear(2 * width, 2 * width),
        torch.nn.GELU(),
        torch.nn.Linear(2 * width, width),
    )
    params = sum(p.numel() for p in model.parameters())
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index or 0] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1000 + rank)
    acct, missing, cold = None, [], None
    if (
        "scout_slurm.bootstrap.patches" in sys.modules
    ):  # under scout's bootstrap: the direct measure too
        acct = Account()
        missing = account_scout(acct)
        cold = acct.wrap(COLD, lambda: None)
    times, cpu = [], []
    digest = ""
    for step in range(WARMUP + args.steps):
        if acct is not None and step == WARMUP:
            acct.on = True  # the measured steps only, as the step times
        x = torch.randn(args.batch, width, generator=gen).to(device)
        t0, c0 = time.perf_counter(), time.process_time()
        loss = ddp(x).pow(2).mean()
        loss.backward()
        if cold is not None:
            cold()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:  # a step's time is its GPU work's too
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if (
            step + 1 == WARMUP + args.digest_at
        ):  # runs of different lengths compare at the same step
            digest = hashlib.sha256(
                b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
            ).hexdigest()
    timer_s = 0.0
    upd = getattr(sys.modules.get("scout_slurm.bootstrap.patches"), "STATE", None)
    upd = getattr(upd, "update", None)
    update = (
        {"rounds": upd.rounds, "bytes": upd.bytes_moved, "off": upd.off}
        if upd is not None
        else None
    )
    if acct is not None:
        acct.on = False
        timer_s = timer_cost()
    print(
        json.dumps(
            {
                "rank": rank,
                "params": params,
                "times": times[WARMUP:],
                "cpu": cpu[WARMUP:],
                "digest": digest,
                "scout": acct.totals if acct is not None else None,
                "missing": missing,
                "timer_s": timer_s,
                "update": update,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_for(
    k: int | None, args: argparse.Namespace, settings: dict[str, str] | None = None
) -> int:
    """Bare and votes-off runs: --steps; with votes every K: at least one vote's worth (K steps:
    one vote and one replay per K steps, the steady rate), rounded up to whole periods of the
    timing votes too (every 25 steps whatever K is) and of the replay and timing intervals a
    condition sets, so that the window holds each periodic piece of work at its steady rate."""
    if not k:
        return args.steps
    periods = [k, TIMING_EVERY] + [
        int(settings[key])
        for key in ("SCOUT_REPLAY_EVERY", "SCOUT_TIMING_EVERY")
        if int((settings or {}).get(key, "0") or 0) > 0
    ]
    period = math.lcm(*periods)
    return -(-max(args.vote_steps_min, k) // period) * period


def direct(ranks: list[dict]) -> dict:
    """Scout's own per-step seconds (per component, wall and CPU) over each rank's mean step, then
    the mean over the ranks."""
    per_rank = []
    for r in ranks:
        n = len(r["times"])
        wall = {c: v[0] / n for c, v in r["scout"].items() if c not in (JOB, COLD)}
        cpu = {c: v[1] / n for c, v in r["scout"].items() if c not in (JOB, COLD)}
        calls = {c: v[2] / n for c, v in r["scout"].items()}
        per_rank.append(
            dict(
                wall=wall,
                cpu=cpu,
                calls=calls,
                step_wall=statistics.fmean(r["times"]),
                step_cpu=statistics.fmean(r["cpu"]),
            )
        )
    comps = sorted(
        {c for pr in per_rank for c in pr["wall"]},
        key=lambda c: (c not in COMPONENTS, COMPONENTS.index(c) if c in COMPONENTS else 0),
    )
    mean = statistics.fmean
    out = dict(
        components=comps,
        wall={c: mean(pr["wall"].get(c, 0.0) for pr in per_rank) for c in comps},
        cpu={c: mean(pr["cpu"].get(c, 0.0) for pr in per_rank) for c in comps},
        calls={c: mean(pr["calls"].get(c, 0.0) for pr in per_rank) for c in comps},
        ratio_wall=mean(sum(pr["wall"].values()) / pr["step_wall"] for pr in per_rank),
        ratio_cpu=mean(sum(pr["cpu"].values()) / pr["step_cpu"] for pr in per_rank),
        missing=sorted({m for r in ranks for m in r.get("missing") or ()}),
        timers=mean(
            r["timer_s"] * sum(v[2] for c, v in r["scout"].items() if c != COLD) / len(r["times"])
            for r in ranks
        ),
        timers_cold=mean(
            r["scout"][COLD][1]
            / r["scout"][COLD][2]
            * sum(v[2] for c, v in r["scout"].items() if c != COLD)
            / len(r["times"])
            for r in ranks
            if COLD in r["scout"]
        ),
    )
    out["scout_wall"] = sum(out["wall"].values())
    out["scout_cpu"] = sum(out["cpu"].values())
    return out


def run(
    condition: str, k: int | None, args: argparse.Namespace, work: Path, settings: dict[str, str]
) -> dict:
    """Start the ranks; k None: bare (no bootstrap on PYTHONPATH); `settings`: further SCOUT_*
    settings.
    """
    import scout_slurm

    bootstrap = Path(scout_slurm.__file__).resolve().parent / "bootstrap" / "site"
    env = {
        key: v
        for key, v in os.environ.items()
        if not key.startswith("SCOUT_") and key != "PYTHONPATH"
    }
    env["OMP_NUM_THREADS"] = "1"
    run_dir = Path(tempfile.mkdtemp(prefix=f"{condition}-", dir=work))
    if k is not None:
        for d in ("progress", "findings", "ranks"):
            (run_dir / d).mkdir()
        env.update(
            PYTHONPATH=str(bootstrap),
            SCOUT_PROGRESS_DIR=str(run_dir / "progress"),
            SCOUT_RUN_DIR=str(run_dir),
            SCOUT_PACKAGE_DIR=str(bootstrap.parent.parent),
            SCOUT_CHECKPOINTS_DIR=str(run_dir / "checkpoints"),  # as scout-srun sets it
            SCOUT_CONSENSUS_EVERY=str(k),
        )
        env.update(settings)
    port = free_port()
    procs = []
    argv = [
        sys.executable,
        str(HERE),
        "--rank-job",
        "--steps",
        str(steps_for(k, args, settings)),
        "--width",
        str(args.width),
        "--batch",
        str(args.batch),
        "--backend",
        args.backend,
        "--device",
        args.device,
        "--digest-at",
        str(min(args.steps, args.vote_steps_min)),
    ]
    try:
        for rank in range(args.world):
            procs.append(
                subprocess.Popen(
                    argv,
                    env=dict(
                        env,
                        RANK=str(rank),
                        LOCAL_RANK=str(rank),
                        WORLD_SIZE=str(args.world),
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(port),
                    ),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (_, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            raise SystemExit(f"{condition}: rank {rank} exited {p.returncode}:\n{err[-3000:]}")
    ranks = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    result = ranks[0]
    scout_lines = [ln for _, err in outs for ln in err.splitlines() if ln.startswith("scout:")]
    if k is not None and any("disagree" in ln or "outlier" in ln for ln in scout_lines):
        raise SystemExit(
            f"{condition}: scout reported a disagreement in a clean run: {scout_lines[:5]}"
        )
    own = None
    if k is not None:
        from scout_slurm.evidence.records import ScoutCost
        from scout_slurm.evidence.store import read_record

        own = read_record(run_dir / "ranks" / "cost-0.json", ScoutCost)
    return dict(
        result,
        condition=condition,
        wall=statistics.fmean(result["times"]),
        mean=statistics.fmean(result["cpu"]),
        direct=direct(ranks) if k is not None else None,
        own_ms=own.per_step_ms if own else None,
        own_share=own.share if own else None,
        own_split=(
            own.hooks_cpu_ns / own.steps / 1e6,
            own.wrapper_ns / own.steps / 1e6,
            own.wrapper_calls / own.steps,
        )
        if own and own.steps
        else None,
    )


def _spread(values: list[float], scale: float = 100.0, fmt: str = ".2f") -> str:
    return (
        f"{statistics.median(values) * scale:{fmt}} "
        f"({' '.join(f'{v * scale:{fmt}}' for v in values)})"
    )


def print_direct(conditions, results: dict[str, list[dict]], args: argparse.Namespace) -> None:
    """The direct measure: scout's own seconds per step inside the same processes, over the step."""
    print()
    print(
        "direct: scout's own per-step work timed inside the training processes (mean of the "
        "ranks), over the step; "
        "median of the repeats (the repeats)"
    )
    print(
        f"{'condition':<22} {'scout ms/step wall':>18} {'% of step, wall':>30} "
        f"{'scout ms/step CPU':>17} "
        f"{'% of step, CPU':>30}"
    )
    for name, k, _ in conditions:
        if k is None:
            continue
        ds = [r["direct"] for r in results[name]]
        print(
            f"{name:<22} {statistics.median(d['scout_wall'] for d in ds) * 1e3:>18.3f} "
            f"{_spread([d['ratio_wall'] for d in ds]):>30} "
            f"{statistics.median(d['scout_cpu'] for d in ds) * 1e3:>17.3f} "
            f"{_spread([d['ratio_cpu'] for d in ds]):>30}"
        )
    comps = [
        c
        for c in COMPONENTS
        if any(c in r["direct"]["wall"] for rs in results.values() for r in rs if r["direct"])
    ]
    print()
    print(
        "split by component: ms per step, wall / CPU (median of the repeats); calls per step "
        "in brackets"
    )
    print(f"{'condition':<22} " + " ".join(f"{c:>17}" for c in comps))
    for name, k, _ in conditions:
        if k is None:
            continue
        ds = [r["direct"] for r in results[name]]
        cells = []
        for c in comps:
            w = statistics.median(d["wall"].get(c, 0.0) for d in ds) * 1e3
            cp = statistics.median(d["cpu"].get(c, 0.0) for d in ds) * 1e3
            n = statistics.median(d["calls"].get(c, 0.0) for d in ds)
            cells.append(f"{w:.3f}/{cp:.3f} ({n:.2g})")
        print(f"{name:<22} " + " ".join(f"{c:>17}" for c in cells))
    missing = sorted(
        {m for rs in results.values() for r in rs if r["direct"] for m in r["direct"]["missing"]}
    )
    if missing:
        print(
            "not timed (off or not reachable in this version of the bootstrap): "
            f"{', '.join(missing)}"
        )
    ups = [
        (name, u)
        for name, rs in results.items()
        for r in rs
        for u in [r.get("update")]
        if u and u["rounds"]
    ]
    if ups:
        name, u = ups[0]
        wall = statistics.median(
            r["direct"]["wall"].get("update replay", 0.0) for r in results[name] if r["direct"]
        )
        k = next(k for n, k, _ in conditions if n == name)
        print(
            f"optimizer update replay ({name}): {u['rounds']} rounds, "
            f"{u['bytes'] / u['rounds'] / 1e6:.2f} MB "
            "broadcast from the source a round (a slice of its parameters, gradients and "
            "optimizer state), "
            f"{wall * k * 1e3:.1f} ms per {k} steps on each rank"
        )
    timers = statistics.median(
        r["direct"]["timers"] for rs in results.values() for r in rs if r["direct"]
    )
    cold = statistics.median(
        r["direct"]["timers_cold"] for rs in results.values() for r in rs if r["direct"]
    )
    print(
        f"the timers' own cost, included above: ~{timers * 1e3:.3f} ms CPU per step with warm "
        "caches, "
        f"~{cold * 1e3:.3f} ms if every timed call cost what an empty one costs right after "
        "the backward "
        f"(cold caches; an upper bound)"
    )
    params = results["bare"][0]["params"]
    for name, k, _ in conditions:
        if k is None:
            continue
        ds = [r["direct"] for r in results[name]]
        ratios = [r["mean"] / b["mean"] for r, b in zip(results[name], results["bare"])]
        top = max(
            ds[0]["components"], key=lambda c: statistics.median(d["cpu"].get(c, 0.0) for d in ds)
        )
        cpu = [d["ratio_cpu"] for d in ds]
        print(
            f"SUMMARY\tscout's per-step cost in the training process, {name}\t"
            f"direct {100 * statistics.median(cpu):.2f} % of the step CPU (repeats "
            f"{100 * min(cpu):.2f} to "
            f"{100 * max(cpu):.2f}), "
            f"{100 * statistics.median(d['ratio_wall'] for d in ds):.2f} % wall; largest "
            f"{top} {statistics.median(d['cpu'].get(top, 0.0) for d in ds) * 1e3:.2f} ms "
            "CPU/step; ratio to bare "
            f"{statistics.median(ratios):.3f} (repeats {min(ratios):.3f} to "
            f"{max(ratios):.3f}); {params / 1e6:.1f}M "
            f"params, {statistics.median(r['mean'] for r in results['bare']) * 1e3:.0f} ms "
            "CPU steps"
            f"\tunder 1 % at K = 50"
        )
    print()
    print(
        "scout's own measure of itself (ranks/cost-0.json, what `scout show` prints), median "
        "of the repeats "
        "(the repeats): ms per step, % of the step's wall time"
    )
    for name, k, _ in conditions:
        if k is None:
            continue
        rs = results[name]
        split = [r["own_split"] for r in rs if r["own_split"]]
        print(
            f"{name:<22} {_spread([r['own_ms'] for r in rs], 1.0, '.3f')} ms   "
            f"{_spread([r['own_share'] or 0.0 for r in rs])} %"
            + (
                f"   hooks {statistics.median(x[0] for x in split):.3f} ms, wrappers "
                f"{statistics.median(x[1] for x in split):.3f} ms for "
                f"{statistics.median(x[2] for x in split):.1f} "
                f"collectives"
                if split
                else ""
            )
        )
    print(
        "direct: every piece of scout's per-step work in the job's processes wrapped with a "
        "timer from outside "
        "(state vote, in-situ replay and its capture hooks, timing votes, the checkpoint "
        "agreement exchanged at "
        "the vote steps, the non-finite check, the recording wrapper DDP reduces through (its "
        "own C++ path: no "
        "comm hook) with the progress record, the optimizer hooks' own lines and scout's "
        "measure of its own cost); "
        "nested timed calls are counted once, in the innermost. CPU: process CPU time, but "
        "the wrappers' is "
        "their thread's, as they run while gloo reduces other buckets. Wall includes waiting "
        "for the peer in "
        "scout's collectives (and, on a loaded machine, time the process waited for a core)."
    )


def parse_settings(spec: str) -> dict[str, str]:
    """ "SCOUT_REPLAY_EVERY=100,SCOUT_TIMING_EVERY=50" -> a dict; anything else is refused by
    name.
    """
    settings = {}
    for item in spec.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or not key.startswith("SCOUT_") or not value:
            raise SystemExit(f"--with {spec!r}: {item!r} is not SCOUT_<SETTING>=<value>")
        if key in (
            "SCOUT_CONSENSUS_EVERY",
            "SCOUT_RUN_DIR",
            "SCOUT_PROGRESS_DIR",
            "SCOUT_PACKAGE_DIR",
        ):
            raise SystemExit(f"--with {spec!r}: {key} is the benchmark's own (K is --ks)")
        settings[key] = value
    return settings


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--steps",
        type=int,
        default=50,
        help="measured steps of a bare or votes-off run (after 5 warm-up)",
    )
    ap.add_argument(
        "--vote-steps-min",
        type=int,
        default=200,
        help="measured steps of a run with votes every K: max(this, K), in whole periods; 200 at "
        "K = 50: four of each periodic round, the replay over every layer of the reference "
        "model (one period alone is one sample of each, the replay always on the first layer)",
    )
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--ks", default="50", help="vote intervals K to measure")
    ap.add_argument("--width", type=int, default=1024, help="model width (1024: 12.6M parameters)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--backend",
        default="gloo",
        help="gloo, or nccl with --device cuda (scripts/device_check.sh)",
    )
    ap.add_argument(
        "--device",
        default="cpu",
        help="cpu; cuda:0 (every rank on that GPU); cuda (a GPU per rank)",
    )
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=0, help="order of the interleaved runs")
    ap.add_argument(
        "--with",
        dest="with_settings",
        action="append",
        default=[],
        metavar="VAR=VALUE[,VAR=VALUE]",
        help="a further condition at the first K with these SCOUT_* settings (what a knob buys); "
        "repeatable",
    )
    ap.add_argument("--rank-job", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--digest-at", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_job:
        return rank_job(args)

    ks = [int(k) for k in args.ks.split(",") if k]
    conditions = [("bare", None, {}), ("scout, votes off", 0, {})] + [
        (f"scout, K={k}", k, {}) for k in ks
    ]
    if 1 in ks:  # what the in-situ replay adds to the votes, at its most frequent
        conditions.append(("scout, K=1 no replay", 1, {"SCOUT_REPLAY_EVERY": "0"}))
    for spec in args.with_settings:
        settings = parse_settings(spec)
        conditions.append(
            (
                f"scout, K={ks[0]} "
                + ",".join(f"{key[len('SCOUT_') :]}={v}" for key, v in settings.items()),
                ks[0],
                settings,
            )
        )
    order = random.Random(args.seed)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in conditions}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="scout-step-") as tmp:
        for rep in range(args.repeats):
            todo = list(conditions)
            order.shuffle(todo)
            for name, k, settings in todo:
                r = run(name, k, args, Path(tmp), settings)
                results[name].append(r)
                d = r["direct"]
                print(
                    f"  repeat {rep + 1}: {name}: mean step {r['mean'] * 1e3:.1f} ms CPU, "
                    f"{r['wall'] * 1e3:.1f} ms wall"
                    + (
                        f"; scout's own {d['scout_wall'] * 1e3:.2f} ms wall "
                        f"({100 * d['ratio_wall']:.2f} %), "
                        f"{d['scout_cpu'] * 1e3:.2f} ms CPU ({100 * d['ratio_cpu']:.2f} %)"
                        if d
                        else ""
                    ),
                    file=sys.stderr,
                    flush=True,
                )
    digests = {r["digest"] for rs in results.values() for r in rs}
    if len(digests) != 1:
        raise SystemExit(
            f"the runs ended with different parameters ({len(digests)} digests): scout "
            "changed numbers"
        )
    params = results["bare"][0]["params"]
    print(
        f"per-step cost of scout in the training process: {args.world} gloo ranks on CPU, "
        f"{params / 1e6:.1f}M-parameter "
        f"MLP, AdamW, batch {args.batch}, {args.steps} steps a bare run (with votes: "
        f"max({args.vote_steps_min}, K)), "
        f"{args.repeats} interleaved repeats; "
        f"{os.cpu_count()} CPUs, load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        f"{'condition':<22} {'CPU ms/step':>11} {'ratio to bare (median)':>23} "
        f"{'ratios of the repeats':>30} "
        f"{'wall ms/step':>12} {'wall ratio':>10}"
    )
    for name, _, _ in conditions:
        means = [r["mean"] for r in results[name]]
        ratios = [m / b["mean"] for m, b in zip(means, results["bare"])]
        walls = [r["wall"] / b["wall"] for r, b in zip(results[name], results["bare"])]
        print(
            f"{name:<22} {statistics.median(means) * 1e3:>11.1f} "
            f"{statistics.median(ratios):>23.4f} "
            f"{' '.join(f'{x:.4f}' for x in ratios):>30} "
            f"{statistics.median(r['wall'] for r in results[name]) * 1e3:>12.1f} "
            f"{statistics.median(walls):>10.3f}"
        )
    print(
        "CPU: rank 0's process CPU time per step (all its threads, gloo's included), the "
        "steady figure on a "
        "shared machine; wall: the same steps by the clock, which moves with the machine's "
        "load. ratio: a repeat's mean "
        "step time over the same repeat's bare run; the spread of the repeats is the noise "
        "of this machine. Every run had the bare run's parameters after the same steps, bit "
        "for bit."
    )
    print_direct(conditions, results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
