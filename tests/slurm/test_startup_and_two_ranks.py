"""Issue 22: start-up is never taken for a hang, and a two-rank job (one rank per node) is named
from direct process evidence, on the real lab cluster (CPU, gloo) with the tests' shortened stall
floor (4 s) and the lab's start-up limit.

- a DDP job that sleeps 20 s (5 stall floors) between its first collectives and its first step
  completes untouched;
- a rank that hangs before its first step is named by the start-up limit as a `startup hang`, with
stacks;
- 2 nodes x 1 rank: SIGSTOP, SIGKILL and exit named exactly with the right kind; a rank that only
  sleeps (no process evidence, a progress tie of one against one) stays inconclusive.

Issue 38, with the start-up limit at 8 s:
- a step outside torch.distributed that runs three start-up limits completes (COMPLETED, exit 0),
  its start banner promising the exit watch only;
- a rank that sleeps before init_process_group while its peers wait there is a `startup hang` on
  that rank, and the job's output says so in one `scout:` line (rank, node, where, exit codes).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
STALL_FLOOR = 4.0
SLOW_START = sj.TRAIN.parent / "train_slow_start.py"
PREPARE = sj.TRAIN.parent / "prepare_data.py"
STARTUP_LIMIT = 8.0


def _no_drains(lab) -> None:
    assert not [n.name for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained]


@pytest.mark.timeout(300)
def test_slow_start_after_first_collectives_completes_untouched(lab, clean_drains):
    script = sj.batch_script(
        lab,
        train=SLOW_START,
        train_args="--startup-sleep 20 --steps 20",
        scout_args=f"--scout-stall-floor={STALL_FLOOR}",
    )
    t0 = time.monotonic()
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=240)
    took = time.monotonic() - t0
    out = sj.output(lab, job)
    assert all(f"rank {r}: done" in out for r in range(4)), out[-3000:]
    assert sj.decision(lab, job) is None
    assert all(e.exit_code == 0 and not e.killed_by_scout for e in sj.exits(lab, job).values())
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "clean" and shown["suspects"] == [], shown
    print(
        f"\nSLOW START: 20 s start-up, stall floor {STALL_FLOOR} s: job completed in "
        f"{took:.1f} s untouched"
    )
    _no_drains(lab)


@pytest.mark.timeout(300)
def test_hang_before_first_step_is_a_startup_hang(lab, clean_drains):
    # rank 1 never reaches its first step; the others wait in their first all-reduce. The start-up
    # limit (shortened here to 20 s, as the stall floor is) names it, not the 4 s floor.
    script = sj.batch_script(
        lab,
        train=SLOW_START,
        train_args="--startup-sleep 3600 --sleep-rank 1",
        scout_args=f"--scout-stall-floor={STALL_FLOOR}",
        pre="export SCOUT_WATCHDOG_STARTUP_GRACE_S=20",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=200)
    d = sj.decision(lab, job)
    assert d is not None and d.culprits == (1,) and d.phase == "startup", (
        d,
        sj.output(lab, job)[-3000:],
    )
    assert d.reasoning[0].startswith("startup hang:"), d
    shown = sj.show_json(lab, job, restart=0)
    place = sj.places(lab, job)[1]
    assert shown["kind"] == "hang", shown
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(1, place.node)], shown
    assert any("startup hang" in line for line in shown["reasoning"]), shown
    stacks = sj.folder(lab, job).stacks_path(0, 1).read_text()
    assert "train_slow_start.py" in stacks and " in main" in stacks, stacks[
        -2000:
    ]  # its Python stack, in the sleep
    started = sj.places(lab, job)[1].started_at
    print(
        f"\nSTARTUP HANG: named {d.at - started:.1f} s after rank 1 started (start-up limit "
        f"20 s, floor {STALL_FLOOR} s)"
    )


TWO_RANK = [
    # id, inject (None: SIGSTOP from outside), kind, what the verdict must say
    ("sigstop", None, "hang"),
    ("sigkill", "sigkill,rank=1,step=5", "crash"),
    ("exit", "exit,rank=1,step=5", "crash"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case_id,inject,kind", TWO_RANK, ids=[c[0] for c in TWO_RANK])
def test_two_ranks_one_per_node_named_from_process_evidence(
    lab, clean_drains, case_id, inject, kind
):
    scout_args = f"--scout-stall-floor={STALL_FLOOR}" + (
        f" --scout-inject={inject}" if inject else ""
    )
    script = sj.batch_script(lab, train_args="--steps 400 --step-sleep 0.02", scout_args=scout_args)
    job = sj.submit(lab, script, tasks_per_node=1, extra=("--no-requeue",))
    if inject is None:
        sj.wait_progress(lab, job, 1, steps=5)
        pid = sj.places(lab, job)[1].child_pid
        assert pid > 0
        os.kill(pid, signal.SIGSTOP)  # a process of a job this test submitted
    sj.wait_finished(lab, job, timeout=180)
    shown = sj.show_json(lab, job, restart=0)
    place = sj.places(lab, job)[1]
    assert place.world_size == 2
    assert shown["kind"] == kind, (shown, sj.output(lab, job)[-3000:])
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(1, place.node)], shown
    if case_id == "sigstop":
        d = sj.decision(lab, job)
        assert d is not None and d.culprits == (1,), d
        assert any("stopped" in line for line in d.reasoning), d


@pytest.mark.timeout(240)
def test_two_ranks_a_rank_that_only_sleeps_is_inconclusive(lab, clean_drains):
    """No process evidence (the sleeper is in S state like its waiting peer): one behind of two is
    no majority, so nobody is named and nothing is drained."""
    script = sj.batch_script(
        lab,
        train_args="--steps 400 --step-sleep 0.02",
        scout_args=f"--scout-stall-floor={STALL_FLOOR} --scout-inject=sleep,rank=1,step=5",
    )
    job = sj.submit(lab, script, tasks_per_node=1, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=180)
    d = sj.decision(lab, job)
    assert d is not None and d.culprits == (), d
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "inconclusive" and shown["suspects"] == [], shown
    _no_drains(lab)


@pytest.mark.timeout(300)
def test_a_long_save_and_a_long_evaluation_are_busy_not_hung(lab, clean_drains):
    """Rank 0 spends 10 s in torch.save while the others wait in the next all-reduce, then every
    rank evaluates for 10 s without a collective: with a 4 s floor neither is a stall (the save
    marks the record busy; every forward restarts the idle clock)."""
    script = sj.batch_script(
        lab,
        train=SLOW_START,
        train_args="--startup-sleep 0 --steps 20 --slow-save 10 --eval-seconds 10",
        scout_args=f"--scout-stall-floor={STALL_FLOOR}",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=240)
    out = sj.output(lab, job)
    assert all(f"rank {r}: done" in out for r in range(4)), out[-3000:]
    assert sj.decision(lab, job) is None
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "clean" and shown["suspects"] == [], shown
    _no_drains(lab)


@pytest.mark.timeout(200)
def test_a_step_outside_torch_distributed_runs_past_the_startup_limit_and_completes(
    lab, clean_drains
):
    seconds = 3 * STARTUP_LIMIT + 1
    script = sj.batch_script(
        lab,
        train=PREPARE,
        train_args=f"--seconds {seconds:g}",
        pre=f"export SCOUT_WATCHDOG_STARTUP_GRACE_S={STARTUP_LIMIT:g}",
    )
    t0 = time.monotonic()
    job = sj.submit(lab, script, extra=("--no-requeue",))
    info = sj.wait_completed(lab, job, timeout=150)
    took = time.monotonic() - t0
    out = sj.output(lab, job)
    assert info.state == "COMPLETED" and info.exit_code == 0, (info, out[-3000:])
    assert all(f"task {r}: prepared" in out for r in range(4)), out[-3000:]
    assert sj.decision(lab, job) is None
    ends = sj.exits(lab, job)
    assert sorted(ends) == [0, 1, 2, 3] and all(
        e.exit_code == 0 and not e.killed_by_scout for e in ends.values()
    ), ends
    start = [line for line in out.splitlines() if line.startswith(f"scout: watching job {job}")]
    assert len(start) == 1 and "watched for its exit only and never called stalled" in start[0], (
        out[-3000:]
    )
    assert "entered init_process_group" not in out and "stalled first" not in out, out[-3000:]
    print(
        f"\nOUTSIDE TORCH.DISTRIBUTED: {seconds:g} s of work, start-up limit {STARTUP_LIMIT:g} s: "
        f"COMPLETED in {took:.1f} s, exit 0"
    )


@pytest.mark.timeout(240)
def test_a_rank_asleep_before_init_while_its_peers_wait_is_a_startup_hang_said_once(
    lab, clean_drains
):
    script = sj.batch_script(
        lab,
        train=SLOW_START,
        train_args="--before-init --startup-sleep 3600 --sleep-rank 1",
        scout_args=f"--scout-stall-floor={STALL_FLOOR}",
        pre=f"export SCOUT_WATCHDOG_STARTUP_GRACE_S={STARTUP_LIMIT:g}",
    )
    job = sj.submit(lab, script, extra=("--no-requeue",))
    sj.wait_finished(lab, job, timeout=200)
    out = sj.output(lab, job)
    d = sj.decision(lab, job)
    assert d is not None and d.culprits == (1,) and d.phase == "startup", (d, out[-3000:])
    assert d.reasoning[0].startswith(
        "startup hang: rank(s) 1 had not entered init_process_group"
    ), d
    shown = sj.show_json(lab, job, restart=0)
    place = sj.places(lab, job)[1]
    assert shown["kind"] == "hang", shown
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(1, place.node)], shown
    assert any("startup hang" in line for line in shown["reasoning"]), shown
    ends = sj.exits(lab, job)
    assert sorted(ends) == [0, 1, 2, 3] and all(e.killed_by_scout for e in ends.values()), ends
    # the job's output: one scout line for the step, whichever watchdog decided
    loud = [
        line for line in out.splitlines() if line.startswith("scout:") and "stalled first" in line
    ]
    assert len(loud) == 1, out[-4000:]
    assert loud[0].startswith(
        f"scout: job {job}: rank 1 on {place.node} stalled first "
        "(startup hang: before init_process_group"
    ), loud
    assert (
        "exit code 86" in loud[0] and "exit code 87" in loud[0] and f"scout show {job}" in loud[0]
    ), loud
    assert out.count(f"scout: job {job}, rank 0 entered init_process_group:") == 1, out[-4000:]
    started = place.started_at
    print(
        f"\nSTARTUP HANG BEFORE INIT: named {d.at - started:.1f} s after rank 1 started "
        "(start-up limit "
        f"{STARTUP_LIMIT:g} s); the job's line: {loud[0]}"
    )


@pytest.mark.timeout(300)
def test_loading_after_init_is_a_slow_start_for_all_and_a_startup_hang_for_one(lab, clean_drains):
    """Issue 38: every rank loading for 3 x the start-up limit between init_process_group and the
    job's first collective (a large checkpoint read from a parallel file system) completes
    untouched;
    one rank loading while its peers wait in that first collective is a startup hang on that
    rank."""
    pre = f"export SCOUT_WATCHDOG_STARTUP_GRACE_S={STARTUP_LIMIT:g}"
    seconds = 3 * STARTUP_LIMIT
    everyone = sj.submit(
        lab,
        sj.batch_script(
            lab,
            train=SLOW_START,
            pre=pre,
            train_args=f"--load-after-init {seconds:g} --startup-sleep 0 --steps 10",
            scout_args=f"--scout-stall-floor={STALL_FLOOR}",
        ),
        extra=("--no-requeue",),
    )
    one = sj.submit(
        lab,
        sj.batch_script(
            lab,
            train=SLOW_START,
            pre=pre,
            train_args="--load-after-init 3600 --sleep-rank 2 --startup-sleep 0",
            scout_args=f"--scout-stall-floor={STALL_FLOOR}",
        ),
        extra=("--no-requeue",),
    )
    info = sj.wait_completed(lab, everyone, timeout=200)
    out = sj.output(lab, everyone)
    assert info.state == "COMPLETED" and info.exit_code == 0, (info, out[-3000:])
    assert sj.decision(lab, everyone) is None and "stalled first" not in out, out[-3000:]
    sj.wait_finished(lab, one, timeout=200)
    d = sj.decision(lab, one)
    assert d is not None and d.culprits == (2,) and d.phase == "startup", (
        d,
        sj.output(lab, one)[-3000:],
    )
    shown = sj.show_json(lab, one, restart=0)
    assert shown["kind"] == "hang", shown
    assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [
        (2, sj.places(lab, one)[2].node)
    ], shown
