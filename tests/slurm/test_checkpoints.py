"""Issue (checkpoints): the rerun resumes from the eligible checkpoint, not the newest file, scout
verifies the restored state against the checkpoint's record, and the run ends bit for bit (model,
optimizer, LR schedule, RNG streams) where an uninterrupted run ends; a file changed on disk is
rejected."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import scoutjobs as sj

pytestmark = [pytest.mark.slurm, pytest.mark.torch, pytest.mark.slow]


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


@pytest.mark.timeout(300)
def test_resume_from_the_eligible_checkpoint_bit_for_bit(lab, clean_drains):
    tag = time.time_ns()
    ckpt, final, ref = (
        lab.paths.work / f"ck-{tag}",
        lab.paths.work / f"final-{tag}.txt",
        lab.paths.work / f"ref-{tag}.txt",
    )
    train = f"--steps 30 --momentum 0.9 --sched --ckpt-dir {ckpt} --ckpt-every 5"
    # rank 0 (the one that saves) is corrupted at step 12: checkpoint 15 holds the corruption;
    # votes every 10 steps: clean at 10, the outlier is named at 20
    job = sj.submit(
        lab,
        sj.batch_script(
            lab,
            train_args=f"{train} --out {final}",
            scout_args="--scout-consensus-every=10 --scout-inject=bitflip,bit=3,rank=0,step=12",
        ),
    )
    sj.wait_finished(lab, job)
    v0 = sj.show_json(lab, job, restart=0)
    assert v0["kind"] == "sdc" and [s["rank"] for s in v0["suspects"]] == [0]
    assert v0["first_suspect_step"] == 11  # the step after the last clean vote
    info = sj.wait_completed(lab, job)
    assert info.state == "COMPLETED" and info.restart_count == 1
    out = sj.output(lab, job)
    assert out.count(f"resumed from {ckpt}/step-10.pt at step 10") == 4, out[-3000:]
    # every rank of the rerun signed what it restored: equal to the record of step 10
    resumed = sj.show_json(lab, job, restart=1)["resume"]
    assert sorted(f["rank"] for f in resumed) == [0, 1, 2, 3], resumed
    for f in resumed:
        assert f["summary"].startswith(
            f"resume verified: rank {f['rank']} restored {ckpt}/step-10.pt (step 10)"
        ), f
        assert (
            "model, optimizer, scheduler, rng_cpu" in f["summary"] and "differ" not in f["summary"]
        ), f
    assert _scout(lab, "show", str(job)).count("resume verified: rank") == 4
    listing = json.loads(_scout(lab, "checkpoints", str(job), "--json"))
    status = {(c["run"], c["step"]): (c["status"], c["reason"]) for c in listing["checkpoints"]}
    assert status[(0, 10)][0] == "eligible"
    ten = [c for c in listing["checkpoints"] if (c["run"], c["step"]) == (0, 10)][0]
    assert ten["schema_version"] == 2 and ten["agreement"] == "agreed" and ten["ranks_saved"] == [0]
    assert {"model", "optimizer", "scheduler", "rng_cpu", "data"} <= set(ten["signatures"]) and ten[
        "world"
    ] == 4
    assert (
        ten["software"]["torch"]
        and ten["coverage"]["votes"] == 1
        and ten["coverage"]["last_clean_step"] == 10
    )
    # run 0's step 15 held the corruption; the rerun has since overwritten the same file name, so
    # either reason rejects it
    assert status[(0, 15)][0] == "rejected"
    assert "first suspect step 11" in status[(0, 15)][1] or "changed on disk" in status[(0, 15)][1]
    assert status[(1, 30)][0] in ("eligible", "candidate")
    # an uninterrupted run of the same job ends with the same bits
    clean = sj.submit(
        lab, sj.batch_script(lab, train_args=f"--steps 30 --momentum 0.9 --sched --out {ref}")
    )
    assert sj.wait_completed(lab, clean).state == "COMPLETED"
    assert final.read_text() == ref.read_text()
    # a checkpoint file changed on disk after its note is rejected, with the reason
    with open(ckpt / "step-10.pt", "ab") as fh:
        fh.write(b"\0")
    listing = json.loads(_scout(lab, "checkpoints", str(job), "--json"))
    changed = [c for c in listing["checkpoints"] if c["run"] == 0 and c["step"] == 10][0]
    assert (
        changed["status"] == "rejected" and "changed on disk after its record" in changed["reason"]
    )


@pytest.mark.timeout(600)
def test_atomic_saves_are_eligible_under_their_final_names_and_resumed_bit_for_bit(
    lab, clean_drains
):
    """torch.save to NAME.tmp, then os.replace (or shutil.move) to NAME, as most training code
    saves:
    the records name NAME (the .tmp name is gone, and a record of it was never a recovery point),
    the controller resumes from NAME, and the rerun ends where an uninterrupted run does."""
    from scout_slurm.evidence.store import list_records
    from scout_slurm.remediation.records import CheckpointNote

    tag = time.time_ns()
    ref = lab.paths.work / f"ref-atomic-{tag}.txt"
    jobs = {}
    for how in ("replace", "move"):
        ckpt, final = lab.paths.work / f"ck-{how}-{tag}", lab.paths.work / f"final-{how}-{tag}.txt"
        train = (
            f"--steps 30 --momentum 0.9 --sched --ckpt-dir {ckpt} --ckpt-every 5 --atomic-save "
            f"{how}"
        )
        # as in the test above: rank 0 corrupted at step 12, clean vote at 10, outlier named at 20
        jobs[how] = (
            sj.submit(
                lab,
                sj.batch_script(
                    lab,
                    train_args=f"{train} --out {final}",
                    scout_args="--scout-consensus-every=10 "
                    "--scout-inject=bitflip,bit=3,rank=0,step=12",
                ),
            ),
            ckpt,
            final,
        )
    clean = sj.submit(
        lab, sj.batch_script(lab, train_args=f"--steps 30 --momentum 0.9 --sched --out {ref}")
    )
    for how, (job, ckpt, _final) in jobs.items():
        sj.wait_finished(lab, job, restart=0, timeout=300)
        info = sj.wait_completed(lab, job, timeout=300)
        assert info.state == "COMPLETED" and info.restart_count == 1, (
            how,
            sj.output(lab, job)[-3000:],
        )
        out = sj.output(lab, job)
        assert out.count(f"resumed from {ckpt}/step-10.pt at step 10") == 4, (how, out[-3000:])
        resumed = sj.show_json(lab, job, restart=1)["resume"]
        assert sorted(f["rank"] for f in resumed) == [0, 1, 2, 3], (how, resumed)
        for f in resumed:
            assert f["summary"].startswith(
                f"resume verified: rank {f['rank']} restored {ckpt}/step-10.pt (step 10)"
            ), f
            assert (
                "model, optimizer, scheduler, rng_cpu" in f["summary"]
                and "differ" not in f["summary"]
            ), f
        listing = json.loads(_scout(lab, "checkpoints", str(job), "--json"))
        rows = {(c["run"], c["step"]): c for c in listing["checkpoints"]}
        assert all(not c["path"].endswith(".tmp") for c in listing["checkpoints"]), (how, listing)
        assert (
            rows[(0, 10)]["path"] == f"{ckpt}/step-10.pt"
            and rows[(0, 5)]["path"] == f"{ckpt}/step-5.pt"
        )
        assert rows[(0, 10)]["status"] == "eligible" and rows[(0, 5)]["status"] == "eligible", (
            how,
            rows,
        )
        assert rows[(0, 15)]["status"] == "rejected" and rows[(1, 30)]["status"] in (
            "eligible",
            "candidate",
        )
        assert rows[(1, 30)]["path"] == f"{ckpt}/step-30.pt"
        # the record says which name the bytes were written under
        f = sj.folder(lab, job)
        notes, errors = list_records(f.checkpoints_dir, "*.json", CheckpointNote, root=f.root)
        assert not errors and notes, errors
        assert {5, 10, 15} <= {n.step for n in notes if n.restart == 0}
        assert all(n.saved_as == f"{n.path}.tmp" for n in notes), (
            how,
            [(n.path, n.saved_as) for n in notes],
        )
        assert not any(p.name.endswith(".tmp") for p in ckpt.iterdir())
    assert sj.wait_completed(lab, clean).state == "COMPLETED"
    for how, (_job, _ckpt, final) in jobs.items():
        assert final.read_text() == ref.read_text(), how
