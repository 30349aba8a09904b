"""Checkpoint notes are checked as the job's own user, in a forked child with a time and a byte
budget, never as root: a note naming a root-only file, a kernel interface, a FIFO or another
user's file is a problem, a sparse giant costs neither the budget nor the hook's time, an overrun
child is killed. The controller side decides from the root-owned record alone (real processes,
real uids: these tests run as root; uid 1001 and 1002 may or may not have a passwd entry)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

from scout_slurm.evidence.checkfiles import (
    NO_RECORD,
    NO_RESULT,
    note_digest,
    read_checkpoint_checks,
)
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import read_record, write_record
from scout_slurm.hooks.ckptcheck import write_checkpoint_checks
from scout_slurm.remediation.checkpoint_assessment import assess_job
from scout_slurm.remediation.eligibility import CheckpointStatus
from scout_slurm.remediation.records import CheckpointCheck, CheckpointChecks, CheckpointNote
from scout_slurm.remediation.verifyuser import SIZE_ONLY, is_verified, verify_as_job_user

USER, GROUP, OTHER = 1001, 1001, 1002
MiB, GiB = 1 << 20, 1 << 30

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switches to other uids: needs root")


def note(path, *, step=10, size=0, sha256="", restart=0) -> CheckpointNote:
    return CheckpointNote(
        path=str(path),
        step=step,
        rank=0,
        restart=restart,
        saved_at=1000.0 + step,
        size_bytes=size,
        sha256=sha256,
        saver="torch.save",
    )


def noted(path: Path, *, step=10) -> CheckpointNote:
    """A note that matches the file as it is now."""
    return note(
        path,
        step=step,
        size=path.stat().st_size,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
    )


def verify(notes, *, uid=USER, gid=GROUP, time_budget_s=10.0, byte_budget=GiB, **kw):
    return verify_as_job_user(
        notes, uid=uid, gid=gid, time_budget_s=time_budget_s, byte_budget=byte_budget, **kw
    )


def sparse(path: Path, size: int) -> Path:
    path.touch()
    os.truncate(path, size)
    os.chmod(path, 0o644)
    return path


def zeros_sha256(size: int) -> str:
    h, block = hashlib.sha256(), bytes(MiB)
    for _ in range(size // MiB):
        h.update(block)
    return h.hexdigest()


@pytest.fixture
def shared():
    """A folder other uids can enter (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="scout-verify-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -------------------------------------------------------------------------------------------
# What a job can name
# -------------------------------------------------------------------------------------------


@root_only
@pytest.mark.timeout(30)
def test_a_root_only_file_with_its_true_digest_is_a_problem_not_an_oracle():
    shadow = Path("/etc/shadow")
    if not shadow.exists():
        pytest.skip("no /etc/shadow here")
    truth = noted(shadow)  # what a job that guessed right would write: root computes it here
    wrong = dataclasses.replace(truth, sha256="0" * 64)
    right_result, wrong_result = verify([truth, wrong])
    assert right_result is not None and not is_verified(right_result)
    assert "Permission denied" in right_result
    # the guess that was right and the one that was wrong read the same: nothing to learn
    assert right_result == wrong_result


@root_only
@pytest.mark.timeout(20)
def test_proc_kmsg_is_a_problem_within_the_budget():
    started = time.monotonic()
    [result] = verify([note("/proc/kmsg", size=0, sha256="0" * 64)], time_budget_s=5.0)
    assert time.monotonic() - started < 5.0
    assert result is not None and not is_verified(result) and "Permission denied" in result


@root_only
@pytest.mark.timeout(20)
def test_a_fifo_is_not_a_regular_file_and_never_blocks(shared):
    fifo = shared / "ckpt.pt"
    os.mkfifo(fifo, 0o666)
    os.chmod(fifo, 0o666)
    started = time.monotonic()
    [result] = verify([note(fifo, size=0, sha256="0" * 64)], time_budget_s=5.0)
    assert time.monotonic() - started < 1.0
    assert result == f"{fifo}: not a regular file"


@root_only
def test_another_users_file_is_a_problem(shared):
    theirs = shared / "theirs.pt"
    theirs.write_bytes(b"someone else's weights")
    os.chown(theirs, OTHER, OTHER)
    os.chmod(theirs, 0o600)
    [result] = verify([noted(theirs)])
    assert result == f"{theirs}: unreadable (Permission denied)"


@root_only
def test_the_users_own_file_that_matches_is_verified_and_one_that_differs_is_not(shared):
    home = shared / "home"
    home.mkdir(mode=0o700)
    os.chown(home, USER, GROUP)
    good = home / "step-10.pt"
    good.write_bytes(b"weights" * 1000)
    os.chown(good, USER, GROUP)
    os.chmod(good, 0o600)
    changed = dataclasses.replace(noted(good, step=5), sha256="1" * 64)
    assert verify([noted(good), changed]) == [
        None,
        f"{good}: sha256 differs from the one recorded after the save: changed on disk after "
        "its record",
    ]


@root_only
def test_a_root_job_is_checked_with_its_own_privilege_in_the_child(shared):
    mine = shared / "root.pt"
    mine.write_bytes(b"root's weights")
    os.chmod(mine, 0o600)
    assert verify([noted(mine)], uid=0, gid=0) == [None]


@root_only
def test_the_job_users_groups_are_not_roots(shared):
    """Root's supplementary groups stay behind: a file only group 0 may read is refused."""
    group_file = shared / "group.pt"
    group_file.write_bytes(b"x" * 10)
    os.chown(group_file, 0, 0)
    os.chmod(group_file, 0o640)
    [result] = verify([noted(group_file)])
    assert result == f"{group_file}: unreadable (Permission denied)"


# -------------------------------------------------------------------------------------------
# Budgets
# -------------------------------------------------------------------------------------------


@root_only
@pytest.mark.timeout(30)
def test_twelve_notes_of_a_sparse_giant_stay_within_both_budgets(shared):
    giant = sparse(shared / "giant.pt", GiB)
    notes = [note(giant, step=s, size=GiB, sha256="0" * 64) for s in range(12)]
    started = time.monotonic()
    results = verify(notes, time_budget_s=3.0, byte_budget=256 * MiB)
    elapsed = time.monotonic() - started
    assert elapsed < 3.5, elapsed
    # none was hashed (a wrong digest would have said so), and none passes unhashed: a file a hook
    # could hash is not eligible by its size alone
    assert all(
        r is not None and not is_verified(r) and "the hashing budget was spent" in r
        for r in results
    ), results
    assert f"({256 * MiB} bytes left, {GiB} needed)" in results[0]


@root_only
@pytest.mark.timeout(30)
def test_a_file_larger_than_any_hook_hashes_is_checked_by_size_and_presence(shared):
    huge = sparse(shared / "huge.pt", GiB + 1)
    results = verify(
        [note(huge, step=1, size=GiB + 1, sha256="0" * 64)], time_budget_s=3.0, byte_budget=4 * GiB
    )
    assert results[0].startswith(SIZE_ONLY) and is_verified(results[0]), results


@root_only
@pytest.mark.timeout(60)
def test_the_byte_budget_is_shared_newest_first(shared):
    size = 64 * MiB
    big = sparse(shared / "big.pt", size)
    digest = zeros_sha256(size)
    notes = [note(big, step=s, size=size, sha256=digest) for s in range(12)]
    results = verify(notes, time_budget_s=30.0, byte_budget=160 * MiB)
    # two files fit in 160 MiB: the two newest (steps 11 and 10) are hashed; the rest are not
    # verified
    assert results[10:] == [None, None]
    assert all(not is_verified(r) and "the hashing budget was spent" in r for r in results[:10]), (
        results
    )
    assert f"({160 * MiB - 2 * size} bytes left, {size} needed)" in results[0]


@root_only
@pytest.mark.timeout(30)
def test_a_child_that_overruns_is_killed_and_the_unfinished_notes_say_so(shared):
    small = shared / "small.pt"
    small.write_bytes(b"newest")
    huge = sparse(
        shared / "huge.pt", GiB
    )  # hashed (the largest size a hook hashes): about 1 s each here
    notes = [note(huge, step=s, size=GiB, sha256="0" * 64) for s in (1, 2, 3)] + [
        noted(small, step=9)
    ]
    started = time.monotonic()
    results = verify(notes, time_budget_s=0.5, byte_budget=1 << 40)
    elapsed = time.monotonic() - started
    assert elapsed < 1.5, elapsed
    assert results[3] is None  # the newest first, and its result came before the kill
    assert results[:3] == ["not verified: the check did not finish within the 0.5 s budget"] * 3


# -------------------------------------------------------------------------------------------
# Who may check at all
# -------------------------------------------------------------------------------------------


def test_a_hook_that_is_not_root_opens_nothing(shared):
    fifo = shared / "pipe"
    os.mkfifo(fifo)
    notes = [note(fifo, size=0, sha256="0" * 64), note("/etc/shadow", size=1, sha256="0" * 64)]
    started = time.monotonic()
    results = verify(notes, hook_uid=981)
    assert time.monotonic() - started < 0.2
    assert (
        results
        == ["not verified: this hook runs as uid 981 and does not open files a job named"] * 2
    )


@root_only
def test_a_uid_without_passwd_entry_and_gid_is_refused_in_the_child(shared):
    import pwd

    def unknown(uid):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return True
        return False

    bare = next(u for u in range(61000, 62000) if unknown(u))
    f = shared / "f.pt"
    f.write_bytes(b"1")
    [result] = verify([noted(f)], uid=bare, gid=-1)
    assert result == (
        f"not verified: the check could not run as uid {bare}: ValueError: uid {bare} has no "
        f"passwd entry and no gid was given"
    )
    assert verify([noted(f)], uid=bare, gid=bare) == [None]  # a bare uid with its gid is checked


def test_no_notes_and_a_bad_uid():
    assert verify([]) == []
    assert verify([note("/x")], uid=-3) == ["not verified: the job's uid -3 is not a valid uid"]


# -------------------------------------------------------------------------------------------
# The record: written by the batch host's Epilog, read by the controller
# -------------------------------------------------------------------------------------------


@pytest.fixture
def job(tmp_path):
    folder = JobFolder(tmp_path / "evidence", "lab", 7)
    folder.run_dir(0).mkdir(parents=True)
    folder.checkpoints_dir.mkdir(parents=True)
    return folder


def write_note(folder: JobFolder, n: CheckpointNote, name: str | None = None) -> str:
    name = name or f"run-{n.restart}-step-{n.step}-rank-0.json"
    write_record(folder.checkpoints_dir / name, n)
    return name


@root_only
def test_the_epilog_records_what_the_user_could_see_and_the_controller_decides_from_it(job, shared):
    home = shared / "home"
    home.mkdir(mode=0o700)
    os.chown(home, USER, GROUP)
    good = home / "step-5.pt"
    good.write_bytes(b"weights")
    os.chown(good, USER, GROUP)
    write_note(job, noted(good, step=5))
    write_note(job, noted(Path("/etc/shadow"), step=8))
    record = write_checkpoint_checks(
        job, 0, "n1", uid=USER, gid=GROUP, time_budget_s=10, byte_budget=GiB
    )
    path = job.checkpoint_checks_path(0, "n1")
    st = path.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644)
    assert read_record(path, CheckpointChecks) == record
    assert (record.job_id, record.restart, record.node, record.checked_as_uid) == (7, 0, "n1", USER)
    by_step = {r.step: r for r in record.results}
    assert (
        by_step[5].verified
        and by_step[5].problem == ""
        and by_step[5].note_file == "run-0-step-5-rank-0.json"
    )
    assert not by_step[8].verified and "Permission denied" in by_step[8].problem

    checks = read_checkpoint_checks(job, 0, "n1")
    assert checks == record
    out = {a.note.step: a for a in assess_job(job, checks=checks)}
    assert out[5].status == CheckpointStatus.CANDIDATE
    assert (
        out[8].status == CheckpointStatus.REJECTED
        and "/etc/shadow: unreadable (Permission denied)" == out[8].reason
    )


@root_only
def test_a_record_not_owned_by_root_is_ignored(job):
    n = note("/nowhere/step-5.pt", step=5, size=3, sha256="ab")
    name = write_note(job, n)
    forged = CheckpointChecks(
        job_id=7,
        restart=0,
        node="n1",
        checked_as_uid=USER,
        results=(CheckpointCheck(name, note_digest(n), n.path, 5, "", True),),
    )
    job.node_dir("n1").mkdir(parents=True)
    path = job.checkpoint_checks_path(0, "n1")
    write_record(path, forged)
    assert read_checkpoint_checks(job, 0, "n1") == forged  # root's: counts
    os.chown(path, USER, GROUP)
    assert read_checkpoint_checks(job, 0, "n1") is None
    [a] = assess_job(job, checks=read_checkpoint_checks(job, 0, "n1"))
    assert (a.status, a.reason) == (CheckpointStatus.REJECTED, NO_RECORD)


@root_only
@pytest.mark.parametrize("change", [dict(job_id=8), dict(restart=1), dict(node="n2")])
def test_a_record_naming_another_job_run_or_node_is_ignored(job, change):
    n = note("/nowhere/step-5.pt", step=5, size=3, sha256="ab")
    name = write_note(job, n)
    record = CheckpointChecks(
        job_id=7,
        restart=0,
        node="n1",
        checked_as_uid=USER,
        results=(CheckpointCheck(name, note_digest(n), n.path, 5, "", True),),
    )
    job.node_dir("n1").mkdir(parents=True)
    write_record(job.checkpoint_checks_path(0, "n1"), dataclasses.replace(record, **change))
    assert read_checkpoint_checks(job, 0, "n1") is None
    # handed over anyway: another job's results say nothing about this one's notes
    if "job_id" in change:
        [a] = assess_job(job, checks=dataclasses.replace(record, **change))
        assert a.reason == NO_RECORD


def test_the_controller_opens_nothing_a_note_names(job):
    """The record decides: a verified note whose path does not even exist here is not rejected,
    a note without a result is, and one rewritten since the check matches no result."""
    verified = note("/nowhere/step-5.pt", step=5, size=3, sha256="ab")
    size_only = note("/nowhere/step-6.pt", step=6, size=3, sha256="ab")
    unchecked = note("/proc/kmsg", step=7, size=0, sha256="ab")
    rewritten = note("/nowhere/step-8.pt", step=8, size=3, sha256="ab")
    names = [write_note(job, n) for n in (verified, size_only, unchecked, rewritten)]
    checks = CheckpointChecks(
        job_id=7,
        restart=0,
        node="n1",
        checked_as_uid=USER,
        results=(
            CheckpointCheck(names[0], note_digest(verified), verified.path, 5, "", True),
            CheckpointCheck(
                names[1],
                note_digest(size_only),
                size_only.path,
                6,
                f"{SIZE_ONLY}: its sha256 was not "
                f"re-read (0 of the 1 bytes of the hashing budget were left)",
                True,
            ),
            CheckpointCheck(names[3], note_digest(rewritten), rewritten.path, 8, "", True),
        ),
    )
    write_note(job, dataclasses.replace(rewritten, path="/etc/shadow"), names[3])
    out = {a.note.step: a for a in assess_job(job, checks=checks)}
    assert out[5].status == CheckpointStatus.CANDIDATE
    assert (
        out[6].status == CheckpointStatus.CANDIDATE
        and f"; file {SIZE_ONLY}: its sha256" in out[6].reason
    )
    assert (out[7].status, out[7].reason) == (CheckpointStatus.REJECTED, NO_RESULT)
    assert (out[8].status, out[8].reason) == (CheckpointStatus.REJECTED, NO_RESULT)
    # no record at all: nothing is verified
    assert {a.reason for a in assess_job(job, checks=None)} == {NO_RECORD}


def test_no_notes_no_record(job):
    assert (
        write_checkpoint_checks(job, 0, "n1", uid=USER, gid=GROUP, time_budget_s=1, byte_budget=0)
        is None
    )
    assert not job.checkpoint_checks_path(0, "n1").exists()
