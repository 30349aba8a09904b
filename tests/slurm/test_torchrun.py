"""torchrun under scout-srun (one Slurm task per node, two workers each) on the real lab, running
the Hugging Face Trainer (transformers 5, its own loop): each worker is a rank with its own exit
record (from torchrun's agent, scout_slurm/bootstrap/agent.py), so a clean run is clean, a worker's
exit is named with its code, a stalled or stopped worker is named and no worker is left behind.
torchrun's own restarts (--max-restarts) are recorded per attempt from a real torchrun in
tests/torch/test_torchrun_agent.py: on this one machine torchrun's second attempt fails its gloo
start without scout too when a worker dies early (measured), so it is not a lab test here."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import scoutjobs as sj

from scout_slurm.localise.verdict import is_cascade

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
TORCHRUN = Path(sys.executable).parent / "torchrun"


HF_TRAINER = sj.TRAIN.parent / "train_hf.py"


def _torchrun_job(
    lab,
    *,
    port: int,
    steps: int,
    scout: str = "",
    torchrun: str = "",
    nodes: int = 2,
    train: str = "",
) -> int:
    """A torchrun job of `nodes` nodes x 2 workers; `port`: its rendezvous port (above the
    lab's); `train`: the training script and its arguments (default: the demo's script)."""
    train = train or f"{sj.TRAIN} --steps {steps}"
    script = f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={Path(sys.executable).parent}:$PATH
scout-srun --scout-stall-floor=4 --scout-consensus-every=5 {scout} -N{nodes} --ntasks-per-node=1 \\
    {TORCHRUN} --nnodes {nodes} --nproc-per-node 2 --rdzv-backend c10d {torchrun} \\
    --rdzv-endpoint 127.0.0.1:{lab.spec.port_base + port} --rdzv-id $SLURM_JOB_ID \\
    {train}
"""
    return sj.submit(lab, script, nodes=nodes, tasks_per_node=1, extra=("--no-requeue",))


def _workers_left(marker: str) -> list[int]:
    """Training processes of a job (`marker`: a part of its command line no other job has) still
    running on this machine."""
    mine = marker.encode()
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if mine in cmd and b"torchrun" not in cmd:
            left.append(int(pid))
    return left


@pytest.mark.timeout(300)
def test_a_clean_torchrun_job_is_clean_and_a_workers_exit_is_named_with_its_code(lab, clean_drains):
    """The Hugging Face Trainer under torchrun (transformers 5, its own loop, checkpoint folders,
    2 nodes x 2 workers): clean is clean; a worker's exit is named with its code. Its peers fail
    on the broken connection with code 1 (before torchrun stops them): each worker's own lines of
    the task's output ("[rankN]:") make those cascades (it was `inconclusive` in 2 of 3 runs when
    only a lone failing worker got the task's output)."""
    pytest.importorskip("transformers", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    out = lab.paths.work / f"hf-{time.time_ns()}"
    hf = f"{HF_TRAINER} --steps 16 --save-every 10 --out {out}"
    clean = _torchrun_job(lab, port=9, steps=16, train=hf + "-clean")
    crash = _torchrun_job(
        lab,
        port=10,
        steps=40,
        scout="--scout-inject=exit,rank=2,step=5,code=3",
        train=f"{HF_TRAINER} --steps 40 --save-every 100 --out {out}-crash",
    )
    sj.wait_finished(lab, clean)
    sj.wait_finished(lab, crash)
    v = sj.verdict(lab, clean, 0)
    assert v.kind.value == "clean", (v, sj.output(lab, clean)[-3000:])
    exits = sj.exits(lab, clean)
    assert sorted((r, e.exit_code) for r, e in exits.items()) == [(r, 0) for r in range(4)]

    v = sj.verdict(lab, crash, 0)
    assert v.kind.value == "crash" and [s.rank for s in v.suspects] == [2], (
        v,
        sj.output(lab, crash)[-3000:],
    )
    exits = sj.exits(lab, crash)
    assert exits[2].exit_code == 3 and not exits[2].external_termination, exits[2]
    # its neighbour was stopped by torchrun after rank 2 failed (the other node's workers failed
    # in their next collective: cascades); none of them is a suspect
    assert exits[3].external_termination and exits[3].signal == 15, exits[3]
    # every other worker's exit reads as a cascade from its own lines, whatever the timing (CI
    # once saw rank 1's code-1 exit named: its record held torchrun's summary, not its lines)
    assert all(is_cascade(e) for r, e in exits.items() if r != 2), exits
    assert "ChildFailedError" not in exits[2].exception, exits[2]  # torchrun's, not the worker's
    node = json.loads(sj.folder(lab, crash).progress_path(0, 2).read_text())["node"]
    assert v.suspects[0].node == node
    assert "exit code 3" in " ".join(v.reasoning) or "code 3" in " ".join(v.reasoning), v.reasoning


@pytest.mark.timeout(300)
def test_a_stopped_worker_is_named_and_no_worker_is_left_behind(lab, clean_drains):
    """The Hugging Face Trainer under torchrun, worker rank 3 stopped (SIGSTOP) at step 5: named
    as a hang on its node, and scout ends the stopped worker with its agent."""
    pytest.importorskip("transformers", reason="pip install -e '.[frameworks]' (scripts/setup.sh)")
    out = lab.paths.work / f"hf-stop-{time.time_ns()}"
    stopped = _torchrun_job(
        lab,
        port=11,
        steps=433,
        scout="--scout-inject=stop,rank=3,step=5",
        train=f"{HF_TRAINER} --steps 433 --save-every 1000 --out {out}",
    )
    t0 = time.monotonic()
    sj.wait_finished(lab, stopped)
    took = time.monotonic() - t0
    shown = sj.show_json(lab, stopped, restart=0)
    assert shown["kind"] == "hang" and [s["rank"] for s in shown["suspects"]] == [3], (
        shown,
        sj.output(lab, stopped)[-3000:],
    )
    node = json.loads(sj.folder(lab, stopped).progress_path(0, 3).read_text())["node"]
    assert shown["suspects"][0]["node"] == node
    # scout ended the stopped worker with its agent: nothing keeps the step's output open
    assert _workers_left(f"--out {out}") == [], "a worker outlived its job"
    exits = sj.exits(lab, stopped)
    assert sorted(exits) == [0, 1, 2, 3] and exits[3].killed_by_scout, exits.get(3)
    print(f"stopped worker: job ended {took:.1f} s after submission")
