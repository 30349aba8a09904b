"""Operator commands on the real cluster: `scout undrain` returns only nodes scout drained;
`scout incidents` lists incidents with the nodes drained."""

from __future__ import annotations

import subprocess
import sys

import pytest

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm]


def _scout(lab, *args):
    return subprocess.run(
        [sys.executable, "-m", "scout_slurm.cli", *args],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    )


@pytest.mark.timeout(60)
def test_undrain_only_returns_what_scout_drained(lab):
    env = lab.client_env()
    try:
        ops.drain_node("n3", "hardware ticket 4711: fan", timeout=10, env=env)
        ops.drain_node(
            "n4", "scout: crash rank 2 job 1 run 0 conf 0.95 see /x", timeout=10, env=env
        )
        refused = _scout(lab, "undrain", "n3")
        assert refused.returncode == 1
        assert (
            "drained by someone else" in refused.stderr and "hardware ticket 4711" in refused.stderr
        )
        assert ops.node_info("n3", timeout=10, env=env).is_drained
        dry = _scout(lab, "undrain", "n4", "--dry-run")
        assert dry.returncode == 0 and "would resume n4" in dry.stdout
        assert ops.node_info("n4", timeout=10, env=env).is_drained
        done = _scout(lab, "undrain", "n4")
        assert done.returncode == 0 and "resumed n4" in done.stdout
        assert not ops.node_info("n4", timeout=10, env=env).is_drained
        again = _scout(lab, "undrain", "n4")
        assert again.returncode == 0 and "not drained" in again.stdout
    finally:
        for n in ("n3", "n4"):
            if ops.node_info(n, timeout=10, env=env).is_drained:
                ops.resume_node(n, timeout=10, env=env)
