"""Slurm's environment read from plain dicts: typed contexts, and errors that name the variable."""

from __future__ import annotations

import pytest

from scout_slurm.errors import ConfigError
from scout_slurm.jobenv import expand_tasks_per_node, hook_context, task_context

TASK_ENV = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "2",
    "SLURM_PROCID": "5",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURMD_NODENAME": "node03",
    "SLURM_STEP_NODELIST": "node[01-04]",
    "SLURM_STEP_TASKS_PER_NODE": "2(x4)",
    "SLURM_CLUSTER_NAME": "lab",
    "SLURM_RESTART_COUNT": "1",
    "CUDA_VISIBLE_DEVICES": "1",
    "HOME": "/home/u",
}


def test_task_context_from_a_plain_dict():
    ctx = task_context(TASK_ENV)
    assert (ctx.job_id, ctx.step_id, ctx.rank, ctx.world_size, ctx.local_rank, ctx.node_index) == (
        4711,
        2,
        5,
        8,
        1,
        2,
    )
    assert ctx.node == "node03" and ctx.step_nodelist == "node[01-04]" and ctx.cluster == "lab"
    assert ctx.restart == 1 and ctx.cuda_visible_devices == "1"
    assert ctx.local_world_size == 2


def test_task_context_defaults():
    env = {
        k: TASK_ENV[k]
        for k in (
            "SLURM_JOB_ID",
            "SLURM_PROCID",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_LOCALID",
            "SLURMD_NODENAME",
        )
    }
    ctx = task_context(env)
    assert (ctx.step_id, ctx.node_index, ctx.restart) == (0, 0, 0)
    assert ctx.tasks_per_node == "1" and ctx.cluster == "cluster" and ctx.step_nodelist == ""
    assert ctx.local_world_size == 1


def test_integer_with_surrounding_blanks_is_read():
    assert task_context({**TASK_ENV, "SLURM_PROCID": " 5 "}).rank == 5


@pytest.mark.parametrize(
    "var",
    ["SLURM_JOB_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURMD_NODENAME"],
)
def test_missing_required_variable_is_named(var):
    env = {k: v for k, v in TASK_ENV.items() if k != var}
    with pytest.raises(ConfigError, match=f"environment variable {var} is not set"):
        task_context(env)


def test_empty_required_variable_counts_as_missing():
    with pytest.raises(ConfigError, match="SLURM_PROCID is not set"):
        task_context({**TASK_ENV, "SLURM_PROCID": ""})


@pytest.mark.parametrize(
    "var,value",
    [
        ("SLURM_PROCID", "five"),
        ("SLURM_JOB_ID", "4711_3"),
        ("SLURM_RESTART_COUNT", "1.5"),
        ("SLURM_STEP_ID", "batch"),
    ],
)
def test_bad_integer_names_the_variable_and_value(var, value):
    with pytest.raises(ConfigError) as exc:
        task_context({**TASK_ENV, var: value})
    assert f"{var}={value!r}" in str(exc.value) and "not an integer" in str(exc.value)


@pytest.mark.parametrize("name", ["../etc", "node 3", "-n1", "a" * 129, "n1;rm"])
def test_bad_node_name_is_refused(name):
    with pytest.raises(ConfigError, match="SLURMD_NODENAME.*not a valid node name"):
        task_context({**TASK_ENV, "SLURMD_NODENAME": name})


def test_bad_cluster_name_is_refused():
    with pytest.raises(ConfigError, match="SLURM_CLUSTER_NAME.*not a valid cluster name"):
        task_context({**TASK_ENV, "SLURM_CLUSTER_NAME": "lab/../x"})


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("1", [1]),
        ("4(x2)", [4, 4]),
        ("8,8", [8, 8]),
        ("2(x2),1,3(x1)", [2, 2, 1, 3]),
        (" 2(x2) , 1", [2, 2, 1]),
    ],
)
def test_expand_tasks_per_node(spec, expected):
    assert expand_tasks_per_node(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "2x3",
        "2(3)",
        "a",
        "2(x3",
        "-1",
        "2,,1",
        "1(x999999999)",
        "1(x600000),1(x600000)",
        "1(x99999999999999)",
        "\u0662(x\u0663)",
    ],
)  # Arabic-Indic digits are not Slurm's
def test_expand_tasks_per_node_refuses_other_forms(spec):
    with pytest.raises(ConfigError, match="tasks-per-node"):
        expand_tasks_per_node(spec)


@pytest.mark.parametrize("node_index,expected", [(0, 2), (2, 2), (3, 1)])
def test_local_world_size_is_this_node_s_count(node_index, expected):
    env = {**TASK_ENV, "SLURM_NODEID": str(node_index), "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}
    assert task_context(env).local_world_size == expected


def test_local_world_size_outside_the_list_names_both_variables():
    ctx = task_context({**TASK_ENV, "SLURM_NODEID": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"})
    with pytest.raises(ConfigError, match=r"SLURM_NODEID=4.*SLURM_STEP_TASKS_PER_NODE='2\(x3\),1'"):
        _ = ctx.local_world_size


# --- hooks --------------------------------------------------------------------------------


def test_controller_epilog_context():
    ctx = hook_context(
        {
            "SLURM_JOB_ID": "4711",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_USER": "alice",
            "SLURM_CLUSTER_NAME": "lab",
            "SLURM_JOB_RESTART_COUNT": "2",
            "SLURM_JOB_NODELIST": "node[01-04]",
            "SLURM_JOB_EXIT_CODE": "256",
            "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld",
            "SLURM_JOB_WORK_DIR": "/home/alice",
        }
    )
    assert (ctx.job_id, ctx.job_uid, ctx.job_user, ctx.restart) == (4711, 1000, "alice", 2)
    assert ctx.node == "" and ctx.job_nodelist == "node[01-04]" and ctx.work_dir == "/home/alice"
    assert ctx.is_controller and ctx.job_failed


def test_node_prolog_context_reads_slurm_nodelist():
    ctx = hook_context(
        {
            "SLURM_JOB_ID": "4711",
            "SLURM_JOB_UID": "0",
            "SLURMD_NODENAME": "node02",
            "SLURM_NODELIST": "node[01-02]",
            "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
        }
    )
    assert ctx.node == "node02" and ctx.job_nodelist == "node[01-02]"
    assert ctx.exit_code_raw == -1 and not ctx.job_failed and not ctx.is_controller
    assert ctx.cluster == "cluster" and ctx.restart == 0


@pytest.mark.parametrize("raw,failed", [("0", False), ("-1", False), ("256", True), ("9", True)])
def test_job_failed(raw, failed):
    ctx = hook_context({"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURM_JOB_EXIT_CODE": raw})
    assert ctx.job_failed is failed


@pytest.mark.parametrize("var", ["SLURM_JOB_ID", "SLURM_JOB_UID"])
def test_hook_missing_required_variable_is_named(var):
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0"}
    del env[var]
    with pytest.raises(ConfigError, match=f"scout hook: environment variable {var} is not set"):
        hook_context(env)


def test_hook_bad_integer_names_variable_and_value():
    with pytest.raises(ConfigError, match=r"SLURM_JOB_EXIT_CODE='0:9' is not an integer"):
        hook_context({"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURM_JOB_EXIT_CODE": "0:9"})


@pytest.mark.parametrize("value", ["4711_3", "1_000", "\u0664\u0667", "0x12", "12.0"])
def test_only_plain_decimal_integers_are_read(value):
    # int() alone would read "4711_3" as 47113: another job's evidence folder
    with pytest.raises(ConfigError, match="SLURM_JOB_ID"):
        task_context({**TASK_ENV, "SLURM_JOB_ID": value})


def test_negative_integer_is_read():
    ctx = hook_context({"SLURM_JOB_ID": "1", "SLURM_JOB_UID": "0", "SLURM_JOB_EXIT_CODE": "-1"})
    assert ctx.exit_code_raw == -1
