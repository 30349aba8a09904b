"""Issue 40 on the real lab cluster: a 2x2 job whose evidence root stops answering for 20 s in
mid-training keeps training (its steps advance during the freeze, read from the job's own output,
which is not on the evidence root), says the stall in its output, and finishes clean after the thaw:
every rank done with code 0, a clean verdict, nothing drained.

The freeze is the one of tests/frozenfs.py, laid over the lab's evidence root: two stacked bindfs
mounts (the inner one reads the root's own folder, opened before the outer one covers it), the
inner daemon SIGSTOPped, so what touches the root waits in D state until the thaw."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import frozenfs
import pytest
import scoutjobs as sj

from scout_slurm.slurm import ops

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.torch,
    pytest.mark.slow,
    pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs"),
]
FREEZE_S = 20.0


@contextmanager
def freezable(root: Path, tmp: Path) -> Iterator[frozenfs.FrozenMount]:
    """`root` covered by a freezable mount of itself; uncovered whatever happens."""
    inner = tmp / "evidence-inner"
    inner.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([frozenfs.BINDFS, "-f", str(root), str(inner)]))
        frozenfs._wait_mounted(inner, procs[0])
        # over the root's own, non-empty folder: libfuse 2 wants that said
        cover = [frozenfs.BINDFS, "-f", "-o", "nonempty", str(inner), str(root)]
        procs.append(subprocess.Popen(cover))
        frozenfs._wait_mounted(root, procs[1])
        yield frozenfs.FrozenMount(root, inner, procs[0], procs[1])
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
        for d in (root, inner):
            if frozenfs._mounted(d):
                r = subprocess.run([frozenfs.FUSERMOUNT, "-u", str(d)], check=False)
                if r.returncode != 0:
                    subprocess.run([frozenfs.FUSERMOUNT, "-u", "-z", str(d)], check=False)
        for p in reversed(procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def last_step(text: str) -> int:
    steps = re.findall(r"^step (\d+) loss", text, flags=re.M)
    return int(steps[-1]) if steps else -1


@pytest.mark.timeout(400)
def test_a_job_keeps_training_through_a_frozen_evidence_root(lab, clean_drains, tmp_path):
    script = sj.batch_script(lab, train_args="--steps 1400 --step-sleep 0.03")
    with freezable(lab.paths.evidence, tmp_path) as fs:
        job = sj.submit(lab, script, extra=("--no-requeue",))
        deadline = time.monotonic() + 120
        while last_step(sj.output(lab, job)) < 100:
            assert time.monotonic() < deadline, sj.output(lab, job)[-3000:]
            time.sleep(0.2)
        fs.freeze()
        at_freeze = last_step(sj.output(lab, job))
        time.sleep(FREEZE_S)
        at_thaw = last_step(sj.output(lab, job))
        fs.thaw()
        sj.wait_finished(lab, job, timeout=240)
    out = sj.output(lab, job)
    print(f"\nFROZEN ROOT: step {at_freeze} at the freeze, {at_thaw} after {FREEZE_S:g} s frozen")
    # training went on while the root was frozen (about 20 steps a second unfrozen)
    assert at_thaw - at_freeze >= 100, (at_freeze, at_thaw, out[-3000:])
    assert "has not answered for" in out and "training goes on" in out, out[-3000:]
    assert all(f"rank {r}: done" in out for r in range(4)), out[-3000:]
    assert all(e.exit_code == 0 and not e.killed_by_scout for e in sj.exits(lab, job).values())
    assert sj.decision(lab, job) is None
    shown = sj.show_json(lab, job, restart=0)
    assert shown["kind"] == "clean" and shown["suspects"] == [], shown
    assert sj.drained_nodes(lab) == {}


@pytest.mark.timeout(400)
def test_a_job_past_its_time_limit_on_a_frozen_root_leaves_no_node_drained(
    lab, clean_drains, tmp_path
):
    """The root freezes in mid-training and stays frozen past the job's time limit and Slurm's
    UnkillableStepTimeout (the lab's: 30 s): Slurm ends the job, and no node is drained "Kill
    task failed" while the root is still frozen."""
    script = sj.batch_script(lab, train_args="--steps 100000 --step-sleep 0.03")
    env = lab.client_env()
    with freezable(lab.paths.evidence, tmp_path) as fs:
        job = sj.submit(lab, script, extra=("--no-requeue", "--time=1"))
        deadline = time.monotonic() + 120
        while last_step(sj.output(lab, job)) < 100:
            assert time.monotonic() < deadline, sj.output(lab, job)[-3000:]
            time.sleep(0.2)
        fs.freeze()
        frozen_at = time.monotonic()
        ended = None
        while time.monotonic() < frozen_at + 150:
            info = ops.job_info(job, timeout=10, env=env)
            if info.is_finished and ended is None:
                ended = time.monotonic()
            if ended is not None and time.monotonic() > ended + 40:
                break  # past KillWait and UnkillableStepTimeout after the end
            time.sleep(1)
        drained = sj.drained_nodes(lab)  # still frozen
        states = ops.job_info(job, timeout=10, env=env).state
        fs.thaw()
    out = sj.output(lab, job)
    print(f"\nTIME LIMIT ON A FROZEN ROOT: job {states}, drained {drained}")
    assert ended is not None, out[-3000:]
    assert "has not answered for" in out, out[-3000:]
    assert drained == {}, (drained, out[-3000:])
