"""Issue: name the rank that hung, stalled or crashed first, on the real lab cluster.

Each fault is injected into one chosen rank of a 2-node, 4-rank DDP job under scout-srun; the
verdict must name exactly that rank, its node and the right kind. Clean runs name nobody.
Latencies (fault to stall decision, fault to verdict) are printed for the closing note.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import pytest
import scoutjobs as sj

from scout_slurm.evidence.gather import gather_evidence
from scout_slurm.localise.verdict import localise
from scout_slurm.remediation.records import PlanStatus
from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
STALL_FLOOR = 4.0

CASES = [
    # id, inject spec (None: SIGSTOP from outside), rank, expected kind
    ("sleep-before-collective", "sleep,rank=1,step=5", 1, "hang"),
    ("sleep-rank0", "sleep,rank=0,step=5", 0, "hang"),
    ("sigstop-from-outside", None, 2, "hang"),
    ("endless-compute-loop", "spin,rank=3,step=5", 3, "hang"),
    ("skip-one-allreduce", "skip_allreduce,rank=3,step=5", 3, "hang"),
    ("sys-exit-3", "exit,rank=1,step=5", 1, "crash"),
    ("sigkill-last-rank", "sigkill,rank=3,step=5", 3, "crash"),
    ("segfault", "segv,rank=2,step=5", 2, "crash"),
    ("sigkill-rank0", "sigkill,rank=0,step=5", 0, "crash"),
]


def _run_fault(lab, inject, rank):
    scout_args = f"--scout-stall-floor={STALL_FLOOR}" + (
        f" --scout-inject={inject}" if inject else ""
    )
    script = sj.batch_script(lab, train_args="--steps 400 --step-sleep 0.02", scout_args=scout_args)
    job = sj.submit(lab, script, extra=("--no-requeue",))
    fault_at = 0.0
    if inject is None:
        sj.wait_progress(lab, job, rank, steps=5)
        pid = sj.places(lab, job)[rank].child_pid
        assert pid > 0
        fault_at = time.time()
        os.kill(pid, signal.SIGSTOP)  # a process of a job this test submitted
    sj.wait_finished(lab, job, timeout=180)
    return job, fault_at


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case_id,inject,rank,kind", CASES, ids=[c[0] for c in CASES])
def test_fault_is_named(lab, clean_drains, case_id, inject, rank, kind):
    job, fault_at = _run_fault(lab, inject, rank)
    shown = sj.show_json(lab, job, restart=0)
    info = ops.job_info(job, timeout=10, env=lab.client_env())
    place = sj.places(lab, job)[rank]
    assert shown["kind"] == kind, (shown, sj.output(lab, job)[-2000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, place.node)], shown
    assert place.node == sj.node_of_rank(info.nodes, rank)
    fault_at = fault_at or sj.injected_at(lab, job)
    assert fault_at > 0
    v = sj.verdict(lab, job)
    d = sj.decision(lab, job)
    detect = (d.at - fault_at) if d else (v.first_failure_at - fault_at)
    print(
        f"\nLATENCY {case_id}: fault->detection {detect:.2f} s, fault->verdict "
        f"{v.created_at - fault_at:.2f} s "
        f"(stall floor {STALL_FLOOR} s)"
    )
    # every node's Epilog digested its ranks (SLURM_GTIDS -> the tasks file -> the digest), and the
    # controller's reading of the digests gives the verdict the ranks' own files give
    folder = sj.folder(lab, job)
    assert all(folder.node_digest_path(0, n).is_file() for n in info.nodes), info.nodes
    from_digests = gather_evidence(folder, 0, job_exit_code=256)
    assert from_digests.abridged == frozenset(range(4)) and not from_digests.problems
    from_files = gather_evidence(folder, 0, job_exit_code=256, digests=False)
    assert dataclasses.replace(
        localise(from_digests, now=v.created_at), created_at=0
    ) == dataclasses.replace(localise(from_files, now=v.created_at), created_at=0)
    if case_id == "skip-one-allreduce":
        # gloo aborts on the size mismatch (on a neighbour, not the culprit): the rings tell who
        # left the sequence
        assert any("desync" in line for line in shown["reasoning"]), shown
    elif kind == "hang":
        assert d is not None and d.culprits == (rank,)
        assert detect < STALL_FLOOR + 6
    if case_id == "sigstop-from-outside":
        # a stopped process runs no stack handler: its watchdog read it from /proc before the kill
        stacks = folder.stacks_path(0, rank).read_text()
        assert "no Python stack dump within" in stacks and "state T (stopped)" in stacks, stacks[
            -2000:
        ]


@pytest.mark.timeout(240)
def test_abort_at_exit_after_training_finished_drains_nothing(lab, clean_drains):
    """Rank 1 finishes, leaves the process group, then dies of SIGABRT: the job failed, but every
    rank did its collectives and the others exited cleanly. Nobody is blamed, nothing drained, and
    the job (its training done) is not requeued."""
    script = sj.batch_script(
        lab,
        train=sj.TRAIN.parent / "abort_at_exit.py",
        pre="export ABORT_AT_EXIT_RANK=1",
        train_args="--steps 20 --step-sleep 0.01",
        scout_args=f"--scout-stall-floor={STALL_FLOOR}",
    )
    job = sj.submit(lab, script)  # requeue allowed: the verdict must not use it
    sj.wait_finished(lab, job, timeout=180)
    out = sj.output(lab, job)
    assert "rank 1: done" in out and "rank 0: done" in out, out[-2000:]
    exits = sj.exits(lab, job)
    assert (
        exits[1].signal == 6
        and exits[1].last_progress is not None
        and not exits[1].last_progress.bootstrap_active
    )
    assert all(exits[r].exit_code == 0 and exits[r].signal == 0 for r in (0, 2, 3))
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "inconclusive" and shown["suspects"] == [], shown
    assert any(
        "rank 1 on" in line and "killed by SIGABRT after it had left distributed training" in line
        for line in shown["reasoning"]
    ), shown
    acts = sj.actions(lab, job)
    assert acts.actions == () and acts.status == PlanStatus.NOTHING_TO_DO, acts
    info = ops.job_info(job, timeout=10, env=lab.client_env())
    assert info.restart_count == 0 and info.is_finished
    assert not [n.name for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained]


@pytest.mark.timeout(600)
def test_clean_runs_name_nobody(lab, clean_drains):
    # 6 jobs (10 before: 102 s of the fresh-clone CI's 60 min); every other lab test's clean job
    # and the fault matrix's clean cells check the same
    jobs = []
    for _ in range(6):
        script = sj.batch_script(
            lab,
            train_args="--steps 30 --step-sleep 0.01",
            scout_args=f"--scout-stall-floor={STALL_FLOOR}",
        )
        jobs.append(sj.submit(lab, script, extra=("--no-requeue",)))
        if len(jobs) % 2 == 0:  # two at a time: the machine has two cores
            for j in jobs[-2:]:
                sj.wait_finished(lab, j, timeout=240)
    for j in jobs:
        shown = sj.show_json(lab, j, restart=0)
        assert shown["kind"] == "clean", (shown, sj.output(lab, j)[-2000:])
        assert shown["suspects"] == []
        assert "rank 0: done" in sj.output(lab, j)
    assert not [n.name for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained]


KEEP_ALIVE = sj.TRAIN.parent / "train_keep_alive.py"
CRASHES = [
    # id, inject spec, the job's environment, rank, what the suspect's evidence must say
    ("sigkill", "sigkill,rank=3,step=5", "", 3, "rank 3 killed by SIGKILL"),
    (
        "raise-then-idle",
        "raise,rank=1,step=5",
        "export KEEP_ALIVE=1",
        1,
        "exception: RuntimeError: scout injected exception at step 5",
    ),
    (
        "out-of-memory",
        None,
        "export OOM_RANK=2 OOM_STEP=5",
        2,
        "exception: RuntimeError: [enforce fail at alloc_cpu.cpp",
    ),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case_id,inject,pre,rank,said", CRASHES, ids=[c[0] for c in CRASHES])
def test_crash_kind_from_the_strongest_evidence(
    lab, clean_drains, case_id, inject, pre, rank, said
):
    """Issue 19: a rank SIGKILLed, one whose main thread raised while a non-daemon thread kept it
    alive (its peers wait for it: the watchdogs call the stall), and one whose allocation failed
    (the CPU allocator's own out-of-memory error, under an address-space limit set in that rank
    only) are crashes, named with the signal or the exception's type and message."""
    scout_args = f"--scout-stall-floor={STALL_FLOOR}" + (
        f" --scout-inject={inject}" if inject else ""
    )
    script = sj.batch_script(
        lab,
        train=KEEP_ALIVE,
        pre=pre,
        train_args="--steps 400 --step-sleep 0.02",
        scout_args=scout_args,
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=180)
    out = sj.output(lab, job)
    shown = sj.show_json(lab, job, restart=0)
    place = sj.places(lab, job)[rank]
    assert shown["kind"] == "crash", (shown, out[-3000:])
    assert [(s["rank"], s["node"], s["kind"]) for s in shown["suspects"]] == [
        (rank, place.node, "crash")
    ], shown
    evidence = shown["suspects"][0]["evidence"]
    assert any(line.startswith(said) for line in evidence), (evidence, out[-3000:])
    exits = sj.exits(lab, job)
    d = sj.decision(lab, job)
    if case_id == "raise-then-idle":
        # it stayed alive: the watchdogs called the stall on it and scout ended it
        assert d is not None and d.culprits == (rank,), d
        assert exits[rank].killed_by_scout and exits[rank].exception.endswith(
            "exception at step 5"
        ), exits[rank]
        assert "stayed alive without progress" in " ".join(evidence)
        stacks = sj.folder(lab, job).stacks_path(0, rank).read_text()
        assert "(most recent call first)" in stacks, stacks[
            -2000:
        ]  # its threads, dumped before the kill
    elif case_id == "out-of-memory":
        assert (
            exits[rank].exit_code == 1
            and "DefaultCPUAllocator: can't allocate memory" in exits[rank].exception
        )
    folder = sj.folder(lab, job)
    from_digests = gather_evidence(folder, 0, job_exit_code=256)
    from_files = gather_evidence(folder, 0, job_exit_code=256, digests=False)
    v = sj.verdict(lab, job)
    assert dataclasses.replace(
        localise(from_digests, now=v.created_at), created_at=0
    ) == dataclasses.replace(localise(from_files, now=v.created_at), created_at=0)
    print(f"\nCRASH {case_id}: {shown['suspects'][0]['evidence'][:3]}")
