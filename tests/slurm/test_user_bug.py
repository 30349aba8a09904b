"""Issue 42 on the real lab cluster (the lab drains on the job's evidence, `drain_on =
"job-evidence"`, restart limit 2): a bug in the user's script is not a node's fault, and a rerun
that loads a checkpoint scout rejected is never called clean.

The jobs are the user's own script (tests/jobs/train_user_bug.py: DDP, AdamW), not scout's demo."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scoutjobs as sj

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]
SCRIPT = Path(__file__).resolve().parents[1] / "jobs" / "train_user_bug.py"
RAISE_LINE = next(
    i
    for i, line in enumerate(SCRIPT.read_text().splitlines(), 1)
    if line.strip().startswith("raise ValueError")
)
SITE = f"ValueError at train_user_bug.py:{RAISE_LINE} in check_batch"


def _show_text(lab, job: int) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "scout_slurm.cli", "show", str(job)],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def _decisions(lab, job: int) -> list[Path]:
    return sorted(sj.folder(lab, job).results_dir.glob("drain-decisions-*.json"))


@pytest.mark.timeout(420)
def test_a_deterministic_bug_is_software_drains_nothing_and_stops_after_one_rerun(
    lab, clean_drains
):
    """The same ValueError on rank 1 at step 5 of every run; beside it, a bug that passes (first
    run only), which gets its one rerun and completes."""
    bug = sj.submit(lab, sj.batch_script(lab, train=SCRIPT, train_args="--steps 12"))
    passing = sj.submit(
        lab, sj.batch_script(lab, train=SCRIPT, train_args="--steps 12 --transient")
    )
    info = sj.wait_completed(lab, bug, timeout=300)
    assert info.state == "FAILED" and info.restart_count == 1, info
    for run in (0, 1):
        v = sj.verdict(lab, bug, run)
        assert v.kind.value == "crash" and [s.rank for s in v.suspects] == [1], v
        assert v.cause.value == "software" and v.fault_site == SITE, v
        assert "ValueError" in v.cause_evidence
    first, second = sj.actions(lab, bug, 0), sj.actions(lab, bug, 1)
    assert [a.kind.value for a in first.actions] == ["requeue"], first
    assert any("cause software" in h for h in first.held_back), first.held_back
    assert second.actions == ()
    assert any(
        f"the same {SITE}, step 6, on run 0 and run 1: a bug, not a node" in h
        for h in second.held_back
    ), second.held_back
    # nothing drained, excluded, watched or put in the nodes' history
    assert sj.drained_nodes(lab) == {}
    assert not info.excluded_nodes
    assert _decisions(lab, bug) == []
    out = sj.output(lab, bug)
    assert f"rank 1 failed with the same {SITE} as on run 0" in out, out[-4000:]
    assert "a bug in the script, not a node's fault" in out
    # the story opens on the incident, then the run that ended the job
    text = _show_text(lab, bug)
    assert text.startswith(f"job {bug}: 2 runs"), text[:2000]
    assert re.search(r"run 0 on \S+: crash: rank 1 on \S+; cause software", text), text[:2000]
    assert "reran as run 1" in text and "the job ended here" in text

    done = sj.wait_completed(lab, passing, timeout=300)
    assert done.state == "COMPLETED" and done.restart_count == 1, done
    assert sj.verdict(lab, passing, 0).cause.value == "software"
    assert sj.verdict(lab, passing, 1).kind.value == "clean"
    assert _decisions(lab, passing) == [] and sj.drained_nodes(lab) == {}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("policy", ["warn", "fatal"])
def test_a_rerun_that_loads_a_rejected_checkpoint_is_tainted_or_refused(lab, clean_drains, policy):
    """Rank 0's weights flipped at step 6, found by the vote at step 10; the script saved its one
    file at step 8 (after the first suspect step) and the rerun loads it as the script decides."""
    ckpt = lab.paths.work / f"latest-{policy}-{time.time_ns()}.pt"
    script = sj.batch_script(
        lab,
        train=SCRIPT,
        train_args=f"--steps 16 --rank -1 --ckpt {ckpt} --ckpt-every 4",
        scout_args="--scout-consensus-every=5 "
        "--scout-inject=bitflip,rank=0,step=6,bit=30,target=weights",
        pre=f"export SCOUT_RESUME_MISMATCH={policy}",
    )
    job = sj.submit(lab, script)
    info = sj.wait_completed(lab, job, timeout=300)
    v0 = sj.verdict(lab, job, 0)
    assert v0.kind.value == "sdc" and v0.cause.value == "hardware", v0
    out = sj.output(lab, job)
    loud = f"TAINTED: rank 0 loaded {ckpt} (step 8 of run 0), a checkpoint scout rejected"
    assert loud in out, out[-5000:]
    assert "scout found no checkpoint it could vouch for" in out
    v1 = sj.verdict(lab, job, 1)
    if policy == "warn":
        assert info.state == "COMPLETED", info
        assert v1.kind.value == "tainted", (v1.reasoning, out[-3000:])
        assert any("loaded a checkpoint scout had rejected" in r for r in v1.reasoning)
        assert "rank 0: done" in out
        # one step count: the rerun loaded step 8 as the script chose and continued the
        # optimizer's own count, so its saves are steps 12 and 16, never its own 4 and 8 again
        res = subprocess.run(
            [sys.executable, "-m", "scout_slurm.cli", "checkpoints", str(job), "--json"],
            capture_output=True,
            text=True,
            env=lab.client_env(),
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        steps = sorted((c["run"], c["step"]) for c in json.loads(res.stdout)["checkpoints"])
        assert [st for run, st in steps if run == 1] == [12, 16], steps
        assert [st for run, st in steps if run == 0] == [4, 8], steps
    else:
        assert "will not train from" in out and "SCOUT_RESUME_MISMATCH=fatal" in out
        exits = sj.exits(lab, job, 1)
        assert exits and all(e.exit_code == 90 for e in exits.values()), exits
        assert v1.kind.value != "clean"


@pytest.mark.timeout(300)
def test_a_user_listening_on_the_ports_of_the_next_jobs_causes_no_incident(lab, clean_drains):
    """Issue 40: the rendezvous port was computed from the public job id; a tenant listening on the
    ports of the next job ids failed other users' jobs (EADDRINUSE) and made incidents on their
    nodes. scout-srun now draws the port at random for each step: the squatter misses."""
    import socket

    from scout_slurm.task.shim import master_port

    # the last job id handed out: a trivial job's (Slurm forgets finished jobs from its list)
    last = sj.submit(lab, "#!/bin/bash\ntrue\n", nodes=1, tasks_per_node=1)
    squatted = []
    try:
        for job in range(last + 1, last + 9):
            for step in range(8):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("0.0.0.0", master_port(job, step)))
                except OSError:
                    s.close()
                    continue
                s.listen()
                squatted.append(s)
        job = sj.submit(lab, sj.batch_script(lab, train=SCRIPT, train_args="--steps 100 --rank -1"))
        assert last < job <= last + 8, (last, job)  # its old port is among the squatted ones
        # while it trains, `scout show` says it is running (not "the job failed")
        sj.wait_progress(lab, job, 0, steps=3)
        text = _show_text(lab, job)
        assert f"job {job} run 0 is running: no verdict yet" in text, text[:2000]
        assert "failed" not in text.split("timeline")[0], text[:2000]
        info = sj.wait_completed(lab, job, timeout=240)
        assert info.state == "COMPLETED" and info.restart_count == 0, (info, sj.output(lab, job))
        assert sj.verdict(lab, job, 0).kind.value == "clean"
        port = sj.places(lab, job, 0)[0].master_port
        assert port not in {s.getsockname()[1] for s in squatted}
        assert sj.drained_nodes(lab) == {} and _decisions(lab, job) == []
    finally:
        for s in squatted:
            s.close()


@pytest.mark.timeout(300)
def test_a_hang_in_the_users_own_code_is_software_not_a_nodes(lab, clean_drains):
    """Rank 1 waits forever in the script's own polling loop at step 5 of every run: scout calls
    the hang, and its dumped stack stands in the job's code: cause software, nothing drained, one
    rerun, then stopped (the same hang at the same place)."""
    job = sj.submit(
        lab,
        sj.batch_script(
            lab, train=SCRIPT, train_args="--steps 12 --hang", scout_args="--scout-stall-floor=4"
        ),
    )
    info = sj.wait_completed(lab, job, timeout=260)
    assert info.restart_count == 1, info
    for run in (0, 1):
        v = sj.verdict(lab, job, run)
        assert v.kind.value == "hang" and [s.rank for s in v.suspects] == [1], v
        assert v.cause.value == "software", v
        assert v.fault_site.startswith(
            "hang at train_user_bug.py:"
        ) and "wait_for_the_next_shard" in (v.fault_site), v
    assert [a.kind.value for a in sj.actions(lab, job, 0).actions] == ["requeue"]
    assert sj.actions(lab, job, 1).actions == ()
    assert sj.drained_nodes(lab) == {} and _decisions(lab, job) == []
