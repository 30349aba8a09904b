"""The lab cluster and the Slurm operations scout relies on, against real slurmctld and slurmd:
task placement, a hostile drain reason, requeue with a merged exclusion, clean up/down cycles."""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from conftest import free_port_base

from scout_slurm.errors import SlurmError
from scout_slurm.lab.cluster import Lab, LabSpec
from scout_slurm.slurm import ops
from scout_slurm.slurm.parse import JobInfo, NodeInfo, format_reason

pytestmark = [pytest.mark.slurm]

T = 10.0  # timeout of one Slurm command


def wait_for_job(
    job_id: int, env, *, timeout: float = 30.0, until=lambda j: j.is_finished
) -> JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        job = ops.job_info(job_id, timeout=T, env=env)
        if until(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state} after {timeout} s: {job}")
        time.sleep(0.2)


def node(name: str, env) -> NodeInfo:
    (found,) = [n for n in ops.list_nodes(timeout=T, env=env) if n.name == name]
    return found


def restore_nodes(lab: Lab) -> None:
    """Resume every node that is not plainly up, so later tests find the cluster idle."""
    env = lab.client_env()
    for n in ops.list_nodes(timeout=T, env=env):
        if n.is_drained or n.state in ("DOWN", "DRAIN"):
            try:
                ops.resume_node(n.name, timeout=T, env=env)
            except SlurmError:
                pass


@pytest.fixture()
def cluster(lab):
    try:
        yield lab
    finally:
        restore_nodes(lab)


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.mark.timeout(120)
def test_two_nodes_four_tasks_land_on_two_distinct_nodes(cluster):
    env = cluster.client_env()
    out = cluster.paths.work / f"{unique('tasks')}.txt"
    script = f"#!/bin/bash\nsrun bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME' > {out}\n"
    job_id = ops.submit_batch(
        script,
        [
            "-N2",
            "--ntasks-per-node=2",
            "--job-name=two-nodes",
            f"--chdir={cluster.paths.work}",
            f"--output={out}.batch",
        ],
        timeout=T,
        env=env,
    )
    job = wait_for_job(job_id, env)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    lines = out.read_text().split("\n")
    assert lines[-1] == "" and len(lines[:-1]) == 4, lines
    rows = [line.split(" ") for line in lines[:-1]]
    assert sorted(int(rank) for rank, _ in rows) == [0, 1, 2, 3]
    per_node = collections.Counter(name for _, name in rows)
    assert len(per_node) == 2 and set(per_node.values()) == {2}
    assert set(per_node) == set(job.nodes) and len(job.nodes) == 2
    assert job.batch_host in job.nodes


@pytest.mark.timeout(120)
def test_drain_with_a_hostile_reason_then_resume(cluster, tmp_path):
    env = cluster.client_env()
    marker = tmp_path / "pwned"
    tmp_pwned_before = os.path.exists("/tmp/pwned")
    reason = (
        f'scout: "quoted" it\'s; rm -rf /nothing; $(touch /tmp/pwned) `touch {marker}` '
        f"$(touch {marker})\nsecond line; "
    )
    reason += "R" * (500 - len(reason))
    assert len(reason) == 500
    stored = format_reason(reason)
    assert "\n" not in stored and len(stored) == 500 and stored.count("second line") == 1

    ops.drain_node("n3", reason, timeout=T, env=env)
    drained = node("n3", env)
    assert drained.is_drained and "DRAIN" in drained.flags and drained.state == "IDLE"
    assert drained.reason == stored
    assert ops.node_info("n3", timeout=T, env=env).reason == stored  # scontrol show node -o agrees
    assert [n.name for n in ops.list_nodes(timeout=T, env=env) if n.is_drained] == ["n3"]
    assert not marker.exists()
    assert tmp_pwned_before or not os.path.exists("/tmp/pwned")

    ops.resume_node("n3", timeout=T, env=env)
    deadline = time.monotonic() + 5
    while not (state := node("n3", env)).is_idle:  # `idle*` (NOT_RESPONDING) for about a second
        assert time.monotonic() < deadline, f"n3 not idle 5 s after resume: {state}"
        time.sleep(0.1)
    # Slurm 24.11.5 keeps the reason after resume (22.05.8 and 26.05.5 clear it; measured): a node
    # is drained by its DRAIN flag, never by a reason alone
    assert state.flags == () and state.reason == (stored if cluster.spec.slurm == "24.11" else "")


@pytest.mark.timeout(120)
def test_failed_job_is_requeued_away_from_excluded_nodes(cluster):
    env = cluster.client_env()
    out = cluster.paths.work / f"{unique('requeue')}.out"
    script = (
        "#!/bin/bash\n"
        'echo "SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-unset} node=$SLURMD_NODENAME"\n'
        '[ "${SLURM_RESTART_COUNT:-0}" != 0 ] || exit 3\n'
    )
    job_id = ops.submit_batch(
        script,
        [
            "-N1",
            "--exclude=n4",
            "--requeue",
            "--open-mode=append",
            f"--output={out}",
            f"--chdir={cluster.paths.work}",
        ],
        timeout=T,
        env=env,
    )
    failed = wait_for_job(job_id, env)
    assert (failed.state, failed.exit_code, failed.restart_count) == ("FAILED", 3 << 8, 0), failed
    assert failed.excluded_nodes == ("n4",) and failed.requeue
    assert len(failed.nodes) == 1 and failed.nodes[0] != "n4"
    first_node = failed.nodes[0]

    ops.requeue_job(
        job_id, timeout=T, env=env
    )  # first requeue, then update: a finished job takes no update
    merged = ops.exclude_nodes(job_id, ["n1"], timeout=T, env=env)
    assert merged == "n[1,4]"
    pending = ops.job_info(job_id, timeout=T, env=env)
    assert pending.excluded_nodes == ("n1", "n4")
    assert pending.restart_count == 1 and not pending.is_finished

    # Slurm holds a requeued job cred_expire + 1 s (the lab sets cred_expire=5)
    done = wait_for_job(job_id, env, timeout=40)
    assert (done.state, done.exit_code, done.restart_count) == ("COMPLETED", 0, 1), done
    assert len(done.nodes) == 1 and done.nodes[0] not in ("n1", "n4")
    assert out.read_text().splitlines() == [
        f"SLURM_RESTART_COUNT=unset node={first_node}",
        f"SLURM_RESTART_COUNT=1 node={done.nodes[0]}",
    ]


# -- a lab of its own, started and stopped five times --------------------------------------------


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def processes_mentioning(path: Path) -> list[tuple[int, str]]:
    needle = str(path).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace")))
    return found


@pytest.fixture()
def private_lab_dir():
    # short and under /tmp: the munge socket path must fit in a Unix socket address
    path = Path(tempfile.mkdtemp(prefix="scout-lab-own-", dir="/tmp"))
    try:
        yield path
    finally:
        Lab(LabSpec(state_dir=path)).down()
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_then_down_five_times_leaves_nothing_running(private_lab_dir):
    own = Lab(
        LabSpec(state_dir=private_lab_dir, nodes=2, port_base=free_port_base(3, 30000, 32700))
    )
    for cycle in range(5):
        own.up()
        pids = own.running_pids()
        assert len(pids) >= 4, f"cycle {cycle}: munged, slurmctld and 2 slurmd expected, got {pids}"
        assert {n.name for n in ops.list_nodes(timeout=T, env=own.client_env()) if n.is_idle} == {
            "n1",
            "n2",
        }
        own.down()
        assert not [pid for pid in pids if _alive(pid)], f"cycle {cycle}"
        assert own.running_pids() == [], f"cycle {cycle}"
        assert processes_mentioning(private_lab_dir) == [], f"cycle {cycle}"


@pytest.mark.timeout(60)
def test_down_stops_the_daemons_even_when_cancelling_jobs_fails(private_lab_dir, monkeypatch):
    own = Lab(
        LabSpec(state_dir=private_lab_dir, nodes=1, port_base=free_port_base(2, 30000, 32700))
    )
    own.up()
    pids = own.running_pids()

    def broken(self):
        raise ValueError("I/O operation on closed file")  # what a logger on a closed stream raises

    monkeypatch.setattr(Lab, "_cancel_all_jobs", broken)
    own.down()
    assert own.running_pids() == [] and not [pid for pid in pids if _alive(pid)]
