"""A rerun that loads a checkpoint scout rejected: what the controller tells the rerun (pure), and
what the rank's checkpoint watch does when the job's own torch.load opens such a file."""

from __future__ import annotations

from pathlib import Path

from scout_slurm.bootstrap import ckptstate
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Finding, FindingKind
from scout_slurm.evidence.store import list_records, write_record
from scout_slurm.remediation.eligibility import Assessment, rerun_checkpoints
from scout_slurm.remediation.records import CheckpointNote, CheckpointStatus, RerunCheckpoints


def note(path: str, step: int, saved_at: float, restart: int = 0) -> CheckpointNote:
    return CheckpointNote(
        path=path, step=step, rank=0, restart=restart, saved_at=saved_at, size_bytes=10
    )


def test_the_rerun_is_told_of_rejected_checkpoints_still_on_storage():
    latest_bad = note("/ckpt/latest.pt", 30, 300.0)
    latest_old = note("/ckpt/latest.pt", 20, 200.0)  # the same path, overwritten since
    gone = note("/ckpt/step-25.pt", 25, 250.0)
    good = note("/ckpt/step-10.pt", 10, 100.0)
    assessments = [
        Assessment(good, CheckpointStatus.ELIGIBLE, "agreed"),
        Assessment(latest_old, CheckpointStatus.ELIGIBLE, "agreed"),
        Assessment(gone, CheckpointStatus.REJECTED, "file missing", on_storage=False),
        Assessment(latest_bad, CheckpointStatus.REJECTED, "saved at step 30, after step 27 (sdc)"),
    ]
    told = rerun_checkpoints(77, 1, assessments, assessments[0])
    assert told.recovery_point == "/ckpt/step-10.pt" and told.recovery_step == 10
    assert [(r.path, r.step, r.why) for r in told.rejected] == [
        ("/ckpt/latest.pt", 30, "saved at step 30, after step 27 (sdc)")
    ]
    # a path whose newest save is eligible is not rejected, whatever an older save was
    fixed = [
        *assessments,
        Assessment(note("/ckpt/latest.pt", 31, 310.0), CheckpointStatus.ELIGIBLE, "ok"),
    ]
    assert rerun_checkpoints(77, 1, fixed, None).rejected == ()
    assert rerun_checkpoints(77, 1, fixed, None).recovery_point == ""


def _watch(
    tmp_path: Path, restart: int, mismatch: str = "warn"
) -> tuple[ckptstate.CheckpointWatch, JobFolder]:
    folder = JobFolder(tmp_path / "evidence", "lab", 77)
    folder.findings_dir(restart).mkdir(parents=True)
    folder.results_dir.mkdir(parents=True, exist_ok=True)
    watch = ckptstate.CheckpointWatch(
        rank=0,
        world=1,
        side=None,
        notes_dir=None,
        run_dir=folder.run_dir(restart),
        restart=restart,
        offset=0,
        all_gather=lambda *a, **k: None,
        all_reduce=lambda *a, **k: None,
        groups=lambda: None,
        completed_steps=lambda: 0,
        resume_mismatch=mismatch,
        node="n1",
    )
    return watch, folder


def _told(folder: JobFolder, restart: int, path: Path) -> None:
    from scout_slurm.remediation.records import RejectedCheckpoint

    write_record(
        folder.rerun_checkpoints_path(restart),
        RerunCheckpoints(
            job_id=77,
            restart=restart,
            recovery_point="",
            recovery_step=-1,
            rejected=(
                RejectedCheckpoint(
                    str(path), 30, 0, "saved at step 30, after the first suspect step 27 (sdc)"
                ),
            ),
        ),
    )


def test_loading_a_rejected_checkpoint_is_said_loudly_once_and_recorded_as_tainted(
    tmp_path, capsys
):
    ckpt = tmp_path / "latest.pt"
    ckpt.write_bytes(b"x")
    watch, folder = _watch(tmp_path, restart=1)
    _told(folder, 1, ckpt)
    watch.loaded(str(tmp_path / "." / "latest.pt"))  # the same file, named another way
    watch.loaded(ckpt)
    err = capsys.readouterr().err
    assert err.count("TAINTED: rank 0 loaded") == 1, err
    assert (
        "a checkpoint scout rejected: saved at step 30, after the first suspect step 27 (sdc)"
        in err
    )
    assert "scout found no checkpoint it could vouch for" in err
    assert "its verdict will say `tainted`" in err
    found, _ = list_records(folder.findings_dir(1), "*.json", Finding)
    assert [f.kind for f in found] == [FindingKind.TAINTED]


def test_a_file_the_rerun_saved_itself_before_loading_is_not_tainted(tmp_path, capsys):
    ckpt = tmp_path / "latest.pt"
    ckpt.write_bytes(b"x")
    watch, folder = _watch(tmp_path, restart=1)
    _told(folder, 1, ckpt)
    watch.saved_here.add(ckptstate.canonical(ckpt))
    watch.loaded(ckpt)
    assert "TAINTED" not in capsys.readouterr().err
    # another file, or a first run, is never checked against anything
    watch.loaded(tmp_path / "other.pt")
    first, folder0 = _watch(tmp_path / "first", restart=0)
    first.loaded(ckpt)
    assert "TAINTED" not in capsys.readouterr().err


def test_an_unreadable_record_is_said_and_the_loads_go_on(tmp_path, capsys):
    watch, folder = _watch(tmp_path, restart=1)
    folder.rerun_checkpoints_path(1).write_text("{not json")
    watch.loaded(tmp_path / "latest.pt")
    assert "loads are not checked against it" in capsys.readouterr().err


def test_with_the_fatal_setting_the_rank_ends_before_its_first_step(tmp_path):
    import subprocess
    import sys
    import textwrap

    ckpt = tmp_path / "latest.pt"
    ckpt.write_bytes(b"x")
    _, folder = _watch(tmp_path, restart=1, mismatch="fatal")
    _told(folder, 1, ckpt)
    code = textwrap.dedent(
        f"""
        import torch
        from scout_slurm.bootstrap import ckptstate
        w = ckptstate.CheckpointWatch(
            rank=0, world=1, side=None, notes_dir=None, run_dir={str(folder.run_dir(1))!r},
            restart=1, offset=0, all_gather=None, all_reduce=None, groups=lambda: None,
            completed_steps=lambda: 0, resume_mismatch="fatal", node="n1")
        w.run_dir = __import__("pathlib").Path(w.run_dir)
        w.loaded({str(ckpt)!r})
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
        w.before_step(opt)
        print("trained")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 90, proc.stderr
    assert "trained" not in proc.stdout
    assert "will not train from" in proc.stderr and "SCOUT_RESUME_MISMATCH=fatal" in proc.stderr


def test_the_optimizers_own_step_count_continues_a_rerun():
    import torch

    from scout_slurm.bootstrap.runtime import optimizer_step_count

    p = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.AdamW([p], lr=0.1)
    for _ in range(4):
        p.grad = torch.ones(3)
        adam.step()
    again = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=0.1)
    again.load_state_dict(adam.state_dict())  # what a script's resume does
    assert optimizer_step_count(again) == 4
    # plain SGD keeps no count: the rerun's records then count from its own start
    assert optimizer_step_count(torch.optim.SGD([p], lr=0.1)) == 0
