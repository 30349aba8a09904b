"""What scout's bootstrap adds to one collective: a gloo all_reduce on 2 local ranks, called bare
(the wrapper's `__scout_original__`) and wrapped, in the same processes, in alternating blocks so
drift cancels; plus the raw cost of ProgressWriter.enter + leave and of the whole wrapper. Two
controls size the noise: the bare call measured twice, and the bare call after a busy wait as
long as the wrapper's own cost.

    python benchmarks/bench_collective_overhead.py [--small-iters 2000] [--large-iters 100]

Runs itself as 2 ranks (CPU, gloo, one thread each) on 127.0.0.1 and prints a table from rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (("1 KB", 256), ("4 MB", 1 << 20))  # float32 elements
BLOCKS = 10


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed_calls(fn, tensor, n: int) -> list[float]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn(tensor)
        out.append((clock() - t0) / 1000.0)
    return out


def _enter_leave_us(progress_mod, folder: Path, n: int = 200_000) -> tuple[float, float]:
    """Median and minimum of per-call enter+leave over batches of 1000 (a separate record)."""
    path = folder / "bench-writer.bin"
    progress_mod.create(path)
    w = progress_mod.ProgressWriter(path, rank=0, world_size=2)
    per_call = []
    clock = time.perf_counter_ns
    for _ in range(n // 1000):
        t0 = clock()
        for _ in range(1000):
            w.leave(w.enter("all_reduce", 1024, 2, 7))
        per_call.append((clock() - t0) / 1000.0 / 1000.0)
    return statistics.median(per_call), min(per_call)


def _wrapper_alone_us(patches, tensor, n: int = 100_000) -> float:
    """The whole wrapper (sizes, sequence number, enter, leave) around a function that does
    nothing, minus that function called bare: the Python cost scout adds to each call."""

    def nothing(t, group=None, async_op=False):
        return None

    wrapped = patches._wrap_collective("all_reduce", nothing)
    clock = time.perf_counter_ns
    best = {}
    for name, fn in (("bare", nothing), ("wrapped", wrapped)) * 3:
        t0 = clock()
        for _ in range(n):
            fn(tensor)
        best[name] = min(best.get(name, float("inf")), (clock() - t0) / n / 1000.0)
    return best["wrapped"] - best["bare"]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from scout_slurm.bootstrap import patches
    from scout_slurm.task import progress as progress_mod

    torch.set_num_threads(1)
    folder = Path(args.progress_dir)
    handle = patches.install(
        folder
    )  # torch.distributed is imported: patched now, record opened at init
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    wrapped = dist.all_reduce
    bare = wrapped.__scout_original__
    assert patches.STATE.writer is not None, "the progress record was not opened"
    # A control: the bare call after a busy wait as long as the wrapper's own Python cost, to tell
    # the wrapper's work from what any few microseconds more per call cost on this machine.
    wrapper_alone = _wrapper_alone_us(patches, torch.ones(256))
    spin_ns = int(wrapper_alone * 1000)

    def control(t):
        end = time.perf_counter_ns() + spin_ns
        while time.perf_counter_ns() < end:
            pass
        return bare(t)

    # "again": the bare function once more as a variant of its own, the noise floor of the
    # comparison
    variants = (
        ("bare", bare),
        ("wrapped", wrapped),
        ("again", lambda t: bare(t)),
        ("control", control),
    )
    recorded_before = progress_mod.read(folder / f"rank-{rank}.bin").coll_entered
    results = []
    for label, numel in SIZES:
        iters = args.small_iters if numel < 4096 else args.large_iters
        tensor = torch.ones(numel, dtype=torch.float32)
        for _, fn in variants:
            _timed_calls(fn, tensor, max(10, iters // 10))
        per_block = max(1, iters // BLOCKS)
        times: dict[str, list[float]] = {name: [] for name, _ in variants}
        for block in range(BLOCKS):
            for name, fn in variants if block % 2 == 0 else variants[::-1]:
                times[name].extend(_timed_calls(fn, tensor, per_block))
        results.append(
            {
                "size": label,
                "bytes": numel * 4,
                "iters": per_block * BLOCKS,
                **{f"{name}_us": statistics.median(ts) for name, ts in times.items()},
                **{f"{name}_min_us": min(ts) for name, ts in times.items()},
            }
        )
    view = progress_mod.read(folder / f"rank-{rank}.bin")
    dist.barrier()
    enter_leave = _enter_leave_us(progress_mod, folder / f"w{rank}") if rank == 0 else None
    dist.barrier()
    dist.destroy_process_group()
    handle.remove()
    if rank == 0:
        print(
            json.dumps(
                {
                    "results": results,
                    "enter_leave_us": enter_leave,
                    "wrapper_alone_us": wrapper_alone,
                    "recorded": view.coll_entered - recorded_before,
                }
            )
        )


def launch(args: argparse.Namespace) -> int:
    load_at_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="scout-bench-", dir=args.record_dir) as tmp:
        port = _free_port()
        (Path(tmp) / "w0").mkdir()
        env = {
            k: v for k, v in os.environ.items() if not k.startswith("SCOUT_") and k != "PYTHONPATH"
        }
        env.update(
            OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2"
        )
        argv = [
            sys.executable,
            __file__,
            "--worker",
            "--progress-dir",
            tmp,
            "--small-iters",
            str(args.small_iters),
            "--large-iters",
            str(args.large_iters),
        ]
        procs = [
            subprocess.Popen(argv, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
            for r in range(2)
        ]
        try:
            outs = [p.communicate(timeout=args.timeout)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(p.returncode != 0 for p in procs):
            print(f"a rank failed: exit codes {[p.returncode for p in procs]}", file=sys.stderr)
            return 1
    report = json.loads(outs[0].strip().splitlines()[-1])
    print(
        f"gloo all_reduce, 2 ranks on 127.0.0.1, 1 thread each, {os.cpu_count()} CPUs, "
        f"load average {load_at_start:.1f} at start, {os.getloadavg()[0]:.1f} at end; medians "
        "of per-call "
        f"times, the variants interleaved in {BLOCKS} blocks"
    )
    print(
        f"{'size':>6} {'calls':>6} {'bare us/call':>13} {'wrapped us/call':>16} {'ratio':>6} "
        f"{'diff us':>8} "
        f"{'bare again':>11} {'control':>8} {'bare min':>9} {'wrapped min':>12}"
    )
    for r in report["results"]:
        print(
            f"{r['size']:>6} {r['iters']:>6} {r['bare_us']:>13.1f} {r['wrapped_us']:>16.1f} "
            f"{r['wrapped_us'] / r['bare_us']:>6.3f} {r['wrapped_us'] - r['bare_us']:>8.1f} "
            f"{r['again_us']:>11.1f} {r['control_us']:>8.1f} {r['bare_min_us']:>9.1f} "
            f"{r['wrapped_min_us']:>12.1f}"
        )
    print(
        "bare again: the bare call measured once more as its own variant (how far two "
        "identical columns differ: "
        "the noise floor); control: the bare call after a busy wait as long as the wrapper's "
        "own cost (below)"
    )
    med, best = report["enter_leave_us"]
    print(
        f"ProgressWriter.enter+leave: {med:.2f} us per pair (median of 1000-call batches), "
        f"best batch {best:.2f} us"
    )
    print(
        f"whole wrapper around a no-op (sizes, pg sequence number, enter, leave): "
        f"{report['wrapper_alone_us']:.2f} us per call (best of 3 x 100k)"
    )
    print(f"wrapped calls recorded in rank 0's progress record: {report['recorded']}")
    for r in report["results"]:  # one line each for run_all.sh's table
        print(
            f"SUMMARY\tbootstrap per collective, {r['size']} gloo all_reduce\tratio "
            f"{r['wrapped_us'] / r['bare_us']:.3f} "
            f"({r['wrapped_us'] - r['bare_us']:+.1f} us; same call twice: ratio "
            f"{r['again_us'] / r['bare_us']:.3f}); "
            f"wrapper alone {report['wrapper_alone_us']:.1f} us\twithin 2 % on 1 KB"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--small-iters", type=int, default=2000)
    ap.add_argument("--large-iters", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--record-dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where the progress records live (scout-task uses /dev/shm)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--progress-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
