"""Sites whose controller cannot read the evidence: the batch host's node Epilog localises and
applies the plan instead (`[epilog] localise_on = "batch-host"`), with the same code. Uses its own
small lab, configured that way."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from pathlib import Path

import pytest

import scoutjobs as sj
from conftest import _pick_port_base
from scout_slurm.lab.cluster import Lab, LabSpec, lab_site_config
from scout_slurm.slurm import ops

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


@pytest.mark.timeout(240)
def test_batch_host_epilog_localises_and_drains():
    state = Path(f"/tmp/scout-lab-batchhost-{os.getpid()}")
    base = LabSpec(state_dir=state, nodes=3, port_base=_pick_port_base(5), python=sys.executable)
    site = lab_site_config(base)
    site = dataclasses.replace(site, epilog=dataclasses.replace(site.epilog, localise_on="batch-host"))
    lab = Lab(dataclasses.replace(base, site=site))
    try:
        lab.up()
        script = sj.batch_script(lab, train_args="--steps 40", scout_args="--scout-inject=sigkill,rank=3,step=5")
        job = sj.submit(lab, script, extra=("--no-requeue",))
        sj.wait_finished(lab, job)
        shown = sj.show_json(lab, job, restart=0)
        node = sj.places(lab, job)[3].node
        assert shown["kind"] == "crash" and [(s["rank"], s["node"]) for s in shown["suspects"]] == [(3, node)]
        assert shown["actions"]["status"] == "applied"
        drained = {n.name: n.reason for n in ops.list_nodes(timeout=10, env=lab.client_env()) if n.is_drained}
        assert drained == {node: drained[node]} and drained[node].startswith("scout: crash rank 3")
        hooks_log = (lab.paths.logs / "hooks.log").read_text()
        assert '"event": "controller.done"' in hooks_log  # logged by the batch host's node Epilog
    finally:
        lab.down()
        shutil.rmtree(state, ignore_errors=True)
