"""Shared fixtures: one real lab cluster per test session (started by the project's own code,
stopped also on failure), and helpers to submit jobs and wait for them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/scoutjobs.py and friends

from scout_slurm.lab.cluster import Lab, LabSpec, free_port_base  # noqa: F401 - tests import it from here


_pick_port_base = free_port_base


def up_or_skip(cluster: Lab) -> None:
    """Start a lab; skip (saying why) where this machine refuses network namespaces."""
    from scout_slurm.errors import LabError
    try:
        cluster.up()
    except LabError as exc:
        text = str(exc)
        if "refuses network namespaces" in text or "needs root with CAP_NET_ADMIN" in text:
            pytest.skip(f"network namespaces are refused here: {text}")
        raise


@pytest.fixture(autouse=True)
def _default_logging():
    """Each test starts with the library's default logging (info, to stderr): a `scout` command run
    in-process sets the operator level (warnings only) for the rest of its process."""
    from scout_slurm.log import configure
    configure()
    yield


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Lab:
    """A real 4-node Slurm cluster for the whole session, stopped (and its folder removed) at the
    end, also when a test or the start itself fails."""
    import shutil
    state = Path(f"/tmp/scout-lab-test-{os.getpid()}")
    spec = LabSpec(state_dir=state, nodes=4, port_base=_pick_port_base(6), python=sys.executable,
                   cpus_per_node=16)  # room for the load test: 20 two-rank jobs at once
    cluster = Lab(spec)
    try:
        cluster.up()
        yield cluster
    finally:
        try:
            cluster.down()
        finally:
            if not os.environ.get("SCOUT_KEEP_LAB"):
                shutil.rmtree(state, ignore_errors=True)


@pytest.fixture()
def lab_env(lab) -> dict[str, str]:
    return lab.client_env()


@pytest.fixture()
def clean_drains(lab):
    """Nodes that scout drained during a test are returned to service after it, also on failure."""
    from scoutjobs import resume_scout_drains
    yield
    resume_scout_drains(lab)
