"""How much evidence scout writes and keeps: the real records serialised by the real store
(`record_to_bytes`), with realistic contents, times how often the code writes each of them.

    python benchmarks/bench_evidence_volume.py [--gpus 10000] [--busy 0.9] [--jobs-per-day 300]
                                               [--ranks-per-job 256] [--incidents-per-day 10]

Written per rank per hour: the watchdog rewrites its rank's progress snapshot atomically
(temporary file, fsync, rename, fsync of the folder) every
WatchdogConfig().steady_publish_interval_s
while the rank advances, and every publish_interval_s only while it is watchful (idle for half its
stall threshold, or not running: task/publishing.py), which a healthy job never is. The bytes
written grow with the hours while the bytes kept stay one snapshot. Kept per
job: what is left in the job's folder after it ends; scout deletes nothing, so this accumulates
until the site prunes the evidence root. The month is computed from the stated assumptions only.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from scout_slurm.config import WatchdogConfig
from scout_slurm.evidence import history
from scout_slurm.evidence.digest import abridge_tail
from scout_slurm.evidence.records import (
    ChildState,
    CollectiveEntry,
    DigestedRank,
    ExitRecord,
    Finding,
    FindingKind,
    NodeDigest,
    NodeTasks,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    VerdictKind,
    VoteCoverage,
)
from scout_slurm.evidence.store import record_to_bytes
from scout_slurm.hooks.nodeevidence import KernelLine, NodeEvidence
from scout_slurm.hwmap.records import (
    Affinity,
    GpuInfo,
    GpuNic,
    HardwareMap,
    IbPort,
    NicInfo,
    NicKind,
)
from scout_slurm.localise.verdict import JobEvidence, localise
from scout_slurm.remediation.records import ActionsRecord, Drain, PlannedAction, PlanStatus, Requeue
from scout_slurm.report.markdown import render_incident_markdown

GPUS_PER_NODE = 8
RING = 16  # entries of the ring a snapshot carries (watchdog: recent[-16:])
STDERR_LINES = 40  # the shim keeps the last 40 lines of the task's stderr
BLOCK = 4096  # ext4/xfs allocation unit: a 400-byte file still takes a block
STACK_DUMP_BYTES = 12_000  # assumed: one rank's all-thread Python stack dump (not a record)
WALL = 1_760_003_612.837_291  # time.time() has this many digits; the records keep them


def node_of(rank: int) -> str:
    return f"gpu-{rank // GPUS_PER_NODE:05d}"


def ring(world: int, end_seq: int) -> tuple[CollectiveEntry, ...]:
    ops = ("ddp_bucket_all_reduce",) * 6 + ("all_reduce", "broadcast")
    out, t = [], 734_512_771_003_117  # CLOCK_MONOTONIC ns after ~8 days of uptime
    for seq in range(end_seq - RING + 1, end_seq + 1):
        op = ops[seq % len(ops)]
        out.append(
            CollectiveEntry(
                seq=seq,
                op=op,
                nbytes=26_214_400 if op.startswith("ddp") else 8,
                group_size=world,
                entered_ns=t,
                left_ns=t + 3_187_455,
            )
        )
        t += 41_377_213
    return tuple(out)


def snapshot(rank: int, world: int) -> ProgressSnapshot:
    return ProgressSnapshot(
        rank=rank,
        node=node_of(rank),
        pid=1_234_567,
        published_at=WALL,
        child_state=ChildState.RUNNING,
        coll_entered=1_638_417,
        coll_completed=1_638_416,
        in_collective=True,
        current_op="ddp_bucket_all_reduce",
        opt_steps=204_802,
        pg_seq=1_638_417,
        idle_s=0.041,
        step_time_s=0.3127,
        recent=ring(world, 1_638_417),
        bootstrap_active=True,
        publish_seq=73_519,
        threshold_s=60.0,
    )


def place(rank: int, world: int) -> RankPlace:
    local = rank % GPUS_PER_NODE
    return RankPlace(
        job_id=48_213_377,
        restart=0,
        rank=rank,
        local_rank=local,
        world_size=world,
        node=node_of(rank),
        hostname=f"{node_of(rank)}.cluster.example.org",
        task_pid=1_234_501,
        child_pid=1_234_567,
        gpu_uuids=("GPU-8d3c6b2e-5f0a-11ef-9a4b-3cecef1a2b3c",),
        cuda_visible_devices="0,1,2,3,4,5,6,7",
        nic=f"mlx5_{local}",
        master_addr="10.12.0.17",
        master_port=29500,
        started_at=WALL,
    )


TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/home/alice/llm/train.py", line 412, in <module>',
    "    main(cfg)",
    '  File "/home/alice/llm/train.py", line 388, in main',
    "    loss = step(model, batch, optimizer, scaler)",
    '  File "/opt/venv/lib/python3.11/site-packages/torch/_tensor.py", line 626, in backward',
    "    torch.autograd.backward(",
]


def exit_record(rank: int, world: int, *, crashed: bool, cascade: bool) -> ExitRecord:
    lines = [
        f"[rank{rank}]:W1130 12:00:{i % 60:02d}.{i:06d} 1234567 "
        "torch/distributed/c10d/logger.py:100] "
        f"step {204_760 + i} loss 1.{i:04d}"
        for i in range(STDERR_LINES)
    ]
    if crashed:
        lines = lines[:-3] + [
            "Fatal Python error: Segmentation fault",
            "",
            "Thread 0x00007f3a5c7fe640 (most recent call first):",
        ]
    elif cascade:
        lines = (
            lines[: -len(TRACEBACK) - 1]
            + TRACEBACK
            + [
                "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                "Connection closed by peer "
                "[10.12.3.17]:52431"
            ]
        )
    return ExitRecord(
        rank=rank,
        node=node_of(rank),
        pid=1_234_567,
        exit_code=-1 if crashed else (1 if cascade else 0),
        signal=11 if crashed else 0,
        core_dumped=crashed,
        at=WALL + 3.25,
        killed_by_scout=False,
        last_progress=snapshot(rank, world),
        stderr_tail=tuple(lines[-STDERR_LINES:]),
    )


def node_tasks(node: int) -> NodeTasks:
    """What the shim of a node's local rank 0 writes: its node's ranks (SLURM_GTIDS)."""
    return NodeTasks(
        job_id=48_213_377,
        restart=0,
        node=f"gpu-{node:05d}",
        ranks=tuple(range(node * GPUS_PER_NODE, (node + 1) * GPUS_PER_NODE)),
    )


def node_digest(node: int, world: int) -> NodeDigest:
    """What the node Epilog writes for the controller (evidence/digest.py): its ranks' place and
    exit
    records, the stderr tail abridged, one ring (seq, op, bytes) shared by the node's ranks."""
    rows, shared = [], ()
    for rank in range(node * GPUS_PER_NODE, (node + 1) * GPUS_PER_NODE):
        e = exit_record(rank, world, crashed=False, cascade=False)
        shared = tuple(
            dataclasses.replace(c, entered_ns=0, left_ns=0) for c in e.last_progress.recent
        )
        e = dataclasses.replace(
            e,
            stderr_tail=abridge_tail(e.stderr_tail),
            last_progress=dataclasses.replace(e.last_progress, recent=()),
        )
        rows.append(
            DigestedRank(rank=rank, place=place(rank, world), exit=e, progress=None, ring=0)
        )
    return NodeDigest(
        job_id=48_213_377,
        restart=0,
        node=f"gpu-{node:05d}",
        rings=(shared,),
        ranks=tuple(rows),
        written_at=WALL,
    )


def hardware_map(node: int) -> HardwareMap:
    name = f"gpu-{node:05d}"
    gpus = tuple(
        GpuInfo(
            index=i,
            uuid=f"GPU-8d3c6b2e-5f0a-11ef-9a4b-3cecef1a2b{i:02x}",
            serial=f"165232300{i:04d}",
            pci_bus_id=f"0000:{0x18 + 0x20 * i:02x}:00.0",
            name="NVIDIA H100 80GB HBM3",
            driver_version="550.90.07",
            cuda_driver_version="12.4",
            ecc_mode="enabled",
            numa_node=i // 4,
        )
        for i in range(GPUS_PER_NODE)
    )
    nics = tuple(
        NicInfo(
            name=f"ibp{0x1A + 0x20 * i}s0",
            mac=f"00:00:10:29:fe:80:00:{i:02x}",
            pci_address=f"0000:{0x1A + 0x20 * i:02x}:00.0",
            numa_node=i // 4,
            speed_mbps=400_000,
            operstate="up",
            kind=NicKind.INFINIBAND,
        )
        for i in range(GPUS_PER_NODE)
    ) + (
        NicInfo(
            name="eno1",
            mac="3c:ec:ef:1a:2b:3c",
            pci_address="0000:c1:00.0",
            numa_node=1,
            speed_mbps=25_000,
            operstate="up",
            kind=NicKind.ETHERNET,
        ),
        NicInfo(
            name="lo",
            mac="00:00:00:00:00:00",
            pci_address="",
            numa_node=-1,
            speed_mbps=-1,
            operstate="unknown",
            kind=NicKind.LOOPBACK,
        ),
    )
    ports = tuple(
        IbPort(
            hca=f"mlx5_{i}",
            port=1,
            guid=f"0x946dae0300a1b2{i:02x}",
            state="4: ACTIVE",
            rate="400 Gb/sec (4X NDR)",
            link_layer="InfiniBand",
        )
        for i in range(GPUS_PER_NODE)
    )
    affinity = tuple(
        GpuNic(gpu_uuid=g.uuid, nic=nics[i].name, how=Affinity.SAME_PCI_SWITCH)
        for i, g in enumerate(gpus)
    )
    return HardwareMap(
        node=name,
        hostname=f"{name}.cluster.example.org",
        boot_id="4f2c0e55-8a1b-4c7d-9e3f-0a1b2c3d4e5f",
        kernel="5.15.0-119-generic",
        cpu_model="Intel(R) Xeon(R) Platinum 8480+",
        cpu_sockets=2,
        memory_bytes=2_164_194_631_680,
        gpus=gpus,
        nics=nics,
        ib_ports=ports,
        gpu_nic_affinity=affinity,
        nvml_status="ok",
        problems=(),
        collected_at=WALL,
        duration_s=0.412,
    )


def node_evidence(node: int, *, xid: bool) -> NodeEvidence:
    lines = (
        (
            KernelLine(
                seconds_since_boot=734_512.771,
                category="xid",
                text="NVRM: Xid (PCI:0000:38:00): 79, pid=1234567, GPU has fallen off the bus.",
            ),
        )
        if xid
        else ()
    )
    return NodeEvidence(
        node=f"gpu-{node:05d}",
        job_id=48_213_377,
        kernel_lines=lines,
        gpu_errors=(),
        leftover=(),
        hardware_error=xid,
        collected_at=WALL,
        problems=(),
    )


def clean_verdict_bytes(world: int) -> int:
    ev = JobEvidence(
        job_id=48_213_377,
        restart=0,
        world_size=world,
        places={r: place(r, world) for r in range(world)},
        exits={r: exit_record(r, world, crashed=False, cascade=False) for r in range(world)},
        snapshots={r: snapshot(r, world) for r in range(world)},
        job_exit_code=0,
        # a clean verdict lists the checks that ran; without any it is `unchecked`
        coverage=VoteCoverage(
            restart=0,
            votes=2,
            last_clean_step=40,
            last_vote_step=40,
            replay_rounds=2,
            timing_rounds=1,
            votes_every=20,
            replay_every=20,
            timing_every=25,
            steps=40,
            final_vote="not needed",
        ),
    )
    verdict = localise(ev, now=WALL + 30)
    assert verdict.kind == VerdictKind.CLEAN, verdict
    return len(record_to_bytes(verdict))


def crash_outputs(world: int) -> tuple[int, int, int]:
    """(verdict bytes, actions bytes, report bytes) of a crash at this world size, from the real
    localiser and report: the verdict lists the cascading ranks and the report has a line a rank."""
    bad = world // 3
    snaps = {r: snapshot(r, world) for r in range(world)}
    exits = {r: exit_record(r, world, crashed=r == bad, cascade=r != bad) for r in range(world)}
    ev = JobEvidence(
        job_id=48_213_377,
        restart=0,
        world_size=world,
        places={r: place(r, world) for r in range(world)},
        exits=exits,
        snapshots=snaps,
        job_exit_code=256,
    )
    verdict = localise(ev, now=WALL + 30)
    assert verdict.kind == VerdictKind.CRASH and [s.rank for s in verdict.suspects] == [bad], (
        verdict
    )
    node = node_of(bad)
    actions = ActionsRecord(
        job_id=48_213_377,
        restart=0,
        verdict_kind=verdict.kind,
        status=PlanStatus.PLANNED,
        actions=(
            PlannedAction.of(
                Drain(
                    node,
                    f"scout: crash rank {bad} job 48213377 run 0 "
                    "conf 0.95 see /var/lib/scout/evidence/c1/48213377",
                )
            ),
            PlannedAction.of(Requeue(48_213_377)),
        ),
        held_back=(),
        results=(),
        created_at=WALL + 31,
        updated_at=WALL + 31,
    )
    report = render_incident_markdown(verdict, ev, actions).encode()
    return len(record_to_bytes(verdict)), len(record_to_bytes(actions)), len(report)


def blocks(nbytes: int) -> int:
    return max(1, math.ceil(nbytes / BLOCK)) * BLOCK


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1000
    return f"{n:.1f} PB"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--gpus", type=int, default=10_000, help="GPUs of the cluster, one rank each")
    ap.add_argument(
        "--busy", type=float, default=0.9, help="share of the GPUs running scout jobs at any time"
    )
    ap.add_argument("--jobs-per-day", type=int, default=300)
    ap.add_argument("--ranks-per-job", type=int, default=256, help="mean world size of a job")
    ap.add_argument(
        "--incidents-per-day",
        type=float,
        default=10.0,
        help="runs that fail (crash, hang, ...): each is localised, reported and requeued once",
    )
    ap.add_argument(
        "--stall-share",
        type=float,
        default=0.3,
        help="share of incidents that are stalls (stack dumps of every rank, findings)",
    )
    ap.add_argument("--days", type=int, default=30)
    args = ap.parse_args()

    fast_s = WatchdogConfig().publish_interval_s  # only while a rank is watchful
    publish_s = WatchdogConfig().steady_publish_interval_s  # a healthy job's rate
    world = args.ranks_per_job
    size = {
        "RankPlace": len(record_to_bytes(place(7, world))),
        "ProgressSnapshot": len(record_to_bytes(snapshot(7, world))),
        "ExitRecord (clean)": len(
            record_to_bytes(exit_record(7, world, crashed=False, cascade=False))
        ),
        "ExitRecord (cascade)": len(
            record_to_bytes(exit_record(7, world, crashed=False, cascade=True))
        ),
        "HardwareMap (8 GPUs)": len(record_to_bytes(hardware_map(3))),
        "NodeEvidence (clean)": len(record_to_bytes(node_evidence(3, xid=False))),
        "NodeTasks (8 ranks)": len(record_to_bytes(node_tasks(3))),
        "NodeDigest (8 ranks)": len(record_to_bytes(node_digest(3, world))),
        "Finding": len(
            record_to_bytes(
                Finding(
                    rank=7,
                    node=node_of(7),
                    kind=FindingKind.STALL_SUSPECT,
                    at=WALL,
                    summary="rank 7 made no progress for 61.3 s (threshold 60.0 s)",
                    details=("process state: running",),
                    step=204_802,
                )
            )
        ),
        "StallDecision": len(
            record_to_bytes(
                StallDecision(
                    decided_by=3,
                    at=WALL,
                    culprits=(7,),
                    kind=FindingKind.HANG,
                    reasoning=(
                        f"rank 7 on {node_of(7)}: 1638416 collectives done, outside any "
                        "collective, process "
                        "running, idle 61.3 s",
                        f"the other {world - 1} rank(s) reached progress 3276833",
                    ),
                )
            )
        ),
    }
    verdict_b, actions_b, report_b = crash_outputs(world)
    verdict_big, _, report_big = crash_outputs(min(args.gpus, 10_000))
    clean_verdict = clean_verdict_bytes(world)

    print(
        f"Record sizes (record_to_bytes, realistic contents, a {world}-rank job, "
        f"{STDERR_LINES}-line stderr tail, "
        f"{RING}-entry ring):"
    )
    print(f"  {'record':<28} {'bytes':>8} {'on disk':>8}  written")
    when = {
        "RankPlace": "twice per rank at start (before and after the child starts)",
        "ProgressSnapshot": f"per rank every {publish_s:g} s while it advances ({fast_s:g} s while "
        "watchful), rewritten in place (atomic rename)",
        "ExitRecord (clean)": "once per rank at exit",
        "ExitRecord (cascade)": "once per rank at exit (a peer failed)",
        "HardwareMap (8 GPUs)": "per node at job start (Prolog)",
        "NodeEvidence (clean)": "per node at job end (Epilog)",
        "NodeTasks (8 ranks)": "per node at start, by its local rank 0 (its ranks, for its Epilog)",
        "NodeDigest (8 ranks)": "per node at job end (Epilog): its ranks abridged, for the "
        "controller",
        "Finding": "per stalled rank, on a stall",
        "StallDecision": "once per stalled run",
    }
    for name, n in size.items():
        print(f"  {name:<28} {n:>8} {blocks(n):>8}  {when[name]}")
    print(
        f"  {'verdict (clean)':<28} {clean_verdict:>8} {blocks(clean_verdict):>8}  per run at "
        "job end"
    )
    print(
        f"  {'verdict (crash)':<28} {verdict_b:>8} {blocks(verdict_b):>8}  per run at job "
        "end; lists every "
        f"cascading rank: {human(verdict_big)} at {min(args.gpus, 10_000)} ranks"
    )
    print(f"  {'actions':<28} {actions_b:>8} {blocks(actions_b):>8}  per failed run")
    print(
        f"  {'report-N.md':<28} {report_b:>8} {blocks(report_b):>8}  per failed run; a line a "
        "rank: "
        f"{human(report_big)} at {min(args.gpus, 10_000)} ranks"
    )
    print(
        f"  {'stacks/rank-N.txt':<28} {STACK_DUMP_BYTES:>8} {blocks(STACK_DUMP_BYTES):>8}  "
        "per rank on a stall "
        "(assumed size: a Python all-thread dump, not a record)"
    )

    snap = size["ProgressSnapshot"]
    per_hour = 3600 / publish_s * snap
    print()
    print(
        f"Per rank per hour of healthy training (publish interval {publish_s:g} s; {fast_s:g} "
        "s before, and now "
        "only while watchful):"
    )
    print(
        f"  written:  {3600 / publish_s:.0f} snapshots x {snap} B = {human(per_hour)}/h "
        f"({human(per_hour / 3600)}/s), each as create + write + fsync + rename + fsync of "
        "the folder: "
        f"{3600 / publish_s:.0f} files created and {2 * 3600 / publish_s:.0f} fsyncs an hour "
        f"(every {fast_s:g} s: {human(3600 / fast_s * snap)}/h, {2 * 3600 / fast_s:.0f} fsyncs)"
    )
    # the progress history for the report's timeline: one fixed-size sample every (fast) publish
    # interval, whatever the snapshots' rate, into a ring file of fixed size, pwrite without fsync
    # (evidence/history.py)
    sample_s = WatchdogConfig().publish_interval_s
    slot = len(history.encode_slot(history.sample_of(snapshot(7, world), 1)))
    ring = len(history.encode_header()) + history.SLOTS * slot
    print(
        f"  history:  {3600 / sample_s:.0f} samples x {slot} B = "
        f"{human(3600 / sample_s * slot)}/h into one ring "
        f"file of {ring} B ({history.SLOTS} samples: {history.SLOTS * sample_s / 60:.1f} "
        "min), no fsync"
    )
    per_rank_kept = size["RankPlace"] + snap + size["ExitRecord (clean)"] + ring
    per_rank_blocks = (
        blocks(size["RankPlace"]) + blocks(snap) + blocks(size["ExitRecord (clean)"]) + blocks(ring)
    )
    print(
        f"  kept:     {per_rank_kept} B in 4 files ({per_rank_blocks // 1024} KiB in "
        f"{BLOCK // 1024} KiB blocks), "
        "whatever the run's length"
    )

    nodes = math.ceil(world / GPUS_PER_NODE)
    node_files = (
        "HardwareMap (8 GPUs)",
        "NodeEvidence (clean)",
        "NodeTasks (8 ranks)",
        "NodeDigest (8 ranks)",
    )
    node_kept = sum(size[k] for k in node_files)
    node_blocks = sum(blocks(size[k]) for k in node_files)
    clean_job = world * per_rank_kept + nodes * node_kept + clean_verdict
    clean_job_blocks = world * per_rank_blocks + nodes * node_blocks + blocks(clean_verdict)
    clean_job_files = 4 * world + len(node_files) * nodes + 1
    incident_extra = verdict_b - clean_verdict + actions_b + report_b
    incident_extra_blocks = blocks(actions_b) + blocks(report_b)
    stall_extra = world * STACK_DUMP_BYTES + size["StallDecision"] + size["Finding"] * world
    stall_extra_blocks = (
        world * blocks(STACK_DUMP_BYTES)
        + blocks(size["StallDecision"])
        + world * blocks(size["Finding"])
    )
    print()
    print(f"Kept per job of {world} ranks on {nodes} nodes, after it ends:")
    print(
        f"  clean run:         {human(clean_job)} in {clean_job_files} files "
        f"({human(clean_job_blocks)} allocated)"
    )
    print(
        f"  failed run, extra: {human(incident_extra)} (verdict naming the cascade, actions, "
        "report)"
    )
    print(
        f"  stall, extra:      {human(stall_extra)} in {2 * world + 1} files "
        f"({human(stall_extra_blocks)} allocated): "
        "every rank's stack dump and stall finding"
    )

    ranks_running = args.gpus * args.busy
    days = args.days
    written = ranks_running * per_hour * 24 * days
    jobs = args.jobs_per_day * days
    incidents = args.incidents_per_day * days
    runs = jobs + incidents  # each incident is requeued once: a new run-N folder
    kept_all = (
        runs * clean_job + incidents * incident_extra + incidents * args.stall_share * stall_extra
    )
    kept_all_blocks = (
        runs * clean_job_blocks
        + incidents * incident_extra_blocks
        + incidents * args.stall_share * stall_extra_blocks
    )
    files_all = (
        runs * clean_job_files + incidents * 2 + incidents * args.stall_share * (2 * world + 1)
    )
    kept_incidents = incidents * (clean_job + incident_extra + args.stall_share * stall_extra)
    kept_incidents_blocks = incidents * (
        clean_job_blocks + incident_extra_blocks + args.stall_share * stall_extra_blocks
    )
    print()
    print(f"A month on a {args.gpus}-GPU cluster. Assumptions:")
    rows = [
        ("GPUs (one rank each), 8 a node", f"{args.gpus}"),
        (
            "share busy with scout jobs",
            f"{args.busy:.0%} ({ranks_running:.0f} ranks publishing at any time)",
        ),
        ("jobs a day, mean ranks a job", f"{args.jobs_per_day}, {world}"),
        ("incidents a day (failed runs, each requeued once)", f"{args.incidents_per_day:g}"),
        ("share of incidents that are stalls (stack dumps)", f"{args.stall_share:.0%}"),
        ("days", f"{days}"),
        ("retention", "none: scout deletes nothing"),
    ]
    for k, v in rows:
        print(f"  {k:<52} {v}")
    print()
    print(f"  {'':<44} {'bytes':>10} {'allocated':>10} {'files':>12}")
    print(
        f"  {'written by progress snapshots':<44} {human(written):>10} {'':>10} "
        f"{ranks_running * 3600 / publish_s * 24 * days:>12.3g}"
        f"   ({human(ranks_running * snap / publish_s)}/s, "
        f"{2 * ranks_running / publish_s:.0f} fsyncs/s "
        f"[{2 * ranks_running / fast_s:.0f} when every {fast_s:g} s] on the "
        "evidence file system)"
    )
    print(
        f"  {'kept: incidents only':<44} {human(kept_incidents):>10} "
        f"{human(kept_incidents_blocks):>10} "
        f"{incidents * (clean_job_files + 2 + args.stall_share * (2 * world + 1)):>12.3g}"
    )
    print(
        f"  {'kept: every job (no retention)':<44} {human(kept_all):>10} "
        f"{human(kept_all_blocks):>10} {files_all:>12.3g}"
    )
    print()
    print(
        f"SUMMARY\tevidence written per rank per hour\t{human(per_hour)} "
        f"({3600 / publish_s:.0f} snapshots; "
        f"{human(3600 / fast_s * snap)} when every {fast_s:g} s); kept per rank "
        f"{human(per_rank_kept)}\t"
    )
    print(
        f"SUMMARY\ta month, {args.gpus} GPUs, {args.jobs_per_day} jobs/day, "
        f"{args.incidents_per_day:g} incidents/day\t"
        f"kept: {human(kept_incidents)} for incidents, {human(kept_all)} for every job; "
        f"written: {human(written)}, "
        f"{2 * ranks_running / publish_s:.0f} fsyncs/s (was "
        f"{2 * ranks_running / fast_s:.0f})\tordinary storage"
    )
    print(
        "Allocated: every file rounded up to a 4 KiB block (ext4, xfs). Files matter as much "
        "as bytes on a shared "
        "file system: each is an inode and a metadata operation."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
