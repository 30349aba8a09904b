"""scout-srun's argument split: every srun option reaches srun unchanged, scout's own `--scout-*`
options become environment variables, and the command is run as given (under the shim)."""

from __future__ import annotations

import pytest

from scout_slurm.errors import ConfigError, ScoutError
from scout_slurm.launcher.srun import LONG_WITH_VALUE, SHORT_WITH_VALUE, split_args, srun_argv

PY = "/opt/venv/bin/python"
CMD = ["python", "train.py", "--epochs", "3"]


def shim(*command: str) -> list[str]:
    return [PY, "-m", "scout_slurm.task.shim", "--", *command]


@pytest.mark.parametrize(
    "options",
    [
        ["--ntasks=4"],
        ["--nodes=2", "--ntasks-per-node=2", "--gres=gpu:1"],
        ["--ntasks-per-node", "2"],
        ["--job-name", "x"],
        ["--export", "ALL"],
        ["--export", "ALL,NCCL_DEBUG=INFO"],
        ["--cpu-bind", "none", "--mem", "4G"],
        ["--time", "10:00", "--partition", "debug"],
        ["--threads", "4"],
        ["--accel-bind", "g"],
        ["--msg-timeout", "30"],
        ["--priority", "10"],
        ["--profile", "none"],
        ["--exclusive"],
        ["--kill-on-bad-exit=1"],
        ["--kill-on-bad-exit"],
        ["--exclusive=user"],
        ["--bcast"],
        ["--compress"],
        ["--nice"],
        ["--nice=5"],
        ["--propagate"],
        ["--propagate=STACK"],
        ["-l"],
        ["-N2"],
        ["-N", "2"],
        ["-n", "8", "-c", "4"],
        ["-lN", "2"],
        ["-lN2"],
        ["-lu"],
        ["-F", "nodes.txt"],
        ["-w", "n[1-2]", "-x", "n3"],
        ["--overlap", "-K", "--unbuffered", "--label"],
    ],
    ids=lambda o: " ".join(o),
)
def test_srun_options_pass_through_unchanged(options):
    plan = split_args([*options, *CMD])
    assert plan.srun_options == tuple(options)
    assert plan.command == tuple(CMD)
    assert plan.scout_env == {}
    assert srun_argv(plan, PY) == [*options, *shim(*CMD)]


def test_double_dash_ends_the_options_for_a_command_with_its_own_dash_n():
    plan = split_args(["-N", "2", "--", "mytool", "-N", "5", "--scout-off"])
    assert plan.srun_options == ("-N", "2")
    assert plan.command == ("mytool", "-N", "5", "--scout-off")
    assert not plan.off


def test_options_after_the_command_belong_to_the_command():
    plan = split_args(
        ["-N2", "python", "train.py", "-N", "5", "--scout-inject=bogus", "--job-name", "y"]
    )
    assert plan.srun_options == ("-N2",)
    assert plan.command == (
        "python",
        "train.py",
        "-N",
        "5",
        "--scout-inject=bogus",
        "--job-name",
        "y",
    )
    assert plan.scout_env == {}


def test_torchrun_command_passes_as_is():
    command = [
        "torchrun",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        "train.py",
        "--lr",
        "0.1",
    ]
    plan = split_args(["--nodes=2", "--ntasks-per-node=1", *command])
    assert plan.command == tuple(command)
    assert srun_argv(plan, PY) == ["--nodes=2", "--ntasks-per-node=1", *shim(*command)]


# --- scout's options ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["--scout-stall-floor=5"], ["--scout-stall-floor", "5"]], ids=["eq", "space"]
)
def test_stall_floor_becomes_env_and_leaves_srun(argv):
    plan = split_args(["-N", "2", *argv, *CMD])
    assert plan.srun_options == ("-N", "2")
    assert plan.scout_env == {"SCOUT_WATCHDOG_STALL_FLOOR_S": "5"}
    assert plan.command == tuple(CMD)
    assert not any(a.startswith("--scout") for a in srun_argv(plan, PY))


@pytest.mark.parametrize(
    "argv",
    [["--scout-inject=sleep,rank=1,step=5"], ["--scout-inject", "sleep,rank=1,step=5"]],
    ids=["eq", "space"],
)
def test_inject_becomes_env(argv):
    plan = split_args([*argv, "--ntasks=4", *CMD])
    assert plan.scout_env == {"SCOUT_INJECT": "sleep,rank=1,step=5"}
    assert plan.srun_options == ("--ntasks=4",)
    assert plan.command == tuple(CMD)


@pytest.mark.parametrize(
    "spec", ["explode,rank=1", "sleep,rank=one", "sleep,step=0", "sleep,when=3", ""]
)
def test_bad_inject_spec_is_refused_before_any_task_starts(spec):
    with pytest.raises(ConfigError):
        split_args([f"--scout-inject={spec}", *CMD])


def test_config_becomes_env():
    plan = split_args(["--scout-config", "/etc/scout/test.toml", *CMD])
    assert plan.scout_env == {"SCOUT_CONFIG": "/etc/scout/test.toml"}


def test_all_scout_options_together():
    plan = split_args(
        [
            "--scout-stall-floor=7",
            "-N2",
            "--scout-inject",
            "stop,rank=0,step=2",
            "--scout-config=/x.toml",
            "--exclusive",
            *CMD,
        ]
    )
    assert plan.srun_options == ("-N2", "--exclusive")
    assert plan.scout_env == {
        "SCOUT_WATCHDOG_STALL_FLOOR_S": "7",
        "SCOUT_INJECT": "stop,rank=0,step=2",
        "SCOUT_CONFIG": "/x.toml",
    }


def test_unknown_scout_option_is_refused_with_the_valid_ones():
    with pytest.raises(ScoutError, match=r"unknown option --scout-x.*--scout-stall-floor"):
        split_args(["--scout-x", *CMD])


def test_scout_option_missing_its_value_is_refused():
    with pytest.raises(ScoutError, match="--scout-stall-floor needs a value"):
        split_args(["--scout-stall-floor"])


@pytest.mark.parametrize(
    "argv", [[], ["-N", "2"], ["--exclusive", "--scout-stall-floor=5"], ["--"]]
)
def test_no_command_is_refused(argv):
    with pytest.raises(ScoutError, match="no command given"):
        split_args(argv)


@pytest.mark.parametrize(
    "argv,what", [(["--job-name"], "--job-name"), (["-N"], "-N"), (["-lN"], "-N")]
)
def test_srun_option_missing_its_value_is_refused(argv, what):
    with pytest.raises(ScoutError, match=f"{what} needs a value"):
        split_args(argv)


def test_scout_off_gives_the_plain_srun_argv():
    plan = split_args(["--scout-off", "-N", "2", "--exclusive", *CMD])
    assert plan.off
    assert srun_argv(plan, PY) == ["-N", "2", "--exclusive", *CMD]


def test_dry_run_needs_no_command():
    plan = split_args(["--scout-dry-run", "-N2"])
    assert plan.dry_run and plan.command == ()


def test_option_tables_hold_only_option_names():
    assert all(name and not name.startswith("-") and "?" not in name for name in LONG_WITH_VALUE)
    assert all(len(ch) == 1 and ch.isalpha() for ch in SHORT_WITH_VALUE)
