"""A checkpoint saved under one name and renamed (the atomic save: NAME.tmp, then os.replace to
NAME; a DCP folder step-10.tmp/ renamed to step-10/) is recorded under the name it ends up with,
so the final file is what the Epilog verifies and the recovery rule picks. The job's renames
behave exactly as before, errors included. (A CheckpointWatch of one rank, the hooks' rename
patches on a handle, plain files in tmp_path.)"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from scout_slurm.bootstrap import ckptstate, patches
from scout_slurm.bootstrap.ckptstate import CheckpointWatch, files_of
from scout_slurm.evidence.checkfiles import file_problem
from scout_slurm.evidence.store import read_record
from scout_slurm.remediation.eligibility import CheckpointStatus, assess
from scout_slurm.remediation.records import Agreement, CheckpointNote

ORIGINALS = (os.rename, os.replace, shutil.move)


def make_watch(notes: Path, *, world: int = 1, exchange=None) -> CheckpointWatch:
    side = object() if world > 1 else None
    all_reduce, all_gather = exchange or (None, None)
    return CheckpointWatch(
        rank=0,
        world=world,
        side=side,
        notes_dir=notes,
        run_dir=None,
        restart=0,
        offset=0,
        all_gather=all_gather,
        all_reduce=all_reduce,
        groups=lambda: None,
        completed_steps=lambda: 7,
    )


def _runtime() -> patches.Runtime:
    """An in-job runtime with scout's defaults, for the rename patches alone."""
    from scout_slurm.jobconfig import JobConfig

    return patches.Runtime(JobConfig(), progress_dir=None, checkpoints_dir=None)


@pytest.fixture()
def watch(tmp_path):
    """The hooks' rename patches installed, a watch of one rank recording into tmp_path/notes."""
    handle = patches.InstalledHooks()
    patches._patch_renames(_runtime(), handle)
    w = make_watch(tmp_path / "notes")
    ckptstate.WATCH = w
    try:
        yield w
    finally:
        ckptstate.WATCH = None
        handle.remove()
    assert (os.rename, os.replace, shutil.move) == ORIGINALS, "remove() left a rename patched"


def notes(tmp_path) -> dict[str, CheckpointNote]:
    return {
        p.name: read_record(p, CheckpointNote) for p in sorted((tmp_path / "notes").glob("*.json"))
    }


def save_file(path: Path, watch: CheckpointWatch, step: int, data: bytes = b"weights") -> None:
    path.write_bytes(data)
    watch.saved(str(path), saver="torch.save", step=step)


def eligible(note: CheckpointNote) -> bool:
    """Not rejected: one rank has no replica to agree with, so its record is a candidate at best."""
    status = assess([note], {}, {}, file_problem)[0].status
    return status == (
        CheckpointStatus.ELIGIBLE
        if note.agreement_kind is Agreement.AGREED
        else CheckpointStatus.CANDIDATE
    )


@pytest.mark.parametrize("how", ["os.replace", "os.rename", "Path.rename", "Path.replace"])
def test_the_atomic_save_is_recorded_under_its_final_name(tmp_path, watch, how):
    final = tmp_path / "ck" / "step-5.pt"
    final.parent.mkdir()
    tmp = Path(f"{final}.tmp")
    save_file(tmp, watch, 5)
    [(name, before)] = notes(tmp_path).items()
    assert before.path == str(tmp) and "the file is gone" not in (file_problem(before) or "")
    {
        "os.replace": lambda: os.replace(tmp, final),
        "os.rename": lambda: os.rename(str(tmp), str(final)),
        "Path.rename": lambda: tmp.rename(final),
        "Path.replace": lambda: tmp.replace(final),
    }[how]()
    after = notes(tmp_path)[name]
    assert (after.path, after.saved_as) == (str(final), str(tmp))
    # a rename is not a change: the same digests, and the record now holds where the bytes are
    assert dataclasses.replace(after, path=before.path, saved_as="") == before
    assert file_problem(before).endswith("the file is gone")
    assert file_problem(after) is None and eligible(after)


def test_shutil_move_into_a_folder_follows_the_name_it_returns(tmp_path, watch):
    (tmp_path / "done").mkdir()
    save_file(tmp_path / "step-5.pt", watch, 5)
    assert shutil.move(str(tmp_path / "step-5.pt"), str(tmp_path / "done")) == str(
        tmp_path / "done" / "step-5.pt"
    )
    [note] = notes(tmp_path).values()
    assert note.path == str(tmp_path / "done" / "step-5.pt") and file_problem(note) is None


def test_a_dcp_folder_renamed_keeps_its_files_and_digests(tmp_path, watch):
    tmp, final = tmp_path / "step-10.tmp", tmp_path / "step-10"
    (tmp / "sub").mkdir(parents=True)
    (tmp / ".metadata").write_bytes(b"meta")
    (tmp / "__0_0.distcp").write_bytes(b"rank0")
    (tmp / "sub" / "__1_0.distcp").write_bytes(b"rank1")
    watch.saved(str(tmp), saver="dcp.save", step=10)
    os.rename(tmp, final)
    [note] = notes(tmp_path).values()
    assert (note.path, note.saved_as, note.saver) == (str(final), str(tmp), "dcp.save")
    # the files are named relative to the folder: what is listed is what is there now
    assert note.files == files_of(str(final))[0] and len(note.files) == 3
    assert file_problem(note) is None and eligible(note)


def test_a_file_inside_a_renamed_folder_and_a_folder_of_several(tmp_path, watch):
    run = tmp_path / "run.tmp"
    run.mkdir()
    save_file(run / "model.pt", watch, 5, b"model")
    save_file(run / "optim.pt", watch, 6, b"optim")
    shutil.move(str(run), str(tmp_path / "run"))
    by_step = {n.step: n for n in notes(tmp_path).values()}
    assert by_step[5].path == str(tmp_path / "run" / "model.pt")
    assert by_step[6].path == str(tmp_path / "run" / "optim.pt")
    assert all(file_problem(n) is None for n in by_step.values())
    # followed again from where they are now
    os.replace(tmp_path / "run" / "model.pt", tmp_path / "model-final.pt")
    assert notes(tmp_path)["run-0-step-5-rank-0.json"].path == str(tmp_path / "model-final.pt")
    assert notes(tmp_path)["run-0-step-5-rank-0.json"].saved_as == str(run / "model.pt")


def test_renamed_through_the_real_path_of_a_linked_folder(tmp_path, watch):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    save_file(tmp_path / "link" / "step-5.pt.tmp", watch, 5)
    os.replace(tmp_path / "real" / "step-5.pt.tmp", tmp_path / "real" / "step-5.pt")
    [note] = notes(tmp_path).values()
    assert note.path == str(tmp_path / "real" / "step-5.pt") and file_problem(note) is None


def test_a_rename_of_anything_else_changes_no_record(tmp_path, watch, monkeypatch):
    save_file(tmp_path / "step-5.pt.tmp", watch, 5)
    [path] = (tmp_path / "notes").glob("*.json")
    before = path.read_bytes()
    (tmp_path / "train.log").write_text("x")
    (tmp_path / "other.pt.tmp").write_bytes(b"x")

    def resolved(_path):  # an unrelated name never gets as far as resolving paths
        raise AssertionError("canonical() called for an unrelated rename")

    monkeypatch.setattr(ckptstate, "canonical", resolved)
    os.rename(tmp_path / "train.log", tmp_path / "train.log.1")
    os.replace(tmp_path / "other.pt.tmp", tmp_path / "other.pt")
    shutil.move(str(tmp_path / "other.pt"), str(tmp_path / "other2.pt"))
    monkeypatch.undo()
    # a file of the same name elsewhere is not the recorded one
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "step-5.pt.tmp").write_bytes(b"x")
    os.replace(tmp_path / "elsewhere" / "step-5.pt.tmp", tmp_path / "elsewhere" / "step-5.pt")
    assert path.read_bytes() == before and len(list((tmp_path / "notes").glob("*.json"))) == 1


def test_the_jobs_rename_errors_are_unchanged(tmp_path, watch, capsys):
    save_file(tmp_path / "step-5.pt.tmp", watch, 5)
    missing = tmp_path / "step-5.pt.tmp.gone"
    for fn in (os.replace, os.rename):
        with pytest.raises(FileNotFoundError) as got:
            fn(missing, tmp_path / "x")
        with pytest.raises(FileNotFoundError) as want:
            fn.__scout_original__(missing, tmp_path / "x")
        assert (got.value.errno, got.value.filename, got.value.filename2, str(got.value)) == (
            want.value.errno,
            want.value.filename,
            want.value.filename2,
            str(want.value),
        )
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_bytes(b"x")
    (tmp_path / "dir.tmp").mkdir()
    with pytest.raises(OSError) as got:
        os.rename(tmp_path / "dir.tmp", tmp_path / "full")  # onto a folder that is not empty
    assert got.value.errno in (errno.ENOTEMPTY, errno.EEXIST)
    with pytest.raises(FileNotFoundError):
        shutil.move(str(missing), str(tmp_path / "y"))
    with pytest.raises(TypeError) as got:
        os.replace(str(tmp_path / "step-5.pt.tmp"))
    with pytest.raises(TypeError) as want:
        os.replace.__scout_original__(str(tmp_path / "step-5.pt.tmp"))
    assert str(got.value) == str(want.value)
    # nothing was renamed: the record still names the file where it is
    [note] = notes(tmp_path).values()
    assert note.path == str(tmp_path / "step-5.pt.tmp") and file_problem(note) is None
    assert capsys.readouterr().err == ""


def test_a_failure_of_scouts_part_never_reaches_the_job(tmp_path, watch, monkeypatch, capsys):
    save_file(tmp_path / "step-5.pt.tmp", watch, 5)

    def broken(src, dst):
        raise RuntimeError("scout's bug")

    monkeypatch.setattr(watch, "moved", broken)
    assert os.replace(tmp_path / "step-5.pt.tmp", tmp_path / "step-5.pt") is None
    assert shutil.move(str(tmp_path / "step-5.pt"), str(tmp_path / "s.pt")) == str(
        tmp_path / "s.pt"
    )
    assert (tmp_path / "s.pt").read_bytes() == b"weights"
    # said once, loudly (the guard switched the record off at the first failure), never raised into
    # the job
    err = capsys.readouterr().err
    assert err.count("scout: ERROR: scout's checkpoint record failed inside scout") == 1, err
    assert "RuntimeError: scout's bug" in err


def test_the_pending_exchange_writes_the_final_name(tmp_path):
    """Saved by one rank of two: the replicas' signatures follow at the next step. A rename before
    that step must not be undone by the exchange writing the note it kept."""

    def all_reduce(t, group):
        assert group is w.side  # SUM of "did I save": this rank did

    def all_gather(got, vec, group):
        for g in got:
            g.copy_(vec)

    handle = patches.InstalledHooks()
    patches._patch_renames(_runtime(), handle)
    w = make_watch(tmp_path / "notes", world=2, exchange=(all_reduce, all_gather))
    ckptstate.WATCH = w
    try:
        save_file(tmp_path / "step-5.pt.tmp", w, 5)
        [(dest, pending)] = w.pending
        assert pending.path == str(tmp_path / "step-5.pt.tmp") and pending.agreement.startswith(
            "not exchanged"
        )
        os.replace(tmp_path / "step-5.pt.tmp", tmp_path / "step-5.pt")
        assert w.pending[0][1].path == str(tmp_path / "step-5.pt")
        assert read_record(dest, CheckpointNote).path == str(tmp_path / "step-5.pt")
        w.exchange()
        assert w.pending == []
    finally:
        ckptstate.WATCH = None
        handle.remove()
    done = read_record(dest, CheckpointNote)
    # the exchange at step 7 (the watch's step), after the save at step 5: the replicas agreed there
    assert (done.path, done.saved_as, done.ranks_saved, done.agreement) == (
        str(tmp_path / "step-5.pt"),
        str(tmp_path / "step-5.pt.tmp"),
        (0, 1),
        "agreed at step 7, the first exchange after the save at step 5",
    )
    assert file_problem(done) is None and eligible(done)


def test_a_hidden_temporary_name_is_recorded_once_renamed_to_a_visible_one(tmp_path, watch):
    hidden = tmp_path / ".step-5.pt.tmp"
    hidden.write_bytes(b"weights")
    watch.saved_hidden(str(hidden), saver="torch.save")
    assert notes(tmp_path) == {}
    os.replace(hidden, tmp_path / ".still-hidden")
    assert notes(tmp_path) == {}
    os.replace(tmp_path / ".still-hidden", tmp_path / "step-5.pt")
    [note] = notes(tmp_path).values()
    assert (note.path, note.step, note.saver, note.saved_as) == (
        str(tmp_path / "step-5.pt"),
        7,
        "torch.save",
        str(hidden),
    )
    assert file_problem(note) is None


def test_a_checkpoint_replaced_at_the_same_name(tmp_path, watch):
    """latest.pt rewritten the atomic way at every save: the newer record holds, the older one is
    rejected as changed (its bytes are gone), and a later rename moves only the newer one."""
    latest = tmp_path / "latest.pt"
    save_file(tmp_path / "latest.pt.tmp", watch, 5, b"five")
    os.replace(tmp_path / "latest.pt.tmp", latest)
    save_file(tmp_path / "latest.pt.tmp", watch, 10, b"ten!")
    os.replace(tmp_path / "latest.pt.tmp", latest)
    by_step = {n.step: n for n in notes(tmp_path).values()}
    assert by_step[5].path == by_step[10].path == str(latest)
    assert (
        "changed on disk after its record" in file_problem(by_step[5])
        and file_problem(by_step[10]) is None
    )
    os.replace(latest, tmp_path / "kept.pt")
    by_step = {n.step: n for n in notes(tmp_path).values()}
    assert (by_step[5].path, by_step[10].path) == (str(latest), str(tmp_path / "kept.pt"))


def test_a_record_written_before_saved_as_existed_is_still_read(tmp_path):
    from scout_slurm.evidence.store import record_to_obj

    obj = record_to_obj(
        CheckpointNote(
            path="/ck/step-5.pt", step=5, rank=0, restart=0, saved_at=1.0, size_bytes=3, sha256="ab"
        )
    )
    del obj["saved_as"]
    (tmp_path / "n.json").write_text(json.dumps(obj))
    assert read_record(tmp_path / "n.json", CheckpointNote).saved_as == ""


def test_installed_only_with_a_checkpoints_folder(tmp_path):
    """In a fresh process (the hooks' state is global): patched by install() when checkpoints are
    recorded, before the script runs (a script's `from os import replace` gets the patched one),
    once, and restored by remove()."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, shutil, sys
        from pathlib import Path
        from scout_slurm.bootstrap import patches
        originals = (os.rename, os.replace, shutil.move)
        handle = patches.install(Path(sys.argv[1]) / "progress", checkpoints_dir=None)
        assert (os.rename, os.replace, shutil.move) == originals
        handle.remove()
        handle = patches.install(
            Path(sys.argv[1]) / "progress", checkpoints_dir=Path(sys.argv[1]) / "notes"
        )
        wrapped = (os.rename, os.replace, shutil.move)
        assert [f.__scout_original__ for f in wrapped] == list(originals)
        from os import replace
        assert replace is os.replace
        assert patches.install(Path(sys.argv[1]) / "progress") is handle
        assert os.replace.__scout_original__ is originals[1]
        handle.remove()
        assert (os.rename, os.replace, shutil.move) == originals
        assert "torch" not in sys.modules, "following renames must not import torch"
        print("ok")
    """)
    res = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert (res.returncode, res.stdout.strip()) == (0, "ok"), res.stderr


def test_a_dcp_folder_renamed_by_a_rank_other_than_the_one_that_recorded_it(tmp_path):
    """DCP: every rank takes part, the lowest rank writes the one record; the script may have any
    rank rename the folder after its barrier."""

    def all_gather(got, vec, group):
        for g in got:
            g.copy_(vec)

    tmp, final = tmp_path / "step-4.tmp", tmp_path / "step-4"
    tmp.mkdir()
    (tmp / ".metadata").write_bytes(b"meta")
    (tmp / "__0_0.distcp").write_bytes(b"rank0")
    ranks = []
    for rank in (0, 1):
        w = make_watch(tmp_path / "notes", world=2, exchange=(None, all_gather))
        w.rank = rank
        w.saved_collective(str(tmp), saver="dcp.save")
        ranks.append(w)
    [(name, before)] = notes(tmp_path).items()
    assert (name, before.path, before.agreement) == ("run-0-step-7-rank-0.json", str(tmp), "agreed")
    handle = patches.InstalledHooks()
    patches._patch_renames(_runtime(), handle)
    ckptstate.WATCH = ranks[1]
    try:
        os.rename(tmp, final)
    finally:
        ckptstate.WATCH = None
        handle.remove()
    after = notes(tmp_path)[name]
    assert (after.path, after.saved_as) == (str(final), str(tmp))
    assert dataclasses.replace(after, path=before.path, saved_as="") == before
    assert file_problem(after) is None and eligible(after)
