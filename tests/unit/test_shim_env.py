"""The shim's pure helpers: the rendezvous port of a job step, and the torch variables it sets
(never overriding what the user set)."""

from __future__ import annotations

import pytest

from scout_slurm.jobenv import task_context
from scout_slurm.task.shim import master_port, parse_args, torch_environment

ENV = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "3",
    "SLURM_PROCID": "5",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURMD_NODENAME": "node03",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
}


@pytest.mark.parametrize("first_job", [1, 1999, 2000, 123_456, 9_999_001])
def test_master_port_distinct_for_2000_consecutive_jobs_of_8_steps(first_job):
    ports = [master_port(j, s) for j in range(first_job, first_job + 2000) for s in range(8)]
    assert len(set(ports)) == len(ports) == 16_000
    assert min(ports) >= 10_000 and max(ports) <= 25_999


def test_master_port_is_stable_and_in_range_for_any_ids():
    assert master_port(4711, 3) == master_port(4711, 3)
    for job in (0, 1, 65_535, 2**31 - 1, 2**40):
        for step in (0, 7, 8, 4294967294, 4294967295):  # batch and extern step ids are huge
            assert 10_000 <= master_port(job, step) <= 25_999


def test_torch_environment_from_slurm():
    ctx = task_context(ENV)
    env = torch_environment(ctx, ENV, master_addr="10.0.0.1")
    assert env == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": str(master_port(4711, 3)),
    }


def test_torch_environment_keeps_variables_already_set():
    ctx = task_context(ENV)
    user = {**ENV, "MASTER_PORT": "29500", "MASTER_ADDR": "head", "LOCAL_WORLD_SIZE": "4"}
    env = torch_environment(ctx, user, master_addr="10.0.0.1")
    assert "MASTER_PORT" not in env and "MASTER_ADDR" not in env and "LOCAL_WORLD_SIZE" not in env
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8" and env["LOCAL_RANK"] == "1"


def test_torch_environment_sets_a_variable_that_is_empty():
    ctx = task_context(ENV)
    env = torch_environment(ctx, {**ENV, "MASTER_ADDR": ""}, master_addr="10.0.0.1")
    assert env["MASTER_ADDR"] == "10.0.0.1"


def test_torch_environment_does_not_change_its_input():
    ctx = task_context(ENV)
    environ = dict(ENV)
    torch_environment(ctx, environ, master_addr="10.0.0.1")
    assert environ == ENV


@pytest.mark.parametrize(
    "argv,command",
    [
        (["--", "python", "train.py"], ["python", "train.py"]),
        (["python", "-u", "train.py"], ["python", "-u", "train.py"]),
        (["--", "tool", "--", "x"], ["tool", "--", "x"]),
    ],
)
def test_parse_args(argv, command):
    assert parse_args(argv) == command


def test_unprepared_says_why_the_site_will_not_see_the_job(tmp_path):
    """The shim's start-up check (issue: a job whose SCOUT_CONFIG points elsewhere writes where the
    site's hooks never look): only a root-owned job folder with nodes/ and this run's folder
    counts."""
    import os

    from scout_slurm.evidence.layout import JobFolder
    from scout_slurm.task.shim import unprepared

    f = JobFolder(tmp_path / "root", "c", 7)
    assert "does not exist on this node" in unprepared(f, 0)
    f.root.mkdir()
    assert "no Prolog laid out" in unprepared(f, 0)
    f.path.mkdir(parents=True)
    assert "did not lay out" in unprepared(f, 0)
    f.nodes_dir.mkdir()
    f.run_dir(0).mkdir()
    assert unprepared(f, 0) == ""
    assert "did not lay out" in unprepared(f, 1)  # a requeued run the Prolog did not see
    os.chown(f.path, 1001, 1001)  # a job made it itself
    assert "not a root-owned folder" in unprepared(f, 0)


def test_scout_srun_draws_the_steps_port_at_random_and_skips_a_taken_one():
    import random

    from scout_slurm.launcher.srun import pick_master_port

    taken = set()
    a = pick_master_port(random.Random(1), lambda p: p not in taken)
    b = pick_master_port(random.Random(2), lambda p: p not in taken)
    assert a != b and all(10_000 <= p <= 25_999 for p in (a, b))
    taken.add(pick_master_port(random.Random(3), lambda p: True))
    assert pick_master_port(random.Random(3), lambda p: p not in taken) not in taken


def test_a_port_slurm_reserved_for_the_step_wins_over_the_job_ids():
    from scout_slurm.task.shim import reserved_port

    assert reserved_port({"SLURM_STEP_RESV_PORTS": "12000-12003"}) == 12000
    assert reserved_port({"SLURM_STEP_RESV_PORTS": "12007,12009"}) == 12007
    assert reserved_port({"SLURM_STEP_RESV_PORTS": ""}) is None
    assert reserved_port({"SLURM_STEP_RESV_PORTS": "x"}) is None
    assert reserved_port({}) is None
