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
    site = dataclasses.replace(
        site, epilog=dataclasses.replace(site.epilog, localise_on="batch-host")
    )
    lab = Lab(dataclasses.replace(base, site=site))
    try:
        lab.up()
        script = sj.batch_script(
            lab, train_args="--steps 40", scout_args="--scout-inject=sigkill,rank=3,step=5"
        )
        job = sj.submit(lab, script, extra=("--no-requeue",))
        sj.wait_finished(lab, job)
        shown = sj.show_json(lab, job, restart=0)
        node = sj.places(lab, job)[3].node
        assert shown["kind"] == "crash" and [(s["rank"], s["node"]) for s in shown["suspects"]] == [
            (3, node)
        ]
        assert shown["actions"]["status"] == "applied"
        drained = {
            n.name: n.reason
            for n in ops.list_nodes(timeout=10, env=lab.client_env())
            if n.is_drained
        }
        assert drained == {node: drained[node]} and drained[node].startswith("scout: crash rank 3")
        hooks_log = (lab.paths.logs / "hooks.log").read_text()
        assert '"event": "controller.done"' in hooks_log  # logged by the batch host's node Epilog
    finally:
        lab.down()
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.timeout(300)
def test_batch_host_mode_observe_only_with_planted_checkpoints_finishes_within_budget():
    """The root node Epilog of the batch host, observe-only, with the checkpoint records that once
    hung it until Slurm's Epilog timeout drained the node (/proc/kmsg ...): checked as the job's
    user
    within the budget, no recovery point among them, and `sinfo -R` empty."""
    state = Path(f"/tmp/scout-lab-batchhost-oo-{os.getpid()}")
    base = LabSpec(state_dir=state, nodes=3, port_base=_pick_port_base(5), python=sys.executable)
    site = lab_site_config(base)
    site = dataclasses.replace(
        site,
        epilog=dataclasses.replace(site.epilog, localise_on="batch-host"),
        remediation=dataclasses.replace(site.remediation, observe_only=True),
    )
    lab = Lab(dataclasses.replace(base, site=site))
    try:
        lab.up()
        pre, planted = sj.hostile_checkpoints(lab, "bh")
        script = sj.batch_script(
            lab,
            train_args="--steps 40",
            scout_args="--scout-inject=exit,rank=2,step=5,code=3",
            pre=pre,
            post=sj.PLANT,
        )
        job = sj.submit(lab, script)
        sj.wait_finished(lab, job, timeout=240)
        assert "planted 16 checkpoint records" in sj.output(lab, job)
        acts = sj.actions(lab, job, 0)
        assert acts.status.value == "observe-only"
        for a in acts.actions:
            assert not any(p in a.target or p in a.describe() for p in planted), a
        hooks_log = (lab.paths.logs / "hooks.log").read_text()
        assert (
            '"event": "epilog.checkpoint_checks"' in hooks_log
            and '"event": "controller.done"' in hooks_log
        )
        reasons = {
            n.name: n.reason
            for n in ops.list_nodes(timeout=10, env=lab.client_env())
            if n.is_drained
        }
        assert reasons == {}, (
            reasons
        )  # sinfo -R: nothing drained, not by scout, not by an Epilog timeout
        from scout_slurm.evidence.checkfiles import find_checkpoint_checks

        checks = find_checkpoint_checks(sj.folder(lab, job), 0)
        assert (
            checks is not None
            and len(checks.results) == 16
            and not [r for r in checks.results if r.verified]
        )
    finally:
        lab.down()
        shutil.rmtree(state, ignore_errors=True)
