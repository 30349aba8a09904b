"""Shared fixtures: one real lab cluster per test session (started by the project's own code,
stopped also on failure), and helpers to submit jobs and wait for them."""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/scoutjobs.py and friends

from scout_slurm.lab.cluster import Lab, LabSpec


def ports_free(base: int, count: int) -> bool:
    for port in range(base, base + count):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port_base(count: int, lo: int = 20000, hi: int = 30000) -> int:
    """A block of `count` free local ports in [lo, hi); tests that run labs side by side use
    separate ranges (session lab 20000-30000, private labs elsewhere), below the ephemeral ports."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        base = rng.randrange(lo, hi, 10)
        if ports_free(base, count):
            return base
    raise RuntimeError(f"no free block of {count} local ports in {lo}..{hi}")


_pick_port_base = free_port_base


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
