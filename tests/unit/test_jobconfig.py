"""The in-job settings (scout_slurm/jobconfig.py): one table, a typed JobConfig, the start-up check
of the job's SCOUT_* variables that the shim says once, docs/USERS.md's generated knob reference,
and the in-job exit policy (bootstrap/exitpolicy.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scout_slurm.config import parse_config, site_override_names
from scout_slurm.errors import ConfigError
from scout_slurm.jobconfig import (
    BY_NAME,
    SETTINGS,
    JobConfig,
    JobConfigError,
    ResumeMismatch,
    SdcPolicy,
    known_names,
    problems_message,
    read_settings,
    render_markdown,
    site_defaults,
)
from scout_slurm.jobenv import task_context
from scout_slurm.localise.straggler import TimingRules
from scout_slurm.task import exitcodes

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURMD_NODENAME": "n1",
    "SLURM_CLUSTER_NAME": "c",
}


def test_defaults_without_any_setting():
    c = JobConfig.from_environment({})
    assert (
        c.consensus_every,
        c.replay_every,
        c.replay_max_bytes,
        c.finite_check,
        c.final_vote_timeout_s,
    ) == (50, 50, 64 << 20, True, 120.0)
    assert (c.sdc_policy, c.resume_mismatch, c.checkpoint_agreement, c.step_offset) == (
        SdcPolicy.EXIT,
        ResumeMismatch.WARN,
        True,
        0,
    )
    assert c.timing == TimingRules() and c.inject is None and c.run_dir is None and c.restart == 0
    assert c == JobConfig()


def test_each_type_parses():
    c = JobConfig.from_environment(
        {
            "SCOUT_CONSENSUS_EVERY": "10",
            "SCOUT_REPLAY_MAX_BYTES": "1024",
            "SCOUT_FINITE_CHECK": "0",
            "SCOUT_FINAL_VOTE_TIMEOUT_S": "2.5",
            "SCOUT_SDC_POLICY": "Continue",
            "SCOUT_RESUME_MISMATCH": "fatal",
            "SCOUT_CHECKPOINT_AGREEMENT": "no",
            "SCOUT_TIMING_EVERY": "5",
            "SCOUT_TIMING_PROBE": "false",
            "SCOUT_TIMING_POLICY": "exit",
            "SCOUT_INJECT": "sleep,rank=1,step=5",
            "SCOUT_STEP_OFFSET": "40",
            "SCOUT_RUN_DIR": "/ev/run-1",
            "SLURM_RESTART_COUNT": "1",
            "SLURMD_NODENAME": "n2",
            "SCOUT_RESUME_CHECKPOINT": "/ck/step-40.pt",
            "PATH": "/bin",
        }
    )
    assert (c.consensus_every, c.replay_every, c.replay_max_bytes, c.finite_check) == (
        10,
        10,
        1024,
        False,
    )
    assert (c.final_vote_timeout_s, c.sdc_policy, c.resume_mismatch, c.checkpoint_agreement) == (
        2.5,
        SdcPolicy.CONTINUE,
        ResumeMismatch.FATAL,
        False,
    )
    assert (c.timing.every, c.timing.probe, c.timing.policy) == (5, False, "exit")
    assert (c.inject.kind, c.inject.rank, c.inject.step) == ("sleep", 1, 5)
    assert (c.step_offset, c.run_dir, c.restart, c.node, c.resume_checkpoint) == (
        40,
        Path("/ev/run-1"),
        1,
        "n2",
        "/ck/step-40.pt",
    )


def test_a_switch_takes_auto_on_off_and_a_booleans_words():
    assert (JobConfig().at_rest, JobConfig().update_replay) == ("auto", "auto")
    for text, value in (
        ("auto", "auto"),
        ("ON", "on"),
        ("off", "off"),
        ("1", "on"),
        ("yes", "on"),
        ("0", "off"),
        ("false", "off"),
    ):
        assert JobConfig.from_environment({"SCOUT_AT_REST": text}).at_rest == value, text
        assert JobConfig.from_environment({"SCOUT_UPDATE_REPLAY": text}).update_replay == value, (
            text
        )
    _, problems = read_settings({"SCOUT_AT_REST": "sometimes"})
    assert len(problems) == 1 and "SCOUT_AT_REST='sometimes'" in str(problems[0])
    assert "one of auto, on, off (also 1 or 0, true/false, yes/no for on or off)" in str(
        problems[0]
    )
    # a choice that is not a switch still refuses a boolean's words
    assert read_settings({"SCOUT_SDC_POLICY": "1"})[1]


def test_replay_follows_the_votes_unless_set_and_empty_means_the_default():
    assert JobConfig.from_environment({"SCOUT_CONSENSUS_EVERY": "7"}).replay_every == 7
    assert (
        JobConfig.from_environment(
            {"SCOUT_CONSENSUS_EVERY": "7", "SCOUT_REPLAY_EVERY": "0"}
        ).replay_every
        == 0
    )
    assert JobConfig.from_environment({"SCOUT_CONSENSUS_EVERY": ""}).consensus_every == 50


def test_the_site_config_gives_the_default_and_the_job_wins():
    site = parse_config({"remediation": {"on_resume_mismatch": "fatal"}})
    assert site_defaults(site) == {"SCOUT_RESUME_MISMATCH": "fatal"}
    assert (
        JobConfig.from_environment({}, site_defaults(site)).resume_mismatch is ResumeMismatch.FATAL
    )
    assert (
        JobConfig.from_environment(
            {"SCOUT_RESUME_MISMATCH": "warn"}, site_defaults(site)
        ).resume_mismatch
        is ResumeMismatch.WARN
    )


def test_a_misspelt_variable_is_named_with_the_closest_valid_one():
    _, problems = read_settings({"SCOUT_CONSENSUS_EVRY": "10", "SCOUT_TIMING_EVRY": "3"})
    assert [(p.name, p.value) for p in problems] == [
        ("SCOUT_CONSENSUS_EVRY", "10"),
        ("SCOUT_TIMING_EVRY", "3"),
    ]
    assert "did you mean SCOUT_CONSENSUS_EVERY?" in problems[0].message
    assert "did you mean SCOUT_TIMING_EVERY?" in problems[1].message
    text = problems_message(problems, disabled=True)
    assert (
        "SCOUT_CONSENSUS_EVRY='10': unknown scout setting; did you mean SCOUT_CONSENSUS_EVERY?"
        in text
    )
    assert "in-job checks OFF" in text


@pytest.mark.parametrize(
    "env, words",
    [
        ({"SCOUT_CONSENSUS_EVERY": "-1"}, ["SCOUT_CONSENSUS_EVERY='-1'", "out of range", ">= 0"]),
        ({"SCOUT_CONSENSUS_EVERY": "ten"}, ["SCOUT_CONSENSUS_EVERY='ten'", "not an integer"]),
        (
            {"SCOUT_FINAL_VOTE_TIMEOUT_S": "soon"},
            ["SCOUT_FINAL_VOTE_TIMEOUT_S='soon'", "not a number"],
        ),
        (
            {"SCOUT_FINAL_VOTE_TIMEOUT_S": "nan"},
            ["SCOUT_FINAL_VOTE_TIMEOUT_S='nan'", "out of range"],
        ),
        ({"SCOUT_SDC_POLICY": "contine"}, ["SCOUT_SDC_POLICY='contine'", "exit, continue"]),
        ({"SCOUT_FINITE_CHECK": "maybe"}, ["SCOUT_FINITE_CHECK='maybe'", "not a boolean"]),
        ({"SCOUT_TIMING_PROBE_BYTES": "0"}, ["SCOUT_TIMING_PROBE_BYTES='0'", "within 1..67108864"]),
        ({"SCOUT_TIMING_POLICY": "drain"}, ["SCOUT_TIMING_POLICY='drain'", "report, exit"]),
        ({"SCOUT_INJECT": "explode,rank=1"}, ["SCOUT_INJECT='explode,rank=1'"]),
        ({"SCOUT_RUN_DIR": "relative/dir"}, ["SCOUT_RUN_DIR='relative/dir'", "absolute"]),
    ],
)
def test_a_bad_value_is_named_with_what_is_valid(env, words):
    config, problems = read_settings(env)
    assert len(problems) == 1, problems
    for w in words:
        assert w in str(problems[0]), problems
    assert config == JobConfig(), "a bad value keeps its default"
    with pytest.raises(JobConfigError) as exc:
        JobConfig.from_environment(env)
    assert isinstance(exc.value, ConfigError) and words[0] in str(exc.value)


def test_other_valid_scout_names_are_no_problem():
    env = {name: "1" for name in site_override_names()} | {
        "SCOUT_CONFIG": "/etc/scout/scout.toml",
        "SCOUT_PYTHON": "/usr/bin/python3",
    }
    assert read_settings(env) == (JobConfig(), ())  # the site config checks its own values
    assert {
        "SCOUT_WATCHDOG_STALL_FLOOR_S",
        "SCOUT_WATCHDOG_ON_BAD_SETTING",
        "SCOUT_CONSENSUS_EVERY",
        "SCOUT_TIMING_EVERY",
        "SCOUT_CONFIG",
    } <= known_names()


def test_the_table_names_every_field_once():
    assert len(BY_NAME) == len(SETTINGS)
    fields = {s.field for s in SETTINGS if not s.field.startswith("timing.")}
    assert fields == set(JobConfig.__dataclass_fields__) - {"timing"}
    timing = {s.field.split(".", 1)[1] for s in SETTINGS if s.field.startswith("timing.")}
    assert timing == set(TimingRules.__dataclass_fields__) - {"schema_version"}


def test_users_doc_knob_reference_is_the_rendered_table():
    text = (ROOT / "docs" / "USERS.md").read_text()
    m = re.search(r"<!-- knobs:begin -->\n(.*?)<!-- knobs:end -->", text, re.S)
    assert m, "docs/USERS.md lacks the <!-- knobs:begin --> / <!-- knobs:end --> block"
    assert m.group(1) == render_markdown(), (
        "docs/USERS.md's knob reference differs from jobconfig.render_markdown(): paste the "
        "rendered table"
    )


def test_on_bad_setting_is_a_validated_site_setting():
    assert parse_config({}).watchdog.on_bad_setting == "disable"
    assert parse_config({"watchdog": {"on_bad_setting": "fail"}}).watchdog.on_bad_setting == "fail"
    with pytest.raises(ConfigError, match="on_bad_setting"):
        parse_config({"watchdog": {"on_bad_setting": "ignore"}})


@pytest.mark.parametrize(
    "policy, rank, expected", [("disable", 0, False), ("fail", 0, None), ("disable", 1, False)]
)
def test_the_shim_says_bad_settings_once_and_applies_the_site_policy(
    tmp_path, capsys, policy, rank, expected
):
    from scout_slurm.log import TaskLog, configure
    from scout_slurm.task.shim import settings_allow_start

    ctx = task_context(dict(ENV, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % 2)))
    cfg = parse_config({"watchdog": {"on_bad_setting": policy}})
    env = dict(ENV, SCOUT_CONSENSUS_EVRY="10", SCOUT_SDC_POLICY="drain")
    configure(TaskLog(tmp_path / "log-0.jsonl"), json=True)  # as the shim's run() has it by then
    try:
        assert settings_allow_start(ctx, cfg, env) is expected
    finally:
        configure()
    err = capsys.readouterr().err
    assert "shim.bad_settings" in (tmp_path / "log-0.jsonl").read_text(), (
        "every rank logs it in its own log"
    )
    if rank != 0:
        assert err == "", "only rank 0 says it: the job's output is the user's"
        return
    assert err.count("scout: this job's scout settings are not valid:") == 1
    assert (
        "SCOUT_CONSENSUS_EVRY='10': unknown scout setting; did you mean SCOUT_CONSENSUS_EVERY?"
        in err
    )
    assert "SCOUT_SDC_POLICY='drain': not a valid choice; expected one of exit, continue" in err
    assert ("in-job checks OFF" in err) == (policy == "disable")
    assert ("the job is not started" in err) == (policy == "fail")


def test_valid_settings_start_quietly(tmp_path, capsys):
    from scout_slurm.log import TaskLog, configure
    from scout_slurm.task.shim import settings_allow_start

    env = dict(
        ENV, SCOUT_CONSENSUS_EVERY="10", SCOUT_CONFIG="/x.toml", SCOUT_WATCHDOG_STALL_FLOOR_S="5"
    )
    configure(TaskLog(tmp_path / "log-0.jsonl"), json=True)  # as the shim's run() has it by then
    try:
        assert settings_allow_start(task_context(ENV), parse_config({}), env) is True
    finally:
        configure()
    assert capsys.readouterr().err == ""
    own = (tmp_path / "log-0.jsonl").read_text()
    assert '"event": "shim.job_settings"' in own and "SCOUT_CONSENSUS_EVERY" in own, own


def test_exit_policy_decides_and_codes_come_from_exitcodes():
    from scout_slurm.bootstrap.exitpolicy import Ending, ends

    assert (
        (Ending.SDC.code, Ending.STRAGGLER.code, Ending.RESUME_MISMATCH.code)
        == (exitcodes.SDC_CULPRIT, exitcodes.STRAGGLER_ENDED, exitcodes.RESUME_MISMATCH)
        == (88, 91, 90)
    )
    assert (
        ends(Ending.SDC, "exit")
        and ends(Ending.SDC, SdcPolicy.EXIT)
        and not ends(Ending.SDC, "continue")
    )
    assert ends(Ending.STRAGGLER, "exit") and not ends(Ending.STRAGGLER, "report")
    assert ends(Ending.RESUME_MISMATCH, "fatal") and not ends(Ending.RESUME_MISMATCH, "warn")


def test_end_flushes_and_exits_with_the_code_skipping_atexit():
    code = (
        "import atexit, sys\n"
        "from scout_slurm.bootstrap.exitpolicy import Ending, end\n"
        "atexit.register(lambda: print('atexit ran'))\n"
        "sys.stdout.write('unflushed job output')\n"
        "end(Ending.SDC, 'rank 1 outvoted; ending this rank (exit 88)')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 88
    assert proc.stdout == "unflushed job output"
    assert proc.stderr == "scout: rank 1 outvoted; ending this rank (exit 88)\n"
