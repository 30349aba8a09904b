"""Issue (hardening): evidence written during a full disk fails loudly in the job, not silently.

The job's progress folder is a real 8 KiB tmpfs, filled before the job starts (the job is held
until then), so every progress write the watchdogs make fails with ENOSPC. By default the job says
so in its output and is ended with exit code 89 once the loss outlasts the grace period; with
`on_evidence_loss = "warn"` it says so and runs to the end. Nothing is drained either way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops
from scout_slurm.slurm.door import run_slurm
from scout_slurm.task import exitcodes

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def _full_tmpfs(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8k,mode=0777", "scout-test-full", str(path)],
        check=True,
    )
    with open(path / "filler", "wb") as fh:
        try:
            fh.write(b"\0" * 65536)
            fh.flush()
            os.fsync(fh.fileno())
        except OSError:
            pass  # ENOSPC: full, as intended


def _unmount(path: Path) -> None:
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", str(path)], check=False)


def _run_held(lab, policy: str, steps: int) -> tuple[int, object, str]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    script = sj.batch_script(
        lab,
        train_args=f"--steps {steps} --step-sleep 0.05",
        pre=f"export SCOUT_WATCHDOG_ON_EVIDENCE_LOSS={policy} "
        "SCOUT_WATCHDOG_EVIDENCE_LOSS_GRACE_S=3 "
        f"SCOUT_WATCHDOG_PUBLISH_INTERVAL_S=0.5",
    )
    job = sj.submit(lab, script, nodes=2, tasks_per_node=1, extra=("--no-requeue", "--hold"))
    progress = sj.folder(lab, job).progress_dir(0)
    try:
        _full_tmpfs(progress)
        run_slurm("scontrol", ["release", str(job)], timeout=10, env=lab.client_env())
        info = sj.wait_completed(lab, job, timeout=150)
    finally:
        _unmount(progress)
        run_slurm("scancel", [str(job)], timeout=10, env=lab.client_env(), check=False)
    return job, info, sj.output(lab, job)


@pytest.mark.timeout(200)
def test_full_evidence_disk_ends_the_job_loudly(lab, clean_drains):
    job, info, out = _run_held(lab, "fail", steps=100000)
    assert info.state == "FAILED" and info.exit_code >> 8 == exitcodes.EVIDENCE_LOST, (
        info,
        out[-3000:],
    )
    assert "SCOUT CANNOT WRITE EVIDENCE" in out and "No space left on device" in out, out[-3000:]
    assert str(sj.folder(lab, job).progress_dir(0)) in out
    assert f"ENDING THE JOB (exit code {exitcodes.EVIDENCE_LOST})" in out, out[-3000:]
    drained = [n.name for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained]
    assert drained == [], drained


@pytest.mark.timeout(200)
def test_full_evidence_disk_with_warn_policy_lets_the_job_finish(lab, clean_drains):
    job, info, out = _run_held(lab, "warn", steps=80)
    assert (info.state, info.exit_code) == ("COMPLETED", 0), (info, out[-3000:])
    assert "SCOUT CANNOT WRITE EVIDENCE" in out and "the job goes on" in out, out[-3000:]
    assert "ENDING THE JOB" not in out
