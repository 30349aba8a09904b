"""Helpers for tests that run training jobs under scout-srun on the lab cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    ExitRecord,
    Finding,
    RankPlace,
    StallDecision,
    Verdict,
)
from scout_slurm.evidence.store import list_records, read_record
from scout_slurm.lab.cluster import CLUSTER_NAME, Lab
from scout_slurm.remediation.records import ActionsRecord
from scout_slurm.slurm import ops

TRAIN = Path(__file__).resolve().parent / "jobs" / "train_ddp.py"


def batch_script(
    lab: Lab,
    *,
    train_args: str = "--steps 40",
    scout_args: str = "",
    srun_args: str = "",
    pre: str = "",
    post: str = "",
    train: Path = TRAIN,
) -> str:
    return f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={os.path.dirname(sys.executable)}:$PATH
echo "run ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST"
{pre}
scout-srun {scout_args} {srun_args} {sys.executable} {train} {train_args}
rc=$?
{post}
exit $rc
"""


def submit(
    lab: Lab,
    script: str,
    *,
    nodes: int = 2,
    tasks_per_node: int = 2,
    extra: tuple[str, ...] = (),
    user: str | None = None,
) -> int:
    """Submit as a site's user would: as the lab's unprivileged job user (`user` picks another of
    the lab's users; "" submits as root), from the lab's shared work folder."""
    out = lab.paths.work / "job-%j.out"
    user = lab.job_user if user is None else user
    return ops.submit_batch(
        script,
        [
            f"-N{nodes}",
            f"--ntasks-per-node={tasks_per_node}",
            "--open-mode=append",
            f"--output={out}",
            f"--chdir={lab.paths.work}",
            *extra,
        ],
        timeout=20,
        env=lab.client_env(),
        user=user,
    )


def output(lab: Lab, job_id: int) -> str:
    p = lab.paths.work / f"job-{job_id}.out"
    return p.read_text(errors="replace") if p.exists() else ""


def folder(lab: Lab, job_id: int) -> JobFolder:
    return JobFolder(lab.paths.evidence, CLUSTER_NAME, job_id)


def wait_finished(lab: Lab, job_id: int, *, restart: int = 0, timeout: float = 180) -> None:
    """Until the job's run `restart` ended and the controller Epilog has written its verdict."""
    env = lab.client_env()
    f = folder(lab, job_id)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = ops.job_info(job_id, timeout=10, env=env)
        if f.verdict_path(restart).exists() and (
            job.is_finished or job.restart_count > restart or job.state == "PENDING"
        ):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"job {job_id} run {restart} did not finish within {timeout} "
        f"s:\n{output(lab, job_id)[-3000:]}"
    )


def wait_completed(lab: Lab, job_id: int, *, timeout: float = 240):
    env = lab.client_env()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = ops.job_info(job_id, timeout=10, env=env)
        if job.is_finished:
            return job
        time.sleep(0.5)
    raise AssertionError(
        f"job {job_id} did not finish within {timeout} s:\n{output(lab, job_id)[-3000:]}"
    )


def show_json(lab: Lab, job_id: int, restart: int | None = None) -> dict:
    cmd = [sys.executable, "-m", "scout_slurm.cli", "show", str(job_id), "--json"]
    if restart is not None:
        cmd += ["--restart", str(restart)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=lab.client_env(), timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def places(lab: Lab, job_id: int, restart: int = 0) -> dict[int, RankPlace]:
    f = folder(lab, job_id)
    records, errors = list_records(f.ranks_dir(restart), "rank-*.json", RankPlace, root=f.root)
    assert not errors, errors
    return {p.rank: p for p in records}


def exits(lab: Lab, job_id: int, restart: int = 0) -> dict[int, ExitRecord]:
    f = folder(lab, job_id)
    records, errors = list_records(f.ranks_dir(restart), "exit-*.json", ExitRecord, root=f.root)
    assert not errors, errors
    return {e.rank: e for e in records}


def injected_at(lab: Lab, job_id: int, restart: int = 0) -> float:
    f = folder(lab, job_id)
    records, _ = list_records(f.findings_dir(restart), "injected-*.json", Finding, root=f.root)
    return min(r.at for r in records) if records else 0.0


def decision(lab: Lab, job_id: int, restart: int = 0) -> StallDecision | None:
    f = folder(lab, job_id)
    p = f.stall_decision_path(restart)
    return read_record(p, StallDecision, root=f.root) if p.exists() else None


def verdict(lab: Lab, job_id: int, restart: int = 0) -> Verdict:
    f = folder(lab, job_id)
    return read_record(f.verdict_path(restart), Verdict, root=f.root)


def actions(lab: Lab, job_id: int, restart: int = 0) -> ActionsRecord | None:
    f = folder(lab, job_id)
    p = f.actions_path(restart)
    return read_record(p, ActionsRecord, root=f.root) if p.exists() else None


def wait_progress(lab: Lab, job_id: int, rank: int, *, steps: int, timeout: float = 120) -> None:
    import json as _json

    p = folder(lab, job_id).progress_path(0, rank)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if _json.loads(p.read_text()).get("opt_steps", 0) >= steps:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(
        f"rank {rank} of job {job_id} never reached step {steps}:\n{output(lab, job_id)[-3000:]}"
    )


def resume_scout_drains(lab: Lab) -> list[str]:
    """Return every node scout drained to service (test clean-up)."""
    env = lab.client_env()
    resumed = []
    for n in ops.list_nodes(timeout=10, env=env):
        if n.is_drained and n.reason.startswith("scout:"):
            ops.resume_node(n.name, timeout=10, env=env)
            resumed.append(n.name)
    deadline = time.monotonic() + 10
    while resumed and time.monotonic() < deadline:
        if all(not n.is_drained for n in ops.list_nodes(timeout=10, env=env) if n.name in resumed):
            break
        time.sleep(0.2)
    return resumed


def node_of_rank(job_nodes: tuple[str, ...], rank: int, tasks_per_node: int = 2) -> str:
    return sorted(job_nodes, key=lambda n: int(n.lstrip("n")))[rank // tasks_per_node]


PLANT = r"""
python3 - <<'PY'
import os, time
from pathlib import Path
from scout_slurm.evidence.store import write_record
from scout_slurm.remediation.records import CheckpointNote
ck = Path(os.environ["EVIDENCE"]) / "checkpoints"
work = Path(os.environ["PLANT_DIR"])
fifo = work / "ckpt.fifo"
os.mkfifo(fifo)
sparse = work / "ckpt.sparse"
with open(sparse, "wb") as fh:
    fh.truncate(1 << 30)
plants = [("/proc/kmsg", 0, "0" * 64), (str(fifo), 0, "0" * 64),
          ("/etc/shadow", int(os.environ["SHADOW_SIZE"]), os.environ["SHADOW_SHA"]),
          (os.environ["OTHER"], int(os.environ["OTHER_SIZE"]), os.environ["OTHER_SHA"])]
plants += [(str(sparse), 1 << 30, "0" * 64)] * 12
for i, (path, size, sha) in enumerate(plants):
    write_record(ck / f"planted-{i}.json",
                 CheckpointNote(path=path, step=1 + i % 3, rank=0, restart=0,
                                saved_at=time.time() - 100 + i, size_bytes=size, sha256=sha,
                                agreement="agreed"))
print("planted", len(plants), "checkpoint records")
PY
"""


def hostile_checkpoints(lab: Lab, tag: str) -> tuple[str, tuple[str, ...]]:
    """A batch script's `pre` exports and `post` snippet that plant checkpoint records naming
    /proc/kmsg, a FIFO, /etc/shadow (with its real digest, computed here as root), another user's
    0600 file (its real digest too) and twelve times one 1 GiB sparse file; and those paths."""
    import hashlib
    import pwd

    plant_dir = lab.paths.work / f"plant-{tag}-{time.time_ns()}"
    plant_dir.mkdir(mode=0o777)
    os.chmod(plant_dir, 0o777)
    shadow = Path("/etc/shadow").read_bytes()
    other = lab.paths.work / f"other-{tag}-{time.time_ns()}.pt"
    other.write_bytes(b"another user's secret weights")
    users = lab.users.get("job_users") or []
    if len(users) > 1:
        os.chown(other, pwd.getpwnam(users[1]).pw_uid, pwd.getpwnam(users[1]).pw_gid)
    os.chmod(other, 0o600)
    pre = (
        f"export EVIDENCE={lab.paths.evidence}/scoutlab/$SLURM_JOB_ID PLANT_DIR={plant_dir} "
        f"SHADOW_SIZE={len(shadow)} SHADOW_SHA={hashlib.sha256(shadow).hexdigest()} "
        f"OTHER={other} OTHER_SIZE={other.stat().st_size} "
        f"OTHER_SHA={hashlib.sha256(other.read_bytes()).hexdigest()}"
    )
    paths = (
        "/proc/kmsg",
        str(plant_dir / "ckpt.fifo"),
        "/etc/shadow",
        str(other),
        str(plant_dir / "ckpt.sparse"),
    )
    return pre, paths


def drained_nodes(lab: Lab) -> dict[str, str]:
    return {
        n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained
    }


def closed_loop(lab: Lab, inject: str, rank: int, kind: str) -> tuple[int, Path]:
    """The closed loop (tests/slurm/test_loop.py, and on each Slurm release in
    test_lab_versions.py):
    a 2x2 job with `inject`, its verdict names `rank` on its node, the node is drained, the job
    requeued without it and resumed from step 20; `scout show` tells it. Returns (job, final
    file)."""
    ckpt = lab.paths.work / f"ckpt-{kind}-{time.time_ns()}"
    final = lab.paths.work / f"final-{kind}-{time.time_ns()}.txt"
    script = batch_script(
        lab,
        train_args=f"--steps 40 --ckpt-dir {ckpt} --ckpt-every 10 --momentum 0.9 --out {final}",
        scout_args=f"--scout-stall-floor=4 --scout-inject={inject}",
    )
    job = submit(lab, script)
    wait_finished(lab, job, restart=0)
    v0 = show_json(lab, job, restart=0)
    node = places(lab, job, 0)[rank].node
    assert v0["kind"] == kind and [(s["rank"], s["node"]) for s in v0["suspects"]] == [
        (rank, node)
    ], v0
    drained = drained_nodes(lab)
    assert node in drained and drained[node].startswith(
        f"scout: {kind} rank {rank} job {job} run 0"
    ), drained
    assert list(drained) == [node]
    info = wait_completed(lab, job)
    # a message in full: pytest cuts the repr of a tuple to a line
    if not (info.state == "COMPLETED" and info.restart_count == 1):
        time.sleep(
            3
        )  # the controller Epilog's verdict on the rerun, if it wrote one, says why it failed
        vpath = folder(lab, job).verdict_path(1)
        why = show_json(lab, job, restart=1) if vpath.exists() else "no verdict for run 1"
        raise AssertionError(f"{info}\nrun 1: {why}\n{output(lab, job)[-6000:]}")
    assert node in info.excluded_nodes
    run1 = places(lab, job, 1)
    assert len(run1) == 4 and node not in {p.node for p in run1.values()}
    out = output(lab, job)
    assert out.count(f"resumed from {ckpt}/step-20.pt at step 20") == 4, out[-3000:]
    assert "rank 0: done" in out
    acts = actions(lab, job, 0)
    assert acts.status.value == "applied"
    assert [a.kind.value for a in acts.actions] == ["drain", "requeue", "exclude", "resume_from"]
    # scout show tells the story of the failed run: verdict, suspects, actions
    text = subprocess.run(
        [sys.executable, "-m", "scout_slurm.cli", "show", str(job), "--restart", "0"],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    ).stdout
    assert f"rank {rank} on node {node}: {kind}" in text and f"[done] drain node {node}" in text
    assert f"[done] requeue job {job}" in text and "step-20.pt" in text
    assert show_json(lab, job, restart=1)["kind"] == "clean"
    failed_at = verdict(lab, job, 0).first_failure_at
    rerun_at = min(p.started_at for p in run1.values())
    print(f"\nLOOP {kind}: failure -> rerun started on other nodes in {rerun_at - failed_at:.1f} s")
    return job, final


def hook_nodes(lab: Lab, job_id: int) -> dict[str, set[str]]:
    """Where each hook ran for `job_id`, from the logs: "site-prolog"/"site-epilog" (the lab's
    stand-in for a site's own programs, beside scout's) and scout's hook modules (the lab's
    wrappers log each run's wall time: `lab.hook_time`)."""
    from scout_slurm.lab.cluster import SITE_HOOK_LOG

    ran: dict[str, set[str]] = {}
    site = lab.paths.logs / SITE_HOOK_LOG
    for line in site.read_text(errors="replace").splitlines() if site.exists() else ():
        kind, _, rest = line.partition(" ")
        fields = dict(f.split("=", 1) for f in rest.split() if "=" in f)
        if fields.get("job") == str(job_id):
            ran.setdefault(f"site-{kind}", set()).add(fields.get("node", ""))
    log = lab.paths.logs / "hooks.log"
    for line in log.read_text(errors="replace").splitlines() if log.exists() else ():
        if '"lab.hook_time"' not in line:
            continue
        rec = json.loads(line)
        if rec.get("job") == str(job_id):
            ran.setdefault(rec["hook"], set()).add(rec["node"])
    return ran
