"""Issue "Hardening": the one executor of remediation plans against the real lab cluster.

An Epilog killed at any point and run again completes the incident without duplicate actions;
when Slurm does not answer, the plan stays pending on disk, nothing lost, and a later run applies
it. The plans drain a real node and requeue a real running job (a `sleep`), so Slurm's own
restart count says how many requeues there were.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import scoutjobs as sj

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import VerdictKind
from scout_slurm.evidence.store import create_record_exclusive, read_record
from scout_slurm.lab.cluster import CLUSTER_NAME
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.records import (
    ActionKind,
    ActionsRecord,
    Drain,
    Exclude,
    PlannedAction,
    PlanStatus,
    Requeue,
)
from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# apply_plan alone in a process of its own. Its clock is read once before each action starts: on
# the read before action `stop_after + 1`, when the results of the first `stop_after` are on disk,
# the process stops itself, and the test kills it there (a clock is a seam apply_plan takes).
APPLY = """
import os, signal, sys, time
from pathlib import Path
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.records import ActionsRecord
path, root, stop_after = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
reads = [0]
def clock():
    reads[0] += 1
    if reads[0] == stop_after + 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    return time.monotonic()
record = read_record(path, ActionsRecord, root=root)
folder = JobFolder(root, "scoutlab", record.job_id)
apply_plan(record, path, folder, timeout=20, retries=0, retry_wait_s=1,
           deadline=time.monotonic() + 60, clock=clock)
"""


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def running_job(lab) -> tuple[int, str]:
    """A job that only sleeps, running on one node: (job id, node)."""
    env = lab.client_env()
    job = ops.submit_batch(
        "#!/bin/bash\nsleep 600\n",
        ["-N1", "--job-name=scout-rerun", f"--output={lab.paths.work}/rerun-%j.out"],
        timeout=20,
        env=env,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = ops.job_info(job, timeout=10, env=env)
        if info.state == "RUNNING" and info.nodes:
            return job, info.nodes[0]
        time.sleep(0.2)
    raise AssertionError(f"job {job} did not start: {info}")


def plan_for(
    job: int, node: str, root: Path, *, requeue_only: bool = False
) -> tuple[ActionsRecord, str]:
    reason = f"scout: crash rank 0 job {job} run 0 conf 0.95 see {root}/{CLUSTER_NAME}/{job}"
    actions = (
        (PlannedAction.of(Requeue(job)),)
        if requeue_only
        else (
            PlannedAction.of(Drain(node, reason)),
            PlannedAction.of(Requeue(job)),
            PlannedAction.of(Exclude(job, (node,))),
        )
    )
    now = time.time()
    return ActionsRecord(
        job_id=job,
        restart=0,
        verdict_kind=VerdictKind.CRASH,
        status=PlanStatus.PLANNED,
        actions=actions,
        held_back=(),
        results=(),
        created_at=now,
        updated_at=now,
    ), reason


def actions_file(tmp_path: Path, job: int) -> tuple[Path, JobFolder]:
    """The plan's own evidence folder, beside the lab's (the lab's hooks never see it)."""
    folder = JobFolder(tmp_path / "evidence", CLUSTER_NAME, job)
    folder.results_dir.mkdir(parents=True)  # as the Prolog lays it out
    return folder.actions_path(0), folder


def drain_updates(lab, node: str, job: int, since: int) -> int:
    """How many times slurmctld set `node`'s reason to one naming `job`, in its log after offset
    `since`.
    """
    with open(lab.paths.logs / "slurmctld.log", "rb") as fh:
        fh.seek(since)
        text = fh.read().decode(errors="replace")
    return len(
        re.findall(rf"node {re.escape(node)} reason set to: scout: crash rank 0 job {job} ", text)
    )


def log_size(lab) -> int:
    return (lab.paths.logs / "slurmctld.log").stat().st_size


def assert_completed(lab, record: ActionsRecord, job: int, node: str, reason: str) -> None:
    env = lab.client_env()
    assert record.status == PlanStatus.APPLIED, record
    ok = Counter((r.kind, r.target) for r in record.results if r.ok)
    assert ok == Counter((a.kind, a.target) for a in record.actions), (
        f"an action done twice or not at all: {record.results}"
    )
    info = ops.job_info(job, timeout=10, env=env)
    assert info.restart_count == 1, f"requeued {info.restart_count} times"
    if any(a.kind == ActionKind.DRAIN for a in record.actions):
        n = ops.node_info(node, timeout=10, env=env)
        assert n.is_drained and n.reason == reason, n
        assert node in info.excluded_nodes, info


def cleanup(lab, job: int, node: str) -> None:
    env = lab.client_env()
    try:
        ops.cancel_job(job, timeout=10, env=env)
    finally:
        n = ops.node_info(node, timeout=10, env=env)
        if n.is_drained and n.reason.startswith("scout:"):
            ops.resume_node(node, timeout=10, env=env)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stop_after", [1, 2], ids=["after-drain", "after-requeue"])
def test_an_apply_killed_between_actions_and_run_again_does_nothing_twice(
    lab, clean_drains, tmp_path, stop_after
):
    job, node = running_job(lab)
    path, folder = actions_file(tmp_path, job)
    record, reason = plan_for(job, node, folder.root)
    try:
        assert create_record_exclusive(path, record)
        since = log_size(lab)
        child = subprocess.Popen(
            [sys.executable, "-c", APPLY, str(path), str(folder.root), str(stop_after)],
            env=lab.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            seen = record
            while time.monotonic() < deadline and child.poll() is None:
                try:
                    seen = read_record(path, ActionsRecord, root=folder.root)
                except EvidenceError:
                    pass
                if len(seen.results) >= stop_after and _stopped(child.pid):
                    break
                time.sleep(0.01)
        finally:
            child.send_signal(signal.SIGKILL)
            out = child.communicate(timeout=30)[0].decode(errors="replace")
        killed = read_record(path, ActionsRecord, root=folder.root)
        print(
            f"\nkilled after {[r.kind.value for r in killed.results]}, status {killed.status.value}"
        )
        assert child.returncode == -signal.SIGKILL, out[-3000:]
        assert [(r.kind, r.ok) for r in killed.results] == [
            (a.kind, True) for a in record.actions[:stop_after]
        ], out
        assert killed.status == PlanStatus.PLANNED

        final = apply_plan(
            killed,
            path,
            folder,
            timeout=20,
            retries=2,
            retry_wait_s=1,
            deadline=time.monotonic() + 60,
            env=lab.client_env(),
        )
        assert read_record(path, ActionsRecord, root=folder.root) == final
        assert final.results[:stop_after] == killed.results
        assert_completed(lab, final, job, node, reason)
        assert drain_updates(lab, node, job, since) == 1
        # and a third run, after the incident is complete, changes nothing in Slurm
        again = apply_plan(
            final,
            path,
            folder,
            timeout=20,
            retries=0,
            retry_wait_s=1,
            deadline=time.monotonic() + 30,
            env=lab.client_env(),
        )
        assert again.results == final.results
        assert_completed(lab, again, job, node, reason)
        assert drain_updates(lab, node, job, since) == 1
    finally:
        cleanup(lab, job, node)


@pytest.mark.timeout(120)
def test_a_requeue_slurm_did_but_the_record_missed_is_not_repeated(lab, clean_drains, tmp_path):
    """The worst window: killed after Slurm requeued the job, before the result was written; by the
    time the hook runs again the rerun is already running, where a second requeue would succeed."""
    job, node = running_job(lab)
    path, folder = actions_file(tmp_path, job)
    record, _ = plan_for(job, node, folder.root, requeue_only=True)
    env = lab.client_env()
    try:
        ops.requeue_job(job, timeout=20, env=env)  # what the killed hook did
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            info = ops.job_info(job, timeout=10, env=env)
            if info.state == "RUNNING" and info.restart_count == 1:
                break
            time.sleep(0.3)
        else:
            pytest.fail(f"the requeued job did not run again: {info}")
        final = apply_plan(
            record,
            path,
            folder,
            timeout=20,
            retries=0,
            retry_wait_s=1,
            deadline=time.monotonic() + 30,
            env=env,
        )
        assert final.status == PlanStatus.APPLIED
        assert [(r.kind, r.ok) for r in final.results] == [(ActionKind.REQUEUE, True)]
        assert final.results[0].message.startswith("already requeued"), final.results
        info = ops.job_info(job, timeout=10, env=env)
        assert info.restart_count == 1 and info.state == "RUNNING", info
    finally:
        cleanup(lab, job, node)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_when_slurm_does_not_answer_the_plan_stays_pending_and_a_later_run_applies_it(
    lab, clean_drains, tmp_path
):
    job, node = running_job(lab)
    path, folder = actions_file(tmp_path, job)
    record, reason = plan_for(job, node, folder.root)
    # the lab's slurm.conf, with a controller port where nothing listens
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        re.sub(
            r"(?m)^SlurmctldPort=\d+$",
            f"SlurmctldPort={free_port()}",
            lab.paths.slurm_conf.read_text(),
        )
    )
    assert conf.read_text() != lab.paths.slurm_conf.read_text()
    dead = {**lab.client_env(), "SLURM_CONF": str(conf)}
    try:
        assert create_record_exclusive(path, record)
        t0 = time.monotonic()
        pending = apply_plan(
            record,
            path,
            folder,
            timeout=3,
            retries=1,
            retry_wait_s=0.5,
            deadline=time.monotonic() + 10,
            env=dead,
        )
        took = time.monotonic() - t0
        print(
            f"\nno answer: {pending.status.value} after {took:.1f} s: "
            f"{pending.results[0].message[:200]}"
        )
        assert took < 15
        assert pending.status == PlanStatus.PENDING
        assert pending.actions == record.actions  # nothing lost
        assert [(r.kind, r.ok, r.attempts) for r in pending.results] == [
            (ActionKind.DRAIN, False, 2)
        ]
        assert pending.results[0].message  # the error is kept
        assert read_record(path, ActionsRecord, root=folder.root) == pending  # and on disk
        assert not ops.node_info(node, timeout=10, env=lab.client_env()).is_drained
        assert ops.job_info(job, timeout=10, env=lab.client_env()).restart_count == 0

        final = apply_plan(
            read_record(path, ActionsRecord, root=folder.root),
            path,
            folder,
            timeout=20,
            retries=2,
            retry_wait_s=1,
            deadline=time.monotonic() + 60,
            env=lab.client_env(),
        )
        assert_completed(lab, final, job, node, reason)
        assert final.results[0] == pending.results[0]  # the failed attempt stays in the record
    finally:
        cleanup(lab, job, node)


# The hook as Slurm would run it, with the incident's lock and pending marker, stopped before action
# `stop_after + 1` (as APPLY above) so that the test kills it exactly there.
APPLY_LOCKED = """
import os, signal, sys, time
from pathlib import Path
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import read_record
from scout_slurm.incident.pending import PendingIncident, held_lock, write_marker
from scout_slurm.jobenv import HookContext
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.records import ActionsRecord
root, job, node, stop_after = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
folder = JobFolder(root, "scoutlab", job)
reads = [0]
def clock():
    reads[0] += 1
    if reads[0] == stop_after + 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    return time.monotonic()
ctx = HookContext(job_id=job, job_uid=0, job_user="root", cluster="scoutlab", restart=0, node="",
                  job_nodelist=node, exit_code_raw=256, script_context="epilog_slurmctld",
                  work_dir="/")
with held_lock(folder, 0):
    write_marker(folder, PendingIncident.of(ctx, since=time.time() - 5, holder="controller"))
    record = read_record(folder.actions_path(0), ActionsRecord, root=root)
    if stop_after == 0:
        os.kill(os.getpid(), signal.SIGSTOP)   # killed after planning, before the first action
    apply_plan(record, folder.actions_path(0), folder, timeout=20, retries=0, retry_wait_s=1,
               deadline=time.monotonic() + 60, clock=clock)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "stop_after", [0, 1, 2], ids=["after-planning", "after-drain", "after-requeue"]
)
def test_an_incident_left_by_a_killed_hook_is_completed_by_the_next_controller_run(
    lab, clean_drains, stop_after
):
    """No rerun by hand: the controller Epilog of the next job to end on the cluster (any job, here
    a
    plain `true` of another user) finds the marker, takes the free lock, and completes the incident
    from its actions record: each action done once, the marker gone."""
    job, node = running_job(lab)
    folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job)
    # what makes it a scout job for the hooks: a rank's record in the run folder the Prolog lays out
    # (a job shows RUNNING while its Prolog may still run: wait for the folder)
    deadline = time.monotonic() + 30
    while (
        not (folder.ranks_dir(0).is_dir() and folder.results_dir.is_dir())
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    (folder.ranks_dir(0) / "rank-0.json").write_text("{}")
    record, reason = plan_for(job, node, folder.root)
    try:
        assert create_record_exclusive(folder.actions_path(0), record)
        since = log_size(lab)
        child = subprocess.Popen(
            [sys.executable, "-c", APPLY_LOCKED, str(folder.root), str(job), node, str(stop_after)],
            env=lab.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and child.poll() is None and not _stopped(child.pid):
                time.sleep(0.01)
        finally:
            child.send_signal(signal.SIGKILL)
            out = child.communicate(timeout=30)[0].decode(errors="replace")
        killed = read_record(folder.actions_path(0), ActionsRecord, root=folder.root)
        assert child.returncode == -signal.SIGKILL, out[-3000:]
        assert [(r.kind, r.ok) for r in killed.results] == [
            (a.kind, True) for a in record.actions[:stop_after]
        ], out
        assert killed.status == PlanStatus.PLANNED and folder.pending_path(0).exists()
        shown = subprocess.run(
            [sys.executable, "-m", "scout_slurm.cli", "incidents", "--pending"],
            capture_output=True,
            text=True,
            env=lab.client_env(),
            timeout=60,
        ).stdout
        taken_over = stop_after == 2 and (
            ("no pending incidents" in shown and not folder.pending_path(0).exists())
            or re.search(rf"{job}\s+0\s+applied\s+since .* begun by controller", shown)
        )
        if not taken_over:
            # (after the requeue the job itself ends, and its own controller Epilog may complete the
            # incident first once the marker is old enough: then it is gone, or being completed by
            # that
            # controller run, by the time it is listed)
            assert re.search(rf"{job}\s+0\s+planned", shown), shown

        t0 = time.monotonic()
        other = sj.submit(lab, "#!/bin/bash\ntrue\n", nodes=1, tasks_per_node=1)
        sj.wait_completed(lab, other)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            final = read_record(folder.actions_path(0), ActionsRecord, root=folder.root)
            if final.status != PlanStatus.PLANNED and not folder.pending_path(0).exists():
                break
            time.sleep(0.3)
        print(
            f"\nkilled {['after planning', 'after drain', 'after requeue'][stop_after]}: "
            "completed by job "
            f"{other}'s controller Epilog {time.monotonic() - t0:.1f} s after that job was "
            "submitted"
        )
        assert final.results[:stop_after] == killed.results
        assert_completed(lab, final, job, node, reason)
        assert drain_updates(lab, node, job, since) == 1  # once, whoever did it
        assert not folder.pending_path(0).exists()
        ctl_log = (lab.paths.logs / "hooks-slurmctld.log").read_text(errors="replace")
        assert '"event": "controller.pending_completed"' in ctl_log and f'"job": {job}' in ctl_log
    finally:
        cleanup(lab, job, node)
