"""The parsers over the same scenario recorded on each Slurm release (22.05.8, 24.11.5, 26.05.5;
`python -m scout_slurm.lab.record`): a running job, a drained node with a hostile reason, the job
requeued with an exclusion (pending, then running elsewhere), a failed job (exit 3), a cancelled
one.
Expected values come from the scenario itself (scout_slurm/lab/record.py) and its measured.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scout_slurm.errors import SlurmError
from scout_slurm.lab.record import HOSTILE_REASON
from scout_slurm.slurm.parse import (
    parse_sacct_state,
    parse_scontrol_job,
    parse_scontrol_node,
    parse_sinfo_json,
    parse_squeue_json,
)
from scout_slurm.slurm.versions import dialect_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RELEASES = ("22.05", "24.11", "26.05")


def scenario(release: str, name: str) -> str:
    return (FIXTURES / f"slurm-{release}" / "scenario" / name).read_text()


def measured(release: str) -> dict:
    return json.loads(scenario(release, "measured.json"))


def running_job(release: str):
    (job,) = parse_squeue_json(scenario(release, "squeue-running.json"))
    return job


@pytest.fixture(params=RELEASES)
def release(request) -> str:
    return request.param


def test_every_release_has_the_whole_scenario(release):
    names = {p.name for p in (FIXTURES / f"slurm-{release}" / "scenario").iterdir()}
    assert {
        "squeue-running.json",
        "squeue-pending-requeued.json",
        "squeue-requeued-running.json",
        "squeue-all-failed.json",
        "scontrol-job-pending-requeued.txt",
        "scontrol-job-requeued.txt",
        "scontrol-job-failed.txt",
        "scontrol-node-drained.txt",
        "sacct-c.txt",
        "measured.json",
    } <= names


def test_dialect_matches_the_recorded_release(release):
    m = measured(release)
    d = dialect_of(m["sinfo_version"])
    assert ".".join(f"{x:02d}" for x in d.release) == release
    assert d.scontrol_json == m["scontrol_json"]
    assert (d.nodes_json[0] == "scontrol") == m["scontrol_json"]


def test_running_job(release):
    job = running_job(release)
    assert (job.name, job.state, job.restart_count, job.exit_code, job.excluded_nodes) == (
        "rec-running",
        "RUNNING",
        0,
        0,
        (),
    )
    assert len(job.nodes) == 2 and job.batch_host in job.nodes and job.requeue
    (text,) = parse_scontrol_job(scenario(release, "scontrol-job-running.txt"))
    assert (text.job_id, text.state, text.nodes, text.batch_host) == (
        job.job_id,
        "RUNNING",
        job.nodes,
        job.batch_host,
    )


def test_requeued_with_exclusion_pending(release):
    first = running_job(release)
    jobs = {
        j.job_id: j for j in parse_squeue_json(scenario(release, "squeue-pending-requeued.json"))
    }
    job = jobs[first.job_id]
    # just after the requeue the job is still completing: 22.05's squeue --json says only
    # COMPLETING,
    # later releases list the states, PENDING first (["PENDING", "COMPLETING"])
    assert (job.state, job.excluded_nodes, job.restart_count) == (
        "COMPLETING" if release == "22.05" else "PENDING",
        ("n1",),
        1,
    )
    (text,) = parse_scontrol_job(scenario(release, "scontrol-job-pending-requeued.txt"))
    assert (text.state, text.excluded_nodes, text.restart_count) == ("PENDING", ("n1",), 1)


def test_requeued_job_runs_without_the_excluded_node(release):
    first = running_job(release)
    job = {
        j.job_id: j for j in parse_squeue_json(scenario(release, "squeue-requeued-running.json"))
    }[first.job_id]
    assert (job.state, job.excluded_nodes, job.restart_count) == ("RUNNING", ("n1",), 1)
    assert "n1" not in job.nodes and len(job.nodes) == 2
    (text,) = parse_scontrol_job(scenario(release, "scontrol-job-requeued.txt"))
    assert (text.state, text.nodes, text.excluded_nodes, text.restart_count) == (
        "RUNNING",
        job.nodes,
        ("n1",),
        1,
    )


def test_failed_job_exit_status_is_a_wait_status(release):
    """22.05 prints the raw wait status, later releases an object: both read as 3 << 8."""
    jobs = [
        j
        for j in parse_squeue_json(scenario(release, "squeue-all-failed.json"))
        if j.name == "rec-failed"
    ]
    assert [(j.state, j.exit_code) for j in jobs] == [("FAILED", 3 << 8)]
    (text,) = parse_scontrol_job(scenario(release, "scontrol-job-failed.txt"))
    assert (text.job_id, text.state, text.exit_code) == (jobs[0].job_id, "FAILED", 3 << 8)


def test_plain_squeue_json_lists_finished_jobs_only_on_22_05(release):
    listed = {j.name for j in parse_squeue_json(scenario(release, "squeue-failed.json"))}
    assert (
        ("rec-failed" in listed)
        == measured(release)["squeue_json_lists_finished"]
        == (release == "22.05")
    )


def test_drained_node_keeps_the_hostile_reason_exactly(release):
    (node,) = parse_scontrol_node(scenario(release, "scontrol-node-drained.txt"))
    assert (node.name, node.is_drained, node.reason) == ("n3", True, HOSTILE_REASON)
    assert measured(release)["hostile_reason_exact"] is True


def test_node_listing_of_each_release(release):
    """The per-node JSON listing the dialect names: 22.05 sinfo --json, later scontrol show node
    --json.
    """
    listing = "sinfo-drained.json" if release == "22.05" else "scontrol-node-drained.json"
    nodes = {n.name: n for n in parse_sinfo_json(scenario(release, listing))}
    assert nodes["n3"].is_drained and nodes["n3"].reason == HOSTILE_REASON
    if release != "22.05":
        with pytest.raises(SlurmError, match="scontrol show node --json"):
            parse_sinfo_json(scenario(release, "sinfo-drained.json"))


def test_sacct_c_without_slurmdbd(release):
    first = running_job(release)
    failed = next(
        j
        for j in parse_squeue_json(scenario(release, "squeue-all-failed.json"))
        if j.name == "rec-failed"
    )
    text = scenario(release, "sacct-c.txt")
    assert parse_sacct_state(text, first.job_id) == "CANCELLED"
    assert parse_sacct_state(text, failed.job_id) == "FAILED"
    assert (
        measured(release)["sacct_without_slurmdbd"]["stderr"]
        == "Slurm accounting storage is disabled"
    )


def test_excnodelist_update_replaces_on_every_release(release):
    assert measured(release)["excnodelist_second_update_gives"] == ["n2"]


@pytest.mark.parametrize(
    "text, release, nodes_command",
    [
        ("slurm-wlm 22.05.8", (22, 5), "sinfo"),
        ("slurm 23.02.7", (23, 2), "scontrol"),
        ("slurm-wlm 24.11.5", (24, 11), "scontrol"),
        ("slurm 26.05.5\n", (26, 5), "scontrol"),
    ],
)
def test_dialect_of_version_texts(text, release, nodes_command):
    d = dialect_of(text)
    assert (d.release, d.nodes_json[0]) == (release, nodes_command)


def test_dialect_of_garbage_names_the_input():
    with pytest.raises(
        SlurmError, match="cannot read a Slurm release from `sinfo --version`: 'slurm-wlm'"
    ):
        dialect_of("slurm-wlm")


def test_door_refuses_a_root_without_slurm(tmp_path):
    from scout_slurm.errors import SlurmNotInstalled
    from scout_slurm.slurm.door import run_slurm

    with pytest.raises(
        SlurmNotInstalled, match=f"SCOUT_SLURM_ROOT='{tmp_path}' is not a Slurm root"
    ):
        run_slurm("sinfo", ["--version"], timeout=5, env={"SCOUT_SLURM_ROOT": str(tmp_path)})
    with pytest.raises(SlurmNotInstalled, match="is not a Slurm root"):
        run_slurm("sinfo", ["--version"], timeout=5, env={"SCOUT_SLURM_ROOT": "relative/root"})
