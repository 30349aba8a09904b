"""`scout demo`: the main job end to end on the local lab cluster: a DDP training job under
scout-srun, a fault injected into one rank, the verdict, the drain, the requeue without the
node, the resumed run from the checkpoint, and `scout show`."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scout_slurm.errors import ScoutError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Verdict
from scout_slurm.evidence.store import read_record
from scout_slurm.lab.cluster import CLUSTER_NAME, Lab, LabSpec
from scout_slurm.slurm import ops

TRAIN = Path(__file__).resolve().parent / "train_demo.py"

FAULTS = {
    "crash": "exit,rank=2,step=25,code=3",
    "hang": "sleep,rank=2,step=25",
    "segfault": "segv,rank=2,step=25",
    "sigstop": "stop,rank=2,step=25",
}


def _script(lab: Lab, inject: str, ckpt_dir: Path, stall_floor: float) -> str:
    py = sys.executable
    return f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={Path(py).parent}:$PATH
echo "== run ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID on nodes $SLURM_JOB_NODELIST"
scout-srun --scout-stall-floor={stall_floor} --scout-inject={inject} {py} {TRAIN} --steps 60 \\
    --ckpt-dir {ckpt_dir} --ckpt-every 10
"""


def run_demo(
    *,
    state_dir: Path,
    fault: str,
    keep: bool,
    echo: Callable[[str], None],
    nodes: int = 4,
    port_base: int = 16800,
    stall_floor: float = 5.0,
    slurm: str = "",
) -> int:
    if fault not in FAULTS:
        raise ScoutError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")
    lab = Lab(
        LabSpec(
            state_dir=state_dir,
            nodes=nodes,
            port_base=port_base,
            python=sys.executable,
            slurm=slurm,
        )
    )
    echo(
        f"[1/6] starting a {nodes}-node Slurm cluster in {state_dir} (slurmctld, {nodes} "
        "slurmd, munge) ..."
    )
    lab.up()
    echo(
        f"      {lab.slurm_version()}"
        + (f", run from the root {lab.paths.rootfs}" if slurm else "")
    )
    users = lab.users
    echo(
        f"      slurmctld runs as {users['slurm_user']}, the job as {lab.job_user or 'root'}"
        + (f" ({users['why_root']})" if users["why_root"] else "; slurmd as root, as at a site")
    )
    env = lab.client_env()
    try:
        ckpt = lab.paths.work / f"demo-ckpt-{int(time.time())}"
        out = lab.paths.work / "demo-%j.out"
        job = ops.submit_batch(
            _script(lab, FAULTS[fault], ckpt, stall_floor),
            [
                "-N2",
                "--ntasks-per-node=2",
                "--open-mode=append",
                f"--output={out}",
                "--job-name=scout-demo",
                f"--chdir={lab.paths.work}",
            ],
            timeout=20,
            env=env,
            user=lab.job_user,
        )
        echo(
            f"[2/6] submitted job {job}: 2 nodes x 2 ranks of DDP training under scout-srun; "
            f"fault '{fault}' ({FAULTS[fault]}) on rank 2 at step 25 of the first run"
        )
        folder = JobFolder(lab.paths.evidence, CLUSTER_NAME, job)
        t0 = time.monotonic()
        first_nodes: tuple[str, ...] = ()
        while not folder.verdict_path(0).exists():
            info = ops.job_info(job, timeout=10, env=env)
            first_nodes = info.nodes or first_nodes
            if info.is_finished and time.monotonic() - t0 > 120:
                raise ScoutError(
                    f"job {job} ended without a verdict; see {lab.paths.logs}/hooks.log"
                )
            if time.monotonic() - t0 > 300:
                raise ScoutError(f"no verdict for job {job} after 300 s; see {lab.paths.logs}")
            time.sleep(0.5)
        verdict = read_record(folder.verdict_path(0), Verdict, root=folder.root)
        echo(
            f"[3/6] verdict after {time.monotonic() - t0:.1f} s: {verdict.kind.value}, suspects "
            + ", ".join(f"rank {s.rank} on node {s.node}" for s in verdict.suspects)
        )
        drained = [n for n in ops.list_nodes(timeout=10, env=env) if n.is_drained]
        for n in drained:
            echo(f"[4/6] node {n.name} drained: {n.reason}")
        while True:
            info = ops.job_info(job, timeout=10, env=env)
            if info.is_finished and info.restart_count >= 1:
                break
            if time.monotonic() - t0 > 600:
                raise ScoutError(f"job {job} did not finish its rerun within 600 s")
            time.sleep(0.5)
        echo(
            f"[5/6] job {job} was requeued (restart {info.restart_count}), excluded "
            f"{','.join(info.excluded_nodes)}, "
            f"reran on {','.join(info.nodes) or '?'} (first run was on "
            f"{','.join(first_nodes)}), final state "
            f"{info.state}"
        )
        log = Path(str(out).replace("%j", str(job))).read_text(errors="replace")
        for line in log.splitlines():
            if (
                line.startswith("==")
                or "resumed from" in line
                or line.startswith("rank 0: done")
                or line.startswith("step 60")
            ):
                echo(f"      {line}")
        echo("[6/6] scout show for the failed run:")
        shown = subprocess.run(
            [sys.executable, "-m", "scout_slurm.cli", "show", str(job), "--restart", "0"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        echo(shown.stdout.rstrip())
        ok = info.state == "COMPLETED" and info.restart_count >= 1 and bool(verdict.suspects)
        echo(
            f"\nDEMO {'PASSED' if ok else 'FAILED'}: fault on rank 2 -> verdict "
            f"{verdict.kind.value} -> drain "
            f"{','.join(n.name for n in drained) or 'none'} -> requeue -> resumed run "
            f"{info.state.lower()}"
        )
        for n in drained:
            ops.resume_node(n.name, timeout=10, env=env)
        return 0 if ok else 1
    finally:
        if keep:
            echo(
                "lab left running: export " + " ".join(f"{k}={v}" for k, v in lab.exports().items())
            )
        else:
            lab.down()
            echo("lab stopped")
