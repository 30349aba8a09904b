"""`scout lab up / status / down` through the installed `scout` command, on a private state dir."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scout_slurm.lab.cluster import Lab, LabSpec, free_port_base

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(120)]

SCOUT = str(Path(sys.executable).parent / "scout")


def scout(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SCOUT, *args], capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )


@pytest.fixture()
def state_dir():
    path = Path(tempfile.mkdtemp(prefix="scout-lab-cli-", dir="/tmp"))
    try:
        yield path
    finally:
        Lab(LabSpec(state_dir=path)).down()
        shutil.rmtree(path, ignore_errors=True)


def test_scout_lab_up_status_down(state_dir):
    port = free_port_base(3, 17000, 20000)  # not the session lab's 20000-30000
    up = scout("lab", "up", "--nodes", "2", "--state-dir", str(state_dir), "--port-base", str(port))
    assert up.returncode == 0, up.stderr
    conf = state_dir / "etc" / "slurm.conf"
    assert up.stdout.splitlines()[-1] == f"export SLURM_CONF={conf}"
    assert f"export SCOUT_CONFIG={state_dir / 'etc' / 'scout.toml'}" in up.stdout.splitlines()
    assert f"slurmctld on 127.0.0.1:{port}" in up.stderr
    assert f"SlurmctldPort={port}\n" in conf.read_text()

    status = scout("lab", "status", "--state-dir", str(state_dir), "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert data["state_dir"] == str(state_dir) and data["slurm_conf"] == str(conf)
    assert set(data["daemons"]) == {"munged", "slurmctld", "slurmd-n1", "slurmd-n2"}
    assert all(d["alive"] for d in data["daemons"].values())
    assert [(n["name"], n["state"]) for n in data["nodes"]] == [("n1", "IDLE"), ("n2", "IDLE")]

    text = scout("lab", "status", "--state-dir", str(state_dir))
    assert text.returncode == 0
    assert (
        "slurmctld" in text.stdout and "running" in text.stdout and "n2       IDLE" in text.stdout
    )

    down = scout("lab", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert down.stdout.startswith("lab down: stopped ") and " 0 process" not in down.stdout
    assert Lab(LabSpec(state_dir=state_dir)).running_pids() == []

    after = json.loads(scout("lab", "status", "--state-dir", str(state_dir), "--json").stdout)
    assert after["daemons"] == {} and after["nodes"] == []


def test_scout_lab_up_slurm_release_and_down(state_dir, pytestconfig):
    """`scout lab up --slurm R`: the exports name the root the door runs Slurm from; down leaves
    nothing.
    """
    from conftest import leftovers

    releases = [
        r
        for r in pytestconfig.getoption("--slurm-releases").split(",")
        if r.strip() not in ("", "none")
    ]
    if not releases:
        pytest.skip("--slurm-releases none")
    release = releases[0]
    port = free_port_base(3, 17000, 20000)
    up = scout(
        "lab",
        "up",
        "--slurm",
        release,
        "--nodes",
        "2",
        "--state-dir",
        str(state_dir),
        "--port-base",
        str(port),
    )
    assert up.returncode == 0, up.stderr
    assert f"export SCOUT_SLURM_ROOT={state_dir / 'rootfs'}" in up.stdout.splitlines()
    assert f"slurm-wlm {release}." in up.stderr
    status = json.loads(scout("lab", "status", "--state-dir", str(state_dir), "--json").stdout)
    assert [(n["name"], n["state"]) for n in status["nodes"]] == [("n1", "IDLE"), ("n2", "IDLE")]
    down = scout("lab", "down", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stderr
    assert leftovers(Lab(LabSpec(state_dir=state_dir))) == {
        "processes": [],
        "mounts": [],
        "namespaces": [],
    }


def test_scout_lab_up_refuses_an_unknown_release(state_dir):
    up = scout("lab", "up", "--slurm", "23.02", "--state-dir", str(state_dir))
    assert up.returncode != 0
    assert "Slurm '23.02' is not one the lab can run" in up.stderr and "24.11, 26.05" in up.stderr
