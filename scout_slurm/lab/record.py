"""Record what one Slurm release really prints, on a real lab of that release, into a fixtures
folder
(tests/fixtures/slurm-<release>/scenario/), plus what was measured about it (`measured.json`): hook
environments, requeue and ExcNodeList behaviour, drain-reason limits, `scontrol --json`, `sacct`
without slurmdbd, `sinfo --version`.

    python -m scout_slurm.lab.record --slurm 24.11 tests/fixtures/slurm-24.11/scenario
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from scout_slurm.lab.cluster import Lab, LabSpec, free_port_base
from scout_slurm.slurm import ops
from scout_slurm.slurm.door import run_slurm
from scout_slurm.slurm.parse import parse_squeue_json

# quotes, shell syntax, a format directive, a non-ASCII letter: read back exactly or not at all
HOSTILE_REASON = "scout: rank 2 \"crash\" $(touch /tmp/x); `id` | %s & 'q' ünï <b>x</b>"
_ENV_HOOK = (
    "#!/bin/sh\nenv > {work}/env-{name}-${{SLURMD_NODENAME:-ctld}}-$SLURM_JOB_ID "
    "2>/dev/null\nexit 0\n"
)


class Recorder:
    def __init__(self, lab: Lab, out: Path) -> None:
        self.lab, self.out, self.env = lab, out, lab.client_env()
        self.measured: dict = {}

    def run(self, command: str, *args: str, check: bool = False):
        return run_slurm(command, list(args), timeout=30, env=self.env, check=check)

    def save(self, name: str, command: str, *args: str) -> str:
        res = self.run(command, *args)
        text = (
            res.stdout
            if res.returncode == 0
            else f"# exit {res.returncode}\n{res.stdout}{res.stderr}"
        )
        (self.out / name).write_text(text)
        return text

    def submit(self, script: str, *args: str) -> int:
        return ops.submit_batch(
            script,
            ["--chdir", str(self.lab.paths.work), "-o", "/dev/null", *args],
            timeout=30,
            env=self.env,
        )

    def wait_state(self, job: int, states: set[str], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            state = ops.job_info(job, timeout=30, env=self.env).state
            if state in states:
                return state
            time.sleep(0.3)
        raise RuntimeError(f"job {job} is {state}, not {states}, after {timeout} s")


def record(version: str, out: Path, state_dir: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    lab = Lab(
        LabSpec(
            state_dir=state_dir,
            nodes=3,
            port_base=free_port_base(5),
            python=sys.executable,
            slurm=version,
            site_users=False,
        )
    )
    try:
        lab.up()
        for name in ("prolog", "epilog", "epilog-slurmctld"):
            (lab.paths.hooks / name).write_text(_ENV_HOOK.format(work=lab.paths.work, name=name))
        return _scenario(Recorder(lab, out))
    finally:
        lab.down()


def _scenario(r: Recorder) -> dict:
    m = r.measured
    m["sinfo_version"] = r.run("sinfo", "--version").stdout.strip()
    job = r.submit("#!/bin/sh\nsleep 300\n", "-N2", "--job-name=rec-running")
    r.wait_state(job, {"RUNNING"})
    time.sleep(1.5)
    r.save("squeue-running.json", "squeue", "--json")
    r.save("scontrol-job-running.txt", "scontrol", "show", "job", "-o", str(job))
    r.save("scontrol-node-allocated.txt", "scontrol", "show", "node", "-o", "n1")
    r.save("sinfo-allocated.json", "sinfo", "--json")
    json_job = r.run("scontrol", "show", "job", "--json", str(job))
    m["scontrol_json"] = json_job.returncode == 0 and json_job.stdout.lstrip().startswith("{")
    if m["scontrol_json"]:
        (r.out / "scontrol-job-running.json").write_text(json_job.stdout)
    # a hostile drain reason, and the longest one Slurm keeps
    ops.drain_node("n3", HOSTILE_REASON, timeout=30, env=r.env)
    r.save("scontrol-node-drained.txt", "scontrol", "show", "node", "-o", "n3")
    r.save("sinfo-drained.json", "sinfo", "--json")
    if m["scontrol_json"]:
        r.save("scontrol-node-drained.json", "scontrol", "show", "node", "--json", "n3")
    m["hostile_reason_read_back"] = ops.node_info("n3", timeout=30, env=r.env).reason
    m["hostile_reason_exact"] = m["hostile_reason_read_back"] == HOSTILE_REASON
    long_reason = "r" * 5000
    res = r.run("scontrol", "update", "nodename=n3", "state=drain", f"reason={long_reason}")
    m["reason_5000_exit"] = res.returncode
    m["reason_5000_kept_chars"] = len(ops.node_info("n3", timeout=30, env=r.env).reason)
    ops.resume_node("n3", timeout=30, env=r.env)
    # requeue with exclusions: requeue first, then the exclusion; a second update replaces or
    # merges?
    ops.drain_node("n1", HOSTILE_REASON, timeout=30, env=r.env)
    ops.requeue_job(job, timeout=30, env=r.env)
    r.run("scontrol", "update", f"jobid={job}", "excnodelist=n1", check=True)
    r.save("squeue-pending-requeued.json", "squeue", "--json")
    r.save("scontrol-job-pending-requeued.txt", "scontrol", "show", "job", "-o", str(job))
    r.run("scontrol", "update", f"jobid={job}", "excnodelist=n2", check=True)
    m["excnodelist_second_update_gives"] = list(
        ops.job_info(job, timeout=30, env=r.env).excluded_nodes
    )
    r.run("scontrol", "update", f"jobid={job}", "excnodelist=n1", check=True)
    m["requeued_restart_count"] = ops.job_info(job, timeout=30, env=r.env).restart_count
    m["requeued_reason"] = ops.job_info(job, timeout=30, env=r.env).reason
    r.wait_state(job, {"RUNNING"}, timeout=60)
    time.sleep(1)
    r.save("squeue-requeued-running.json", "squeue", "--json")
    r.save("scontrol-job-requeued.txt", "scontrol", "show", "job", "-o", str(job))
    ops.resume_node("n1", timeout=30, env=r.env)
    ops.cancel_job(job, timeout=30, env=r.env)
    failed = r.submit("#!/bin/sh\nexit 3\n", "-N1", "--job-name=rec-failed")
    r.wait_state(failed, {"FAILED"})
    r.wait_state(job, {"CANCELLED"})
    time.sleep(2)  # the epilogs of both
    listed = parse_squeue_json(r.save("squeue-failed.json", "squeue", "--json"))
    m["squeue_json_lists_finished"] = failed in {j.job_id for j in listed}
    r.save("squeue-all-failed.json", "squeue", "--json", "--states=all")
    r.save("scontrol-job-failed.txt", "scontrol", "show", "job", "-o", str(failed))
    r.save("scontrol-job-cancelled.txt", "scontrol", "show", "job", "-o", str(job))
    r.save("sacct-c.txt", "sacct", "-c", "-P", "-n", "-o", "JobID,State", "-j", f"{job},{failed}")
    res = r.run("sacct", "-X", "-P", "-n", "-o", "JobID,State", "-j", str(failed))
    m["sacct_without_slurmdbd"] = {
        "exit": res.returncode,
        "stdout": res.stdout.strip()[:300],
        "stderr": res.stderr.strip()[:300],
    }
    update_finished = r.run("scontrol", "update", f"jobid={failed}", "excnodelist=n2")
    m["update_finished_job"] = {
        "exit": update_finished.returncode,
        "stderr": update_finished.stderr.strip()[:300],
    }
    m["hook_env"] = _hook_envs(r.lab.paths.work)
    m["prolog_ran_on"] = sorted(
        {f.name.split("-")[2] for f in r.lab.paths.work.glob("env-prolog-*")}
    )
    (r.out / "measured.json").write_text(json.dumps(m, indent=1, sort_keys=True) + "\n")
    return m


def _hook_envs(work: Path) -> dict[str, list[str]]:
    """Which variables each hook got (names only: values hold paths and times of this run)."""
    out: dict[str, list[str]] = {}
    for name in ("prolog", "epilog", "epilog-slurmctld"):
        names: set[str] = set()
        for f in work.glob(f"env-{name}-*"):
            names.update(
                line.split("=", 1)[0]
                for line in f.read_text(errors="replace").splitlines()
                if "=" in line
            )
        out[name] = sorted(names)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slurm", default="", help="release (24.11, 26.05); default: the host's")
    ap.add_argument("--state-dir", type=Path, default=Path("/tmp/scout-record-lab"))
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    print(json.dumps(record(args.slurm, args.out, args.state_dir), indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
