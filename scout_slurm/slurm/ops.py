"""Typed operations on Slurm, each one call through the door plus a pure parser."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scout_slurm.errors import SlurmError
from scout_slurm.slurm.door import run_slurm
from scout_slurm.slurm.hostlist import compress_hostlist
from scout_slurm.slurm.parse import (
    JobInfo,
    NodeInfo,
    SlurmSettings,
    format_reason,
    parse_sacct_state,
    parse_scontrol_job,
    parse_scontrol_node,
    parse_show_config,
    parse_sinfo_json,
    parse_squeue_json,
)
from scout_slurm.slurm.versions import dialect

Env = Mapping[str, str] | None


def list_jobs(*, timeout: float, env: Env = None, bin_dir: str = "") -> list[JobInfo]:
    res = run_slurm("squeue", ["--json"], timeout=timeout, env=env, bin_dir=bin_dir)
    return parse_squeue_json(res.stdout)


def job_info(job_id: int, *, timeout: float, env: Env = None, bin_dir: str = "") -> JobInfo:
    """One job by id, from `scontrol show job -o` (works for jobs still in slurmctld's memory)."""
    res = run_slurm(
        "scontrol",
        ["show", "job", "-o", str(int(job_id))],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
    )
    jobs = [j for j in parse_scontrol_job(res.stdout) if j.job_id == int(job_id)]
    if not jobs:
        raise SlurmError(
            f"job {job_id} not found in scontrol output", argv=res.argv, stderr=res.stderr
        )
    return jobs[0]


def job_end_state(job_id: int, *, timeout: float, env: Env = None, bin_dir: str = "") -> str:
    """How a job ended, in Slurm's own word (CANCELLED, TIMEOUT, FAILED, ...), "" if nobody says.

    While the Epilogs run, `scontrol show job` and `squeue --json` both say COMPLETING and hide the
    base state, and the hook's SLURM_JOB_EXIT_CODE of a cancelled job is 0 (measured on 22.05.8).
    The job's completion record is written before the Epilogs, so accounting has it: `sacct` with
    slurmdbd, else `sacct -c` (jobcomp/filetxt). A site with neither: "" (scout acts as it
    would)."""
    info = job_info(job_id, timeout=timeout, env=env, bin_dir=bin_dir)
    if info.is_finished:
        return info.state
    for args in (["-X"], ["-c"]):
        try:
            res = run_slurm(
                "sacct",
                [*args, "-j", str(int(job_id)), "-P", "-n", "-o", "JobID,State"],
                timeout=timeout,
                env=env,
                bin_dir=bin_dir,
            )
        except SlurmError:
            continue  # "Slurm accounting storage is disabled", no jobcomp file: the next source
        state = parse_sacct_state(res.stdout, int(job_id))
        if state:
            return state
    return ""


def job_nodes(
    job_id: int, *, timeout: float, env: Env = None, bin_dir: str = ""
) -> tuple[str, ...]:
    return job_info(job_id, timeout=timeout, env=env, bin_dir=bin_dir).nodes


def list_nodes(*, timeout: float, env: Env = None, bin_dir: str = "") -> list[NodeInfo]:
    """Every node, from the JSON listing this release has (versions.Dialect.nodes_json)."""
    command, args = dialect(env, bin_dir, timeout=timeout).nodes_json
    res = run_slurm(command, list(args), timeout=timeout, env=env, bin_dir=bin_dir)
    return parse_sinfo_json(res.stdout, " ".join((command, *args)))


def node_info(name: str, *, timeout: float, env: Env = None, bin_dir: str = "") -> NodeInfo:
    _check_node_name(name)
    res = run_slurm(
        "scontrol", ["show", "node", "-o", name], timeout=timeout, env=env, bin_dir=bin_dir
    )
    nodes = [n for n in parse_scontrol_node(res.stdout) if n.name == name]
    if not nodes:
        raise SlurmError(f"node {name!r} not found", argv=res.argv, stderr=res.stderr)
    return nodes[0]


_NODE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def _check_node_name(name: str) -> None:
    # ASCII only: str.isalnum() would also accept other scripts' letters and digits (e.g. "n\u0661")
    if not name or len(name) > 255 or not all(c in _NODE_NAME_CHARS for c in name):
        raise SlurmError(
            f"refusing node name {name!r}: only ASCII letters, digits, '.', '_' and '-' are valid "
            f"(at most 255 characters)"
        )


def drain_node(
    name: str, reason: str, *, timeout: float, env: Env = None, bin_dir: str = ""
) -> None:
    _check_node_name(name)
    run_slurm(
        "scontrol",
        ["update", f"nodename={name}", "state=drain", f"reason={format_reason(reason)}"],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
    )


def resume_node(name: str, *, timeout: float, env: Env = None, bin_dir: str = "") -> None:
    _check_node_name(name)
    run_slurm(
        "scontrol",
        ["update", f"nodename={name}", "state=resume"],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
    )


def requeue_job(job_id: int, *, timeout: float, env: Env = None, bin_dir: str = "") -> None:
    run_slurm("scontrol", ["requeue", str(int(job_id))], timeout=timeout, env=env, bin_dir=bin_dir)


def merged_exclusion(current: Sequence[str], add: Sequence[str]) -> str:
    """`excnodelist=` replaces the list: merge what the job already excludes with the new nodes
    (pure).
    """
    for n in add:
        _check_node_name(n)
    return compress_hostlist(list(dict.fromkeys([*current, *add])))


def exclude_nodes(
    job_id: int, nodes: Sequence[str], *, timeout: float, env: Env = None, bin_dir: str = ""
) -> str:
    """Add nodes to a job's excluded list, merged with what it already excludes; returns the new
    list.
    """
    current = job_info(job_id, timeout=timeout, env=env, bin_dir=bin_dir).excluded_nodes
    merged = merged_exclusion(current, nodes)
    run_slurm(
        "scontrol",
        ["update", f"jobid={int(job_id)}", f"excnodelist={merged}"],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
    )
    return merged


def set_job_comment(
    job_id: int, comment: str, *, timeout: float, env: Env = None, bin_dir: str = ""
) -> None:
    run_slurm(
        "scontrol",
        ["update", f"jobid={int(job_id)}", f"comment={format_reason(comment)}"],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
    )


def cancel_job(
    job_id: int, *, timeout: float, env: Env = None, bin_dir: str = "", user: str = ""
) -> None:
    """`scancel JOB`, as `user` when given (the job's owner cancelling it), else as this process."""
    run_slurm(
        "scancel", [str(int(job_id))], timeout=timeout, env=env, bin_dir=bin_dir, as_user=user
    )


def submit_batch(
    script: str,
    args: Sequence[str] = (),
    *,
    timeout: float,
    env: Env = None,
    bin_dir: str = "",
    user: str = "",
) -> int:
    """Submit a batch script given as text; returns the job id (`sbatch --parsable`). With `user`
    (root only) the job is that user's, submitted with its own credentials."""
    res = run_slurm(
        "sbatch",
        ["--parsable", *args],
        timeout=timeout,
        env=env,
        bin_dir=bin_dir,
        input_text=script,
        as_user=user,
    )
    try:
        return int(res.stdout.strip().split(";")[0])
    except ValueError:
        raise SlurmError(
            "sbatch printed no job id", argv=res.argv, stderr=res.stdout + res.stderr
        ) from None


def show_config(*, timeout: float, env: Env = None, bin_dir: str = "") -> SlurmSettings:
    """slurm.conf as the controller holds it (`scontrol show config`)."""
    return parse_show_config(
        run_slurm("scontrol", ["show", "config"], timeout=timeout, env=env, bin_dir=bin_dir).stdout
    )
