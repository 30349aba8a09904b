"""How the controller's end-of-job reading scales with the world size: synthetic evidence folders
of 1k, 16k and 100k ranks written with the real store (`write_record`, real record types), then
`gather_evidence`, `localise` (pure) and the incident report as the controller writes it (the
suspects' whole records, the bundle, Markdown and HTML) timed separately, each size, scenario and
way of reading in a fresh process so that its memory peak is its own. Two ways of reading: from
the node digests that each node's Epilog writes (written here for every node first, as
`build_node_digest` does on each node, and timed per node), and from every rank's own files (list,
read, parse and validate every file), what the controller does where no digest holds a rank.

    python benchmarks/bench_localiser_scale.py [--sizes 1000,16000,100000] [--dir /tmp] [--keep DIR]
                                               [--tracemalloc] [--profile SIZE] [--baseline DIR]
                                               [--gc-on]

Per rank: ranks/rank-R.json (RankPlace), progress/rank-R.json (ProgressSnapshot with a 16-entry
ring), ranks/exit-R.json (ExitRecord with a 40-line stderr tail, the shim's maximum). Crash: one
rank dies of SIGSEGV, every other rank fails with gloo's "Connection closed by peer". Hang: the same
folder plus progress/stall-decision.json
naming another rank (the localiser reads the decision before the exits, so the files are reused).
Each verdict is checked to name the planted rank and node; a wrong answer stops the run.

Wall and CPU seconds are both printed: on a shared machine the CPU time is the steadier figure.
--keep DIR keeps each size's folder in DIR/ranks-N and reuses it on the next run (writing 100k ranks
with an fsync per file takes minutes). --gc-on measures with the cycle collector left running in the
gather (as before it was paused) and prints its passes per generation and their time.
--baseline DIR measures every row a second time with the `scout_slurm` package found in DIR
(for example `git archive <commit> scout_slurm | tar -x -C DIR`), on the same folders.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CLUSTER = "bench"
JOB_ID = 4242
RESTART = 0
GPUS_PER_NODE = 8
RING = 16
WALL0 = 1_760_000_000.0


def crash_rank(world: int) -> int:
    return (world * 7) // 13  # somewhere in the middle, not a round number


def hang_rank(world: int) -> int:
    return (world * 3) // 11 + 1


def node_of(rank: int) -> str:
    return f"gpu-{rank // GPUS_PER_NODE:05d}"


# --------------------------------------------------------------------------------------------
# Writing the folder
# --------------------------------------------------------------------------------------------


def _ring(end_seq: int, world: int, open_last: bool):
    from scout_slurm.evidence.records import CollectiveEntry

    ops = ("ddp_bucket_all_reduce",) * 6 + ("all_reduce", "broadcast")
    entries = []
    t = 3_600_000_000_000 + end_seq * 40_000_000
    for seq in range(end_seq - RING + 1, end_seq + 1):
        op = ops[seq % len(ops)]
        nbytes = 26_214_400 if op == "ddp_bucket_all_reduce" else 4 if op == "all_reduce" else 1024
        left = 0 if (open_last and seq == end_seq) else t + 3_100_000 + seq % 997
        entries.append(
            CollectiveEntry(
                seq=seq, op=op, nbytes=nbytes, group_size=world, entered_ns=t, left_ns=left
            )
        )
        t += 40_000_000
    return tuple(entries)


def _snapshot(rank: int, world: int, *, crashed: bool):
    from scout_slurm.evidence.records import ChildState, ProgressSnapshot

    done = 81_920  # collectives completed by every rank when rank C crashed
    if crashed:  # died in its own compute, before entering the next collective
        entered, in_coll, op = done, False, "none"
    else:  # the others entered the next one and wait for rank C
        entered, in_coll, op = done + 1, True, "ddp_bucket_all_reduce"
    return ProgressSnapshot(
        rank=rank,
        node=node_of(rank),
        pid=100_000 + rank,
        published_at=WALL0 + 3600.5,
        child_state=ChildState.EXITED,
        coll_entered=entered,
        coll_completed=done,
        in_collective=in_coll,
        current_op=op,
        opt_steps=10_240,
        pg_seq=entered,
        idle_s=0.412,
        step_time_s=0.3125,
        recent=_ring(entered, world, in_coll),
        bootstrap_active=True,
        publish_seq=3601,
        threshold_s=60.0,
    )


def _log(rank: int, n: int) -> list[str]:
    """What a training process prints to stderr while it runs (torch's logger, warnings)."""
    return [
        f"[rank{rank}]:W1130 12:00:{i % 60:02d}.{i:06d} {100_000 + rank} "
        "torch/distributed/c10d/logger.py:100] "
        f"step {10_200 + i} loss 1.{i:04d}"
        for i in range(n)
    ]


# The shim keeps the last 40 lines of a task's stderr: the failure's own lines come last.
STDERR_LINES = 40
SEGV_TAIL = (
    "Fatal Python error: Segmentation fault",
    "",
    "Thread 0x00007f3a5c7fe640 (most recent call first):",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 825 in '
    "_engine_run_backward",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347 in '
    "backward",
    '  File "/home/user/train.py", line 211 in train_step',
)
GLOO_TAIL = (
    "Traceback (most recent call last):",
    '  File "/home/user/train.py", line 260, in <module>',
    "    main()",
    '  File "/home/user/train.py", line 233, in main',
    "    loss = train_step(model, batch)",
    '  File "/home/user/train.py", line 211, in train_step',
    "    loss.backward()",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward',
    "    torch.autograd.backward(",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[10.12.3.17]:52431",
)


def _write_ranks(root: str, world: int, lo: int, hi: int) -> int:
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.records import ExitRecord, RankPlace
    from scout_slurm.evidence.store import write_record

    folder = JobFolder(Path(root), CLUSTER, JOB_ID)
    bad = crash_rank(world)
    for r in range(lo, hi):
        local = r % GPUS_PER_NODE
        write_record(
            folder.rank_place_path(RESTART, r),
            RankPlace(
                job_id=JOB_ID,
                restart=RESTART,
                rank=r,
                local_rank=local,
                world_size=world,
                node=node_of(r),
                hostname=f"{node_of(r)}.hpc.example.org",
                task_pid=90_000 + r,
                child_pid=100_000 + r,
                gpu_uuids=(f"GPU-{r:08x}-5e2c-11ef-9a4b-{r * 2654435761 % (1 << 48):012x}",),
                cuda_visible_devices=",".join(map(str, range(GPUS_PER_NODE))),
                nic=f"mlx5_{local}",
                master_addr="10.12.0.1",
                master_port=29500,
                started_at=WALL0 + (r % 97) / 100,
            ),
        )
        snap = _snapshot(r, world, crashed=r == bad)
        write_record(folder.progress_path(RESTART, r), snap)
        if r == bad:
            exit_rec = ExitRecord(
                rank=r,
                node=node_of(r),
                pid=100_000 + r,
                exit_code=-1,
                signal=11,
                core_dumped=True,
                at=WALL0 + 3600.0,
                killed_by_scout=False,
                last_progress=snap,
                stderr_tail=(*_log(r, STDERR_LINES - len(SEGV_TAIL)), *SEGV_TAIL),
            )
        else:
            exit_rec = ExitRecord(
                rank=r,
                node=node_of(r),
                pid=100_000 + r,
                exit_code=1,
                signal=0,
                core_dumped=False,
                at=WALL0 + 3600.2 + (r % 50) / 1000,
                killed_by_scout=False,
                last_progress=snap,
                stderr_tail=(*_log(r, STDERR_LINES - len(GLOO_TAIL)), *GLOO_TAIL),
            )
        write_record(folder.rank_exit_path(RESTART, r), exit_rec)
    return hi - lo


def write_folder(root: Path, world: int, workers: int) -> float:
    from scout_slurm.evidence.layout import JobFolder

    folder = JobFolder(root, CLUSTER, JOB_ID)
    # results/: where the controller's report goes (the Prolog lays it out on a cluster)
    for d in (
        folder.ranks_dir(RESTART),
        folder.progress_dir(RESTART),
        folder.findings_dir(RESTART),
        folder.results_dir,
    ):
        d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    chunk = 2000
    with ProcessPoolExecutor(max_workers=workers) as pool:
        done = sum(
            pool.map(
                _write_ranks,
                *zip(
                    *[
                        (str(root), world, lo, min(lo + chunk, world))
                        for lo in range(0, world, chunk)
                    ]
                ),
            )
        )
    assert done == world
    return time.perf_counter() - t0


def _digest_nodes(root: str, world: int, nodes: list[str]) -> list[float]:
    """What the shim of each node's local rank 0 writes (its ranks, from SLURM_GTIDS), then what
    each node's Epilog does with it (evidence/digest.py); returns the Epilog's seconds per node."""
    from scout_slurm.evidence.digest import build_node_digest
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.records import NodeTasks
    from scout_slurm.evidence.store import write_record

    folder = JobFolder(Path(root), CLUSTER, JOB_ID)
    seconds = []
    for node in nodes:
        lo = int(node.split("-")[1]) * GPUS_PER_NODE
        write_record(
            folder.node_tasks_path(RESTART, node),
            NodeTasks(JOB_ID, RESTART, node, tuple(range(lo, min(lo + GPUS_PER_NODE, world)))),
        )
        t0 = time.perf_counter()
        digest, note = build_node_digest(folder, RESTART, node, now=time.time())
        if digest is None or len(digest.ranks) != min(GPUS_PER_NODE, world - lo):
            raise SystemExit(f"node {node}: {note}")
        folder.node_dir(node).mkdir(parents=True, exist_ok=True)
        write_record(folder.node_digest_path(RESTART, node), digest)
        seconds.append(time.perf_counter() - t0)
    return seconds


def write_digests(root: Path, world: int, workers: int) -> dict:
    """Every node's digest, as the node Epilogs would write them (here one after the other, on
    `workers` processes; on a cluster each node writes its own, all at once)."""
    from scout_slurm.evidence.layout import JobFolder

    folder = JobFolder(root, CLUSTER, JOB_ID)
    (folder.run_dir(RESTART) / "tasks").mkdir(parents=True, exist_ok=True)
    nodes = sorted({node_of(r) for r in range(world)})
    chunk = 250
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        per_node = [
            t
            for part in pool.map(
                _digest_nodes,
                *zip(
                    *[(str(root), world, nodes[i : i + chunk]) for i in range(0, len(nodes), chunk)]
                ),
            )
            for t in part
        ]
    per_node.sort()
    return {
        "nodes": len(nodes),
        "total_s": time.perf_counter() - t0,
        "median_ms": per_node[len(per_node) // 2] * 1e3,
        "max_ms": per_node[-1] * 1e3,
    }


def add_stall_decision(root: Path, world: int) -> None:
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.records import FindingKind, StallDecision
    from scout_slurm.evidence.store import write_record

    folder = JobFolder(root, CLUSTER, JOB_ID)
    h = hang_rank(world)
    write_record(
        folder.stall_decision_path(RESTART),
        StallDecision(
            decided_by=(h + 1) % world,
            at=WALL0 + 3661.0,
            culprits=(h,),
            kind=FindingKind.HANG,
            reasoning=(
                f"rank {h} on {node_of(h)}: 81919 collectives done, outside any collective, "
                "process running, "
                "idle 61.0 s",
                f"the other {world - 1} rank(s) reached progress 163841 (this rank 163839)",
            ),
        ),
    )


def folder_size(root: Path) -> tuple[int, int, int]:
    """(files, bytes of content, bytes allocated)"""
    files = content = alloc = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            files += 1
            content += st.st_size
            alloc += st.st_blocks * 512
    return files, content, alloc


# --------------------------------------------------------------------------------------------
# Measuring, in a fresh process per size and scenario
# --------------------------------------------------------------------------------------------


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def measure(args: argparse.Namespace) -> None:
    from scout_slurm.evidence.gather import cycle_collector_paused, gather_evidence
    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.evidence.records import VerdictKind
    from scout_slurm.localise.verdict import localise

    folder = JobFolder(Path(args.root), CLUSTER, JOB_ID)
    world = args.world
    rss_before = _maxrss_bytes()
    cpu = time.process_time
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    import gc

    passes: list[tuple[int, float]] = []
    if args.gc_on:
        # the controller pauses the collector around the gather; here it is left running, and its
        # passes are timed
        started: list[float] = []

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                started[:] = [time.perf_counter()]
            elif started:
                passes.append((info["generation"], time.perf_counter() - started[0]))

        gc.callbacks.append(on_gc)
    digests = args.mode == "digests"
    t0, c0 = time.perf_counter(), cpu()
    # as the controller Epilog does (incident/run.py), unless --gc-on asks to see the passes
    with contextlib.nullcontext() if args.gc_on else cycle_collector_paused():
        evidence = gather_evidence(
            folder, RESTART, job_exit_code=256, **({} if digests else {"digests": False})
        )
    t1, c1 = time.perf_counter(), cpu()
    if args.gc_on:
        gc.callbacks.remove(on_gc)  # the gather's passes only
    verdict = localise(evidence, now=WALL0 + 4000)
    t2, c2 = time.perf_counter(), cpu()
    # the controller Epilog then writes the incident report as it does (incident/run.py): the
    # suspects' whole records, the bundle (histories and hardware maps of the rows shown), the
    # Markdown report (a timeline line per rank) and the HTML page
    from scout_slurm.incident.report import write_report as _write_report
    from scout_slurm.remediation.records import ActionsRecord, PlanStatus

    if digests:
        from scout_slurm.evidence.gather import with_full_records

        evidence = with_full_records(evidence, folder, [s.rank for s in verdict.suspects])
    _write_report(
        folder,
        RESTART,
        verdict,
        evidence,
        ActionsRecord(
            job_id=JOB_ID,
            restart=RESTART,
            verdict_kind=verdict.kind,
            status=PlanStatus.OBSERVE_ONLY,
            actions=(),
            held_back=(),
            results=(),
            created_at=WALL0 + 4000,
            updated_at=WALL0 + 4000,
        ),
    )
    report = folder.report_path(RESTART).read_text() + folder.report_html_path(RESTART).read_text()
    t3 = time.perf_counter()
    if profiler is not None:
        profiler.disable()
    rss_after = _maxrss_bytes()

    want = crash_rank(world) if args.scenario == "crash" else hang_rank(world)
    kind = VerdictKind.CRASH if args.scenario == "crash" else VerdictKind.HANG
    named = [(s.rank, s.node) for s in verdict.suspects]
    ok = (
        verdict.kind == kind
        and named == [(want, node_of(want))]
        and not evidence.problems
        and evidence.world_size == world
        and len(evidence.exits) == world
        and len(evidence.places) == world
        and sum(evidence.last_progress(r) is not None for r in range(world)) == world
        and len(evidence.abridged) == (world - len(verdict.suspects) if digests else 0)
    )
    if not ok:
        print(
            json.dumps(
                {
                    "error": f"wrong verdict at {world} ranks, {args.scenario}: "
                    f"{verdict.kind.value} "
                    f"naming {named}, expected {kind.value} naming {[(want, node_of(want))]}; "
                    f"problems {list(evidence.problems[:3])}"
                }
            )
        )
        sys.exit(1)
    import scout_slurm

    out = {
        "gc_passes": [sum(1 for g, _ in passes if g == k) for k in range(3)],
        "gc_s": [round(sum(s for g, s in passes if g == k), 3) for k in range(3)],
        "gather_s": t1 - t0,
        "localise_s": t2 - t1,
        "report_s": t3 - t2,
        "report_bytes": len(report),
        "gather_cpu": c1 - c0,
        "localise_cpu": c2 - c1,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "package": os.path.dirname(scout_slurm.__file__),
    }
    if args.tracemalloc:
        import gc
        import tracemalloc

        del evidence, verdict
        gc.collect()
        tracemalloc.start()
        with cycle_collector_paused():
            evidence = gather_evidence(
                folder, RESTART, job_exit_code=256, **({} if digests else {"digests": False})
            )
        localise(evidence, now=WALL0 + 4000)
        out["traced_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    if profiler is not None:
        import io
        import pstats

        s = io.StringIO()
        pstats.Stats(profiler, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    print(json.dumps(out))


def run_child(
    root: Path,
    world: int,
    scenario: str,
    args: argparse.Namespace,
    profile: bool,
    package_dir: str | None = None,
    mode: str = "digests",
) -> dict:
    argv = (
        [
            sys.executable,
            __file__,
            "--measure",
            "--root",
            str(root),
            "--world",
            str(world),
            "--scenario",
            scenario,
            "--mode",
            mode,
        ]
        + (["--tracemalloc"] if args.tracemalloc else [])
        + (["--gc-on"] if args.gc_on else [])
        + (["--profile-child"] if profile else [])
    )
    env = dict(os.environ)
    if package_dir:
        env["PYTHONPATH"] = os.pathsep.join(
            [package_dir] + [p for p in [env.get("PYTHONPATH")] if p]
        )
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout, env=env)
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": proc.stderr[-2000:]}
    if proc.returncode != 0 or "error" in result:
        raise SystemExit(
            f"measuring {world} ranks ({scenario}) failed: "
            f"{result.get('error') or proc.stderr[-2000:]}"
        )
    if package_dir and not result["package"].startswith(os.path.abspath(package_dir)):
        raise SystemExit(
            f"--baseline {package_dir}: the child imported scout_slurm from {result['package']}"
        )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1000,16000,100000", help="world sizes, comma-separated")
    ap.add_argument(
        "--dir", default=None, help="where the folders are built (default: the system temp dir)"
    )
    ap.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes writing the folder"
    )
    ap.add_argument(
        "--tracemalloc",
        action="store_true",
        help="also gather+localise once more under tracemalloc (Python heap peak; slower, not "
        "timed)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="SIZE",
        help="print a cProfile of this size's runs",
    )
    ap.add_argument(
        "--baseline",
        metavar="DIR",
        help="also measure each row with the scout_slurm package in DIR (e.g. an older commit)",
    )
    ap.add_argument(
        "--keep",
        metavar="DIR",
        help="keep each size's folder in DIR/ranks-N and reuse it when there",
    )
    ap.add_argument(
        "--gc-on",
        dest="gc_on",
        action="store_true",
        help="leave the cycle collector running in the gather; print its passes",
    )
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--profile-child", dest="profile_child", action="store_true", help=argparse.SUPPRESS
    )
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--scenario", choices=("crash", "hang"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--mode", choices=("files", "digests"), default="digests", help=argparse.SUPPRESS
    )
    args = ap.parse_args()
    if args.measure:
        args.profile = args.profile_child
        measure(args)
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    load0 = os.getloadavg()[0]
    rows, profiles, digest_rows = [], [], []
    for world in sizes:
        if args.keep:
            tmp = Path(args.keep) / f"ranks-{world}"
            done_mark = tmp / "complete"
            if done_mark.exists():
                write_s = float(done_mark.read_text())
            else:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                write_s = write_folder(tmp, world, args.workers)
                done_mark.write_text(f"{write_s}\n")
            # the crash rows are measured without the hang's decision
            from scout_slurm.evidence.layout import JobFolder

            JobFolder(tmp, CLUSTER, JOB_ID).stall_decision_path(RESTART).unlink(missing_ok=True)
            digest_mark = tmp / "digests-complete"
            if digest_mark.exists():
                digest_info = json.loads(digest_mark.read_text())
            else:
                digest_info = write_digests(tmp, world, args.workers)
                digest_mark.write_text(json.dumps(digest_info))
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f"scout-scale-{world}-", dir=args.dir))
            write_s = write_folder(tmp, world, args.workers)
            digest_info = write_digests(tmp, world, args.workers)
        digest_rows.append(dict(digest_info, world=world))
        try:
            for scenario in ("crash", "hang"):
                if scenario == "hang":
                    add_stall_decision(tmp, world)
                files, content, alloc = folder_size(tmp / CLUSTER / str(JOB_ID))
                runs = [("digests", "now", None), ("files", "now", None)] + (
                    [("files", "baseline", args.baseline)] if args.baseline else []
                )
                for mode, label, package in runs:
                    r = run_child(
                        tmp,
                        world,
                        scenario,
                        args,
                        profile=args.profile == world,
                        package_dir=package,
                        mode=mode,
                    )
                    if "profile" in r:
                        profiles.append((world, f"{scenario}, {label}, {mode}", r.pop("profile")))
                    rows.append(
                        dict(
                            r,
                            world=world,
                            scenario=scenario,
                            files=files,
                            content=content,
                            alloc=alloc,
                            write_s=write_s,
                            label=label,
                            mode=mode,
                        )
                    )
                    print(
                        f"  {world} ranks {scenario} ({label}, {mode}): gather "
                        f"{r['gather_s']:.2f} s, "
                        f"localise {r['localise_s']:.3f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)

    where = args.keep or args.dir or tempfile.gettempdir()
    fs = subprocess.run(
        ["df", "--output=fstype", where], capture_output=True, text=True
    ).stdout.split()[-1:]
    print(
        f"gather_evidence + localise, one fresh process per row; {os.cpu_count()} CPUs, folders on "
        f"{where} ({fs[0] if fs else '?'}, "
        f"{'kept from an earlier run' if args.keep else 'written just before'}: "
        "warm page cache), "
        f"load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    )
    hdr = (
        f"{'ranks':>7} {'scenario':>8} {'files':>7} {'MB data':>8} {'MB alloc':>8} {'write s':>8} "
        f"{'gather s':>9} {'(CPU s)':>8} {'localise s':>10} {'(CPU s)':>8} {'report s':>8} "
        f"{'total s':>8} "
        f"{'peak MB':>8} {'MB/1k ranks':>11} {'reads':>8}"
    )
    if args.baseline:
        hdr += f" {'package':>9}"
    if args.tracemalloc:
        hdr += f" {'traced MB':>9}"
    if args.gc_on:
        hdr += f" {'gc passes 0/1/2':>16} {'gc s 0/1/2':>18}"
    print(hdr)
    for r in rows:
        peak = (r["rss_after"] - r["rss_before"]) / 1e6
        line = (
            f"{r['world']:>7} {r['scenario']:>8} {r['files']:>7} {r['content'] / 1e6:>8.1f} "
            f"{r['alloc'] / 1e6:>8.1f} {r['write_s']:>8.1f} {r['gather_s']:>9.2f} "
            f"{r['gather_cpu']:>8.2f} "
            f"{r['localise_s']:>10.3f} {r['localise_cpu']:>8.3f} {r['report_s']:>8.2f} "
            f"{r['gather_s'] + r['localise_s'] + r['report_s']:>8.2f} {peak:>8.1f} "
            f"{peak / (r['world'] / 1000):>11.2f} "
            f"{r['mode']:>8}"
        )
        if args.baseline:
            line += f" {r['label']:>9}"
        if args.tracemalloc:
            line += f" {r['traced_peak'] / 1e6:>9.1f}"
        if args.gc_on:
            line += (
                f" {'/'.join(map(str, r['gc_passes'])):>16} "
                f"{'/'.join(f'{x:.2f}' for x in r['gc_s']):>18}"
            )
        print(line)
    print(
        "MB data: bytes in the files; MB alloc: blocks the file system gave them. peak MB: "
        "growth of the process's "
        "max RSS during gather+localise over its RSS after imports. write s: building the "
        "folder with write_record "
        "(fsync per file), once per size, shared by its rows. reads: digests = one node "
        "digest a node (written "
        "by the node Epilogs, evidence/digest.py) and the suspects' whole records for the "
        "report; files = every "
        "rank's own files (no digest: the controller's way when the node Epilogs wrote none). "
        "Every verdict named "
        "the planted rank and node, with no reading problems."
    )
    print(
        f"\nnode Epilog's digest of its {GPUS_PER_NODE} ranks (read tasks file and 2 records "
        "a rank, write one "
        "file with fsync); the nodes do this in parallel, before the controller reads:"
    )
    print(f"{'ranks':>7} {'nodes':>6} {'median ms':>10} {'max ms':>8} {'all nodes here s':>17}")
    for d in digest_rows:
        print(
            f"{d['world']:>7} {d['nodes']:>6} {d['median_ms']:>10.1f} {d['max_ms']:>8.1f} "
            f"{d['total_s']:>17.1f}"
        )
    for r in rows:
        if r["label"] == "now" and r["world"] == max(sizes):
            peak = (r["rss_after"] - r["rss_before"]) / 1e6
            print(
                f"SUMMARY\tcontroller end-of-job work, {r['world']} ranks ({r['scenario']}, "
                f"{r['mode']})\t"
                f"gather {r['gather_s']:.1f} s + localise {r['localise_s']:.2f} s + report "
                f"{r['report_s']:.2f} s "
                f"= {r['gather_s'] + r['localise_s'] + r['report_s']:.1f} s; {peak / 1e3:.2f} "
                "GB peak "
                f"({peak / (r['world'] / 1000):.1f} MB per 1k ranks)\tunder 10 s, memory linear"
            )
    for d in digest_rows:
        if d["world"] == max(sizes):
            print(
                f"SUMMARY\tnode Epilog digest, {d['world']} ranks ({GPUS_PER_NODE} a node)\t"
                f"median {d['median_ms']:.1f} ms, max {d['max_ms']:.1f} ms a node\tbefore the "
                "controller reads"
            )
    for world, scenario, text in profiles:
        print(f"\ncProfile, {world} ranks, {scenario} (gather + localise, by own time):\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
