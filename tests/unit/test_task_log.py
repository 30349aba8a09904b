"""The job's output is the user's (issue 19): the shim's own log goes to a bounded file in the
evidence folder; the job sees one start banner; operator commands show warnings only by default."""

from __future__ import annotations

import json
import os

import pytest

from scout_slurm.config import parse_config
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.jobenv import task_context
from scout_slurm.log import TaskLog, configure, get_logger, level_from_env

ENV = {
    "SLURM_JOB_ID": "4711",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "0",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURMD_NODENAME": "n1",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
}


def test_the_shims_log_goes_to_its_file_not_to_the_jobs_stderr(tmp_path, capsys):
    path = tmp_path / "log-0.jsonl"
    configure(TaskLog(path), json=True)
    try:
        get_logger("t").info("watchdog.state", rank=0, old="starting", new="running")
        get_logger("t").warning("watchdog.history_failed", rank=0, error="x")
    finally:
        configure()
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    events = [json.loads(line)["event"] for line in path.read_text().splitlines()]
    assert events == ["watchdog.state", "watchdog.history_failed"]
    assert (os.stat(path).st_mode & 0o777) == 0o640


def test_the_task_log_is_bounded_and_says_once_that_it_dropped_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    log = TaskLog(path, max_bytes=1000)
    for i in range(100):
        log.write(json.dumps({"event": "e", "i": i, "level": "info"}) + "\n")
    lines = path.read_text().splitlines()
    assert os.path.getsize(path) < 1100
    assert [json.loads(x)["event"] for x in lines].count("log.truncated") == 1
    assert log.dropped > 0


def test_the_task_log_follows_no_link_and_sends_errors_to_stderr_when_refused(tmp_path, capsys):
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "log.jsonl").symlink_to(target)
    log = TaskLog(tmp_path / "log.jsonl")
    log.write('{"event": "watchdog.state", "level": "info"}\n')
    log.write('{"event": "watchdog.exit_record_failed", "level": "error"}\n')
    assert target.read_text() == ""  # the link was not followed
    err = capsys.readouterr().err
    assert "exit_record_failed" in err and "watchdog.state" not in err
    assert log.dropped == 2


@pytest.mark.parametrize(
    "text,expected", [("", 20), ("debug", 10), ("INFO", 20), ("warning", 30), ("nonsense", 20)]
)
def test_log_level_from_the_environment(monkeypatch, text, expected):
    monkeypatch.setenv("SCOUT_LOG_LEVEL", text)
    assert level_from_env() == expected


def test_the_start_banner_promises_the_exit_watch_only_and_says_where_evidence_goes(tmp_path):
    """At start scout cannot know whether the command uses torch.distributed: the start line
    promises no stall watch, votes, replay or timing (a data-preparation step shows it alone)."""
    from scout_slurm.task.shim import banner

    ctx = task_context(ENV)
    folder = JobFolder(tmp_path, "c", 4711)
    cfg = parse_config({"watchdog": {"stall_floor_s": 30}})
    env = dict(ENV, SCOUT_CONSENSUS_EVERY="10", SCOUT_REPLAY_EVERY="0")
    line = banner(ctx, cfg, env, folder)
    assert line.startswith("scout: watching job 4711 (run 0, 4 ranks): each task's exit")
    assert "watched for its exit only and never called stalled" in line
    assert (
        "max(30 s" not in line and "every 10 steps" not in line and "timing votes every" not in line
    )
    assert str(folder.run_dir(0)) in line and "\n" not in line


def test_the_init_banner_says_what_is_on_once_rank_0_enters_init(tmp_path):
    from scout_slurm.task.shim import init_banner

    ctx = task_context(ENV)
    cfg = parse_config({"watchdog": {"stall_floor_s": 30, "startup_grace_s": 8}})
    env = dict(ENV, SCOUT_CONSENSUS_EVERY="10", SCOUT_REPLAY_EVERY="0")
    line = init_banner(ctx, cfg, env)
    assert line.startswith("scout: job 4711, rank 0 entered init_process_group:")
    assert "max(30 s, 10 x its step time)" in line and "the start-up limit, 8 s" in line
    assert "only once a peer waits there" in line
    assert (
        "state votes every 10 steps" in line
        and "in-situ replay off" in line
        and "timing votes every 25 steps" in line
    )
    assert "collective ledger: torch's Flight Recorder (2000 entries, read on a stall)" in line
    off = init_banner(ctx, cfg, dict(env, TORCH_NCCL_TRACE_BUFFER_SIZE="0"))
    assert "collective ledger: scout's own record only" in off
    assert "\n" not in line
    assert "unreadable (SCOUT_CONSENSUS_EVERY='ten')" in init_banner(
        ctx, cfg, dict(env, SCOUT_CONSENSUS_EVERY="ten")
    )


def test_operator_commands_print_no_info_log_lines(tmp_path, monkeypatch, capsys):
    """`scout` commands (the demo, `scout lab`) show warnings and errors only: no line per Slurm
    call.
    """
    from click.testing import CliRunner

    from scout_slurm.cli import main

    monkeypatch.delenv("SCOUT_LOG_LEVEL", raising=False)
    monkeypatch.setenv("SCOUT_EVIDENCE_ROOT", str(tmp_path))
    monkeypatch.delenv("SCOUT_CONFIG", raising=False)
    try:
        CliRunner().invoke(main, ["incidents"])
        capsys.readouterr()
        get_logger("t").info("slurm.call", argv=["squeue"])
        get_logger("t").warning("something.odd")
        err = capsys.readouterr().err
        assert "slurm.call" not in err and "something.odd" in err
        monkeypatch.setenv("SCOUT_LOG_LEVEL", "info")
        CliRunner().invoke(main, ["incidents"])
        get_logger("t").info("slurm.call", argv=["squeue"])
        assert "slurm.call" in capsys.readouterr().err
    finally:
        configure()


def test_scout_show_on_a_job_with_no_scout_records_says_so_and_fails(tmp_path, monkeypatch):
    """Issue 19: the Prolog laid the job's folder out, but no rank ran under scout-srun."""
    from click.testing import CliRunner

    from scout_slurm.cli import main

    folder = JobFolder(tmp_path / "evidence", "c", 77)
    for d in (
        folder.ranks_dir(0),
        folder.progress_dir(0),
        folder.findings_dir(0),
        folder.nodes_dir,
    ):
        d.mkdir(parents=True)
    monkeypatch.setenv("SCOUT_EVIDENCE_ROOT", str(tmp_path / "evidence"))
    monkeypatch.delenv("SCOUT_CONFIG", raising=False)
    for args in (["show", "77"], ["show", "77", "--json"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 1, res.output
        assert "no scout records" in res.output and "did not run under scout-srun" in res.output
        assert "clean" not in res.output


def test_the_shim_turns_flight_recorder_on_unless_the_job_set_it(tmp_path):
    from scout_slurm.task.shim import flight_recorder_env

    stacks = tmp_path / "run-0" / "stacks"
    assert flight_recorder_env({}, stacks) == {
        "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_FR_DUMP_TEMP_FILE": str(stacks / "torch-flight-recorder-rank-"),
    }
    # the job's own values, under either of torch's names, win
    theirs = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/tmp/x"}
    assert flight_recorder_env(theirs, stacks) == {}
