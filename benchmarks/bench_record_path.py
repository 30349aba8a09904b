"""What recording one collective costs in CPU, before and after issue 24, in one process:

- the progress record's enter + leave: main's ProgressWriter (read from git, `--before REF`) against
  this tree's, on records in a temporary folder;
- one DDP bucket's all-reduce as scout recorded it before (a comm hook: scale the bucket by 1/world,
  record, launch from Python, a `then` callback to record the end; copied below from the hook as it
  was) and now (DDP's reducer calls scout's recording wrapper of its group, which launches the
  group's all_reduce and records it, with a done-callback), against the bare launch, on a 1-rank
  gloo group so that only CPU work is measured. The calls alternate in blocks so drift cancels.

    python benchmarks/bench_record_path.py [--calls 3000] [--before main] [--kb 1,4096]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = 10


def _module_from_git(ref: str, path: str, name: str):
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tmp = Path(tempfile.mkdtemp()) / f"{name}.py"
    tmp.write_text(text)
    spec = importlib.util.spec_from_file_location(name, tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _per_call_us(fns: dict, calls: int) -> dict[str, float]:
    """Thread CPU per call, median over BLOCKS alternating blocks."""
    per = {k: [] for k in fns}
    n = max(1, calls // BLOCKS)
    for _ in range(BLOCKS):
        for k, fn in fns.items():
            t0 = time.thread_time_ns()
            for _ in range(n):
                fn()
            per[k].append((time.thread_time_ns() - t0) / n / 1e3)
    return {k: statistics.median(v) for k, v in per.items()}


def record_only(before_ref: str, calls: int) -> dict[str, float]:
    from scout_slurm.task import progress as now

    old = _module_from_git(before_ref, "scout_slurm/task/progress.py", "progress_before")
    d = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    writers = {}
    for label, mod in (("before", old), ("now", now)):
        mod.create(d / f"{label}.bin")
        writers[label] = mod.ProgressWriter(d / f"{label}.bin", rank=0, world_size=2)

    def pair(w):
        return lambda: w.leave(w.enter("ddp_bucket_all_reduce", 4096, 2, 7))

    return _per_call_us({k: pair(w) for k, w in writers.items()}, calls)


def bucket_paths(calls: int, kbs: list[int]) -> dict[str, dict[str, float]]:
    import torch
    import torch.distributed as dist

    from scout_slurm.bootstrap import pgwrap
    from scout_slurm.task import progress

    torch.set_num_threads(1)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    pg = dist.distributed_c10d._get_default_group()
    d = Path(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    progress.create(d / "rank-0.bin")
    w = progress.ProgressWriter(d / "rank-0.bin", rank=0, world_size=1)
    group = pgwrap.RecordingGroup(pg, lambda: w, lambda: False)
    out = {}
    for kb in kbs:
        t = torch.ones(kb * 256)

        def bare():
            pg.allreduce([t]).wait()

        # scout's comm hook as it was (bootstrap/patches.py, scout_default_hook), one bucket
        def before():
            t.mul_(1.0 / 1)
            seq = w.enter(
                "ddp_bucket_all_reduce",
                t.numel() * t.element_size(),
                1,
                pg._get_sequence_number_for_group(),
            )
            fut = dist.all_reduce(t, group=pg, async_op=True).get_future()

            def done(f):
                w.leave(seq)
                return f.value()[0]

            fut.then(done).wait()

        def now():
            group.allreduce([t]).wait()

        got = _per_call_us(
            {"bare": bare, "before": before, "now": now},
            calls if kb < 1024 else max(BLOCKS, calls // 20),
        )
        out[f"{kb} KB"] = got
    dist.destroy_process_group()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument(
        "--before", default="main", help="the git revision whose progress record is 'before'"
    )
    ap.add_argument("--kb", default="1,4096", help="bucket sizes in KB")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rec = record_only(args.before, args.calls)
    print(
        f"per-collective CPU of scout's recording, thread CPU per call, median of {BLOCKS} "
        "alternating blocks; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"progress record enter+leave: before ({args.before}) {rec['before']:.2f} us, now "
        f"{rec['now']:.2f} us"
    )
    added = []
    for size, got in bucket_paths(args.calls, [int(k) for k in args.kb.split(",")]).items():
        before, now = got["before"] - got["bare"], got["now"] - got["bare"]
        added.append(f"{size}: {before:.0f} -> {now:.0f} us")
        print(
            f"one DDP bucket of {size} on a 1-rank gloo group: bare launch+wait "
            f"{got['bare']:.1f} us; scout's added "
            f"CPU: before (comm hook: scale, record, launch from Python) {before:.1f} us, now "
            f"(recording wrapper) {now:.1f} us"
        )
    print(
        f"SUMMARY\tCPU to record one DDP bucket, before ({args.before}) -> "
        f"now\t{'; '.join(added)}; progress record "
        f"{rec['before']:.2f} -> {rec['now']:.2f} us\tcut"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
