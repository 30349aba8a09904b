"""scout-srun also works when the command is torchrun under srun (one task per node, two
workers each): every worker is watched, and a stalled worker is named with its node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import scoutjobs as sj

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_torchrun_under_scout_srun_names_the_stalled_worker(lab, clean_drains):
    torchrun = Path(sys.executable).parent / "torchrun"
    port = lab.spec.port_base + 9  # free: the lab uses port_base .. port_base + nodes
    script = f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={Path(sys.executable).parent}:$PATH
scout-srun --scout-stall-floor=4 --scout-inject=sleep,rank=3,step=5 -N2 --ntasks-per-node=1 \\
    {torchrun} --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port} \\
    --rdzv-id $SLURM_JOB_ID {sj.TRAIN} --steps 400
"""
    job = sj.submit(lab, script, nodes=2, tasks_per_node=1, extra=("--no-requeue",))
    sj.wait_finished(lab, job)
    places = sj.places(lab, job)
    assert {p.launcher for p in places.values()} == {"torchrun"}
    f = sj.folder(lab, job)
    assert sorted(p.name for p in f.progress_dir(0).glob("rank-*.json")) == [
        f"rank-{r}.json" for r in range(4)
    ]
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "hang", shown
    assert [s["rank"] for s in shown["suspects"]] == [3]
    # worker 3's node is the node whose watchdog published its progress
    import json

    assert shown["suspects"][0]["node"] == json.loads(f.progress_path(0, 3).read_text())["node"]
