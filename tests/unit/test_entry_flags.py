"""`--version` and `--help` on the entry points without options of their own (the hooks,
scout-task): answered before anything reads the environment, and only when the flag is the whole
argument list (a training command that ends in `--version` is the job's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scout_slurm import __version__
from scout_slurm.entry import answered

MODULES = {
    "scout-task": "scout_slurm.task.shim",
    "scout-prolog": "scout_slurm.hooks.prolog",
    "scout-epilog": "scout_slurm.hooks.epilog",
    "scout-epilog-slurmctld": "scout_slurm.hooks.controller",
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_version_and_help_without_slurm(name):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SCOUT"))}
    for flag, want in (("--version", f"{name} (scout-slurm) {__version__}\n"), ("--help", None)):
        res = subprocess.run(
            [sys.executable, "-m", MODULES[name], flag],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert res.returncode == 0 and res.stderr == "", (flag, res)
        if want is not None:
            assert res.stdout == want
        else:
            assert res.stdout.startswith(f"usage: {name}") and "Example" in res.stdout, res.stdout


def test_a_command_is_not_a_flag(capsys):
    assert not answered("scout-task", ["--", "python", "--version"])
    assert not answered("scout-task", ["python", "--help"])
    assert not answered("scout-prolog", [])
    assert capsys.readouterr().out == ""
