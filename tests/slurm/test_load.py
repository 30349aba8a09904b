"""Hardening, load: 20 jobs failing at the same moment each get the right verdict and actions,
with no wrong drain."""

from __future__ import annotations

import time

import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
JOBS = 20


@pytest.mark.timeout(600)
def test_twenty_jobs_failing_at_once(lab, clean_drains):
    start_at = time.time() + 90  # every job waits for this moment, then fails at its step 3
    jobs = []
    for i in range(JOBS):
        rank = i % 2
        script = sj.batch_script(
            lab,
            train_args="--steps 40 --step-sleep 0.05",
            scout_args=f"--scout-inject=sigkill,rank={rank},step=3",
            pre=f"sleep $(( {int(start_at)} - $(date +%s) > 0 ? {int(start_at)} - $(date +%s) : 0 "
            "))",
        )
        jobs.append(
            (sj.submit(lab, script, nodes=1, tasks_per_node=2, extra=("--no-requeue",)), rank)
        )
    for job, _ in jobs:
        sj.wait_finished(lab, job, timeout=500)
    drained = {
        n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained
    }
    expected_nodes = set()
    for job, rank in jobs:
        node = sj.places(lab, job)[rank].node
        expected_nodes.add(node)
        shown = sj.show_json(lab, job, restart=0)
        assert shown["kind"] == "crash", (job, shown["reasoning"])
        assert [(s["rank"], s["node"]) for s in shown["suspects"]] == [(rank, node)], (job, shown)
        acts = sj.actions(lab, job)
        assert [a.target for a in acts.actions if a.kind.value == "drain"] == [node]
        assert acts.status.value == "applied"
    assert set(drained) == expected_nodes  # no node drained that no job's verdict named
    assert all(r.startswith("scout: crash rank ") for r in drained.values())
