"""The Prolog on a real Slurm: every allocated node records its hardware map, root-owned, in the
job's evidence folder, the job's own folders belong to the job's user, and no node is drained."""

from __future__ import annotations

import os
import pwd
import stat
import time
from pathlib import Path

import pytest

from scout_slurm.evidence import store
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.hwmap import sysfs
from scout_slurm.hwmap.records import HardwareMap
from scout_slurm.lab.cluster import CLUSTER_NAME
from scout_slurm.slurm import ops
from scout_slurm.slurm.parse import JobInfo

pytestmark = [pytest.mark.slurm]

T = 10.0


def wait_finished(job_id: int, env, *, timeout: float = 60.0) -> JobInfo:
    deadline = time.monotonic() + timeout
    while True:
        job = ops.job_info(job_id, timeout=T, env=env)
        if job.is_finished:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state} after {timeout} s: {job}")
        time.sleep(0.2)


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    assert stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode), path
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


def hooks_log(lab) -> str:
    return (lab.paths.logs / "hooks.log").read_text(errors="replace")


def check_job_folder(lab, job: JobInfo, uid: int) -> None:
    """The job's folders: its uid, SlurmUser's group, setgid (the controller Epilog reads them as
    SlurmUser); results/ SlurmUser's; nodes/ root's."""
    slurm = pwd.getpwnam(lab.users["slurm_user"])
    evidence = lab.paths.evidence
    folder = JobFolder(evidence, CLUSTER_NAME, job.job_id)
    assert len(job.nodes) == 2, job
    assert sorted(p.name for p in folder.nodes_dir.iterdir()) == sorted(job.nodes)
    _, boot_id, _, _ = sysfs.read_identity(Path("/proc"))
    hostname = Path("/proc/sys/kernel/hostname").read_text().strip()
    for node in job.nodes:
        path = folder.hardware_map_path(node)
        hwmap = store.read_record(path, HardwareMap, root=evidence)
        # every lab node is a slurmd -N on this machine: Slurm's names differ, the host is one
        assert hwmap.node == node
        assert (hwmap.hostname, hwmap.boot_id) == (hostname, boot_id)
        assert hwmap.nics and hwmap.duration_s < 20
        assert owner_mode(path) == (0, 0, 0o644)
        assert owner_mode(folder.node_dir(node)) == (0, 0, 0o755)
    for d in (folder.path, folder.nodes_dir):
        assert owner_mode(d) == (0, 0, 0o755), d
    for d in (
        folder.run_dir(0),
        folder.ranks_dir(0),
        folder.progress_dir(0),
        folder.findings_dir(0),
        folder.stacks_dir(0),
        folder.checkpoints_dir,
    ):
        assert owner_mode(d) == (uid, slurm.pw_gid, 0o2750), d
    assert owner_mode(folder.results_dir) == (slurm.pw_uid, slurm.pw_gid, 0o755)
    assert sorted(p.name for p in folder.path.iterdir()) == [
        "checkpoints",
        "nodes",
        "results",
        "run-0",
    ]
    log = hooks_log(lab)
    for node in job.nodes:
        assert f'"job_id": {job.job_id}, "node": "{node}"' in log and "prolog.map_written" in log
    drained = [n.name for n in ops.list_nodes(timeout=T, env=lab.client_env()) if n.is_drained]
    assert drained == []


def test_prolog_records_each_allocated_node(lab):
    env = lab.client_env()
    job_id = ops.submit_batch(
        "#!/bin/sh\nsrun true\n",
        [
            "-N2",
            "--ntasks-per-node=2",
            f"--chdir={lab.paths.work}",
            f"--output={lab.paths.work}/prolog-map-%j.out",
        ],
        timeout=T,
        env=env,
    )
    job = wait_finished(job_id, env)
    assert job.state == "COMPLETED", job
    check_job_folder(lab, job, 0)


def test_prolog_hands_the_run_folder_to_the_jobs_user(lab):
    env = lab.client_env()
    nobody = pwd.getpwnam("nobody")
    job_id = ops.submit_batch(
        "#!/bin/sh\nsrun true\n",
        [
            "-N2",
            "--ntasks-per-node=2",
            f"--uid={nobody.pw_uid}",
            f"--gid={nobody.pw_gid}",
            f"--chdir={lab.paths.work}",
            "--output=/dev/null",
        ],
        timeout=T,
        env=env,
    )
    job = wait_finished(job_id, env)
    assert job.state == "COMPLETED", job
    assert job.user_id == nobody.pw_uid
    check_job_folder(lab, job, nobody.pw_uid)
