"""The front door: `scout --version`, `scout-srun --version` and `scout-srun --help` say what they
are from the package's own version and option table; help after the command is the command's."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from click.testing import CliRunner

from scout_slurm import __version__
from scout_slurm.cli import main
from scout_slurm.launcher import srun

ROOT = Path(__file__).resolve().parents[2]


def test_one_version_everywhere():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert __version__ == declared == metadata.version("scout-slurm")


def test_scout_version_and_help():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"scout (scout-slurm) {__version__}\n"
    result = CliRunner().invoke(main, ["site", "install", "--help"])
    assert result.exit_code == 0 and "Example: scout site install --prefix /" in result.output


def test_help_and_version_before_the_command_are_scout_sruns():
    for argv in (["--help"], ["-N", "2", "-h"], ["--scout-off", "--usage"]):
        assert srun.split_args(argv).asked == "help", argv
    for argv in (["--version"], ["-N", "2", "-V"]):
        assert srun.split_args(argv).asked == "version", argv
    # after the command, or after --, they are the command's
    plan = srun.split_args(["-N", "2", "python", "train.py", "--help"])
    assert plan.asked == "" and plan.command == ("python", "train.py", "--help")
    assert srun.split_args(["--", "tool", "-V"]).command == ("tool", "-V")


def test_the_usage_lists_every_scout_option_split_args_knows():
    text = srun.usage()
    for option in srun.SCOUT_OPTIONS:
        assert f"--{option.name}" in text
        value = {"SPEC": "sleep,rank=1,step=5"}.get(option.metavar, "1")
        argv = [f"--{option.name}={value}"] if option.metavar else [f"--{option.name}"]
        srun.split_args([*argv, "true"])  # every listed option is accepted
    assert "passes to srun unchanged" in text
    assert all(len(line) <= 100 for line in text.splitlines())


def _run(*argv: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "scout-srun"
    return subprocess.run(
        [str(script), *argv], check=False, capture_output=True, text=True, timeout=60
    )


def test_scout_srun_prints_usage_and_version_and_launches_nothing():
    helped = _run("--help")
    assert helped.returncode == 0 and helped.stdout == srun.usage() and helped.stderr == ""
    versioned = _run("--version")
    assert versioned.returncode == 0
    assert versioned.stdout == f"scout-srun (scout-slurm) {__version__}\n"
    bare = _run()
    assert bare.returncode == 2 and "scout-srun --help" in bare.stderr
