"""`scout lab` error paths with click's CliRunner; nothing here starts a daemon."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from scout_slurm.cli import main


@pytest.fixture()
def runner() -> CliRunner:
    return CliRunner()


def test_help_lists_the_lab_commands(runner):
    res = runner.invoke(main, ["lab", "--help"])
    assert res.exit_code == 0
    for command in ("up", "down", "status"):
        assert f"  {command} " in res.stdout


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_status_of_an_empty_dir_is_a_one_line_error(runner, tmp_path, extra):
    res = runner.invoke(main, ["lab", "status", "--state-dir", str(tmp_path), *extra])
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: no lab cluster in {tmp_path.resolve()}: start one with "
        f"`scout lab up --state-dir {tmp_path.resolve()}`\n"
    )
    assert "Traceback" not in res.output
    assert res.exception is not None and type(res.exception) is SystemExit


def test_down_of_an_empty_dir_stops_nothing(runner, tmp_path):
    res = runner.invoke(main, ["lab", "down", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0
    assert res.stdout == f"lab down: stopped 0 process(es) of {tmp_path.resolve()}\n"
    assert list(tmp_path.iterdir()) == []  # down creates nothing


def test_up_on_a_busy_port_is_a_one_line_error(runner, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = runner.invoke(
            main,
            [
                "lab",
                "up",
                "--nodes",
                "1",
                "--port-base",
                str(port),
                "--state-dir",
                str(tmp_path / "lab"),
            ],
        )
    assert res.exit_code == 1
    assert res.stdout == ""
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("Error: ")
    # with Slurm installed the port check speaks; without it, the install check does
    assert (
        f"port(s) {port}" in line and "choose another --port-base" in line
    ) or "apt-get install" in line
    assert not (tmp_path / "lab").exists()  # nothing was created before the check


@pytest.mark.parametrize("args", [["--nodes", "0"], ["--nodes", "x"], ["--port-base", "80"]])
def test_up_rejects_bad_options(runner, tmp_path, args):
    res = runner.invoke(main, ["lab", "up", "--state-dir", str(tmp_path), *args])
    assert res.exit_code == 2 and "Invalid value" in res.stderr
    assert list(tmp_path.iterdir()) == []
