"""`scout acceptance --site` where no Slurm answers: it does not pretend. Every step that needs a
job fails and says why, the slow link is skipped with its reason, the load generators are started
and stopped, the reports are written, and the exit code is 1."""

from __future__ import annotations

import json

from click.testing import CliRunner

from scout_slurm.cli import main


def test_acceptance_on_a_site_without_slurm_fails_every_step_honestly(tmp_path):
    out, ev, work = tmp_path / "out", tmp_path / "evidence", tmp_path / "work"
    ev.mkdir()
    bad = tmp_path / "slurm.conf"
    bad.write_text("ThisIsNotAKey=1\n")  # sbatch refuses it at once (a missing file makes it wait)
    env = {"SLURM_CONF": str(bad), "SCOUT_CONFIG": ""}
    res = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--site",
            "--partition",
            "gpu",
            "--evidence-root",
            str(ev),
            "--workdir",
            str(work),
            "-o",
            str(out),
            "--job-timeout",
            "20",
        ],
        env=env,
    )
    assert res.exit_code == 1, res.output
    report = json.loads((out / "acceptance.json").read_text())
    status = {s["step"]: s["status"] for s in report["steps"]}
    assert status.pop("3d") == "SKIPPED" and set(status.values()) == {"FAIL"}, status
    details = {s["step"]: s["detail"] for s in report["steps"]}
    assert "sbatch failed" in details["1"] and "sbatch failed" in details["3a"]
    assert "does not shape links on a site's production network" in details["3d"]
    assert "no case ran under load" not in details["8"] and "sbatch failed" in details["8"]
    assert report["passed"] is False and "ACCEPTANCE FAILED" in res.output
    assert (out / "acceptance.md").read_text().startswith("# scout acceptance: FAILED")
    # the disk writer wrote in the evidence file system and removed its file; nothing is left
    # running
    assert list(ev.iterdir()) == []
    assert "load generators stopped" in res.output
    assert (
        "Unable to process configuration file" in details["1"]
    )  # sbatch's own words reach the report


def test_acceptance_with_a_train_command_on_a_site_without_slurm_skips_nothing_it_did_not_see(
    tmp_path,
):
    """--train: no job ran, so nothing is excused as the workload's: every step fails (the slow
    link is skipped, as without --train)."""
    out, ev, work = tmp_path / "out", tmp_path / "evidence", tmp_path / "work"
    ev.mkdir()
    bad = tmp_path / "slurm.conf"
    bad.write_text("ThisIsNotAKey=1\n")
    train = "python train.py --steps 30 --ckpt 'ck/$SLURM_JOB_ID'"
    res = CliRunner().invoke(
        main,
        [
            "acceptance",
            "--site",
            "--train",
            train,
            "--evidence-root",
            str(ev),
            "--workdir",
            str(work),
            "-o",
            str(out),
            "--job-timeout",
            "20",
        ],
        env={"SLURM_CONF": str(bad), "SCOUT_CONFIG": ""},
    )
    assert res.exit_code == 1, res.output
    report = json.loads((out / "acceptance.json").read_text())
    status = {s["step"]: s["status"] for s in report["steps"]}
    assert status.pop("3d") == "SKIPPED" and set(status.values()) == {"FAIL"}, status
    assert report["options"]["train_command"] == train


def test_acceptance_refuses_a_train_command_that_is_not_one_shell_line():
    res = CliRunner().invoke(main, ["acceptance", "--train", "python 'train.py"])
    assert res.exit_code == 2 and "not a shell command line" in res.output, res.output
    help_text = CliRunner().invoke(main, ["acceptance", "--help"]).output
    assert "scout acceptance --quick --train 'python train.py" in help_text
