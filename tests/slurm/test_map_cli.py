"""Issue: the rank-to-hardware map is queryable after the job is gone (real cluster)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def _scout(lab, *args):
    res = subprocess.run(
        [sys.executable, "-m", "scout_slurm.cli", *args],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.timeout(180)
def test_map_after_the_job_ended_and_the_node_was_drained(lab, clean_drains):
    job = sj.submit(lab, sj.batch_script(lab, train_args="--steps 10"))
    info = sj.wait_completed(lab, job)
    assert info.state == "COMPLETED"
    nodes = sorted(info.nodes, key=lambda n: int(n[1:]))
    # the node goes out of service: the map is read from the records, not from the node
    ops.drain_node(nodes[1], "scout: test drain for the map", timeout=10, env=lab.client_env())
    data = json.loads(_scout(lab, "map", str(job), "--json"))
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3]
    for rank, row in ranks.items():
        assert row["node"] == nodes[rank // 2]
        # the lab runs every node as `slurmd -N` on this machine: the hostname is this machine's
        assert row["hostname"] == socket.gethostname()
        assert row["local_rank"] == rank % 2
    one = json.loads(_scout(lab, "map", str(job), "--json", "--rank", "3"))
    assert [r["rank"] for r in one["ranks"]] == [3]
    history = json.loads(_scout(lab, "map", "--node", nodes[1], "--json"))
    assert {(h["job_id"], h["rank"]) for h in history} >= {(job, 2), (job, 3)}
    assert all(h["node"] == nodes[1] for h in history)
    assert "RANK" in _scout(lab, "map", str(job))
