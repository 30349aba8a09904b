"""A noted checkpoint compared with what is on storage, and the root-owned record of what the batch
host's Epilog found when it did that as the job's user. `check_file` opens what a note names and
runs only in that user's process (remediation/verifyuser.py); the controller side reads only that
record (`read_checkpoint_checks`) and opens no path a job named. The notes assessed with it:
remediation/checkpoint_assessment.py."""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
from dataclasses import dataclass

from scout_slurm.evidence.records import CheckpointChecks, CheckpointNote

FULL_DIGEST_LIMIT = 1 << 30  # larger files: size and presence only, within a hook's time budget
MAX_FOLDER_FILES = 100_000  # a DCP folder: files listed and walked at most

NO_RECORD = "not verified: no root-owned checkpoint check from the batch host's Epilog"
NO_RESULT = "not verified by the batch host's Epilog (no result for it)"

# O_NONBLOCK: a FIFO swapped in after the type check opens at once instead of waiting for a writer
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileCheck:
    problem: str | None  # None: on storage as noted
    hashed_bytes: int = 0  # re-read and hashed, of the caller's budget
    size_only: bool = False  # a recorded sha256 was not compared: over the budget left


def file_problem(note: CheckpointNote, *, full_digest_limit: int = FULL_DIGEST_LIMIT) -> str | None:
    """What is wrong with the noted checkpoint on storage now, or None. Opens what the note names:
    call it only as the job's user."""
    return check_file(note, digest_budget=full_digest_limit).problem


def check_file(note: CheckpointNote, *, digest_budget: int) -> FileCheck:
    """`file_problem`, saying how many bytes were hashed and whether a digest was left unchecked:
    a file is hashed only when it fits in what is left of `digest_budget`."""
    path = note.path
    if not os.path.isabs(path) or not path.isprintable():
        return FileCheck(f"recorded path {path!r} is not an absolute printable path")
    # a FIFO, socket or device is refused before it is opened (opening some devices has effects);
    # the fstat of the descriptor that is read decides
    try:
        st = os.stat(path)
    except OSError as exc:
        return FileCheck(_not_there(path, exc))
    if stat.S_ISDIR(st.st_mode) and note.files:
        return _folder_check(note, digest_budget)
    if not stat.S_ISREG(st.st_mode):
        return FileCheck(f"{path}: not a regular file")
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        return FileCheck(_not_there(path, exc))
    try:
        return _check_open_file(fd, note, digest_budget)
    finally:
        os.close(fd)


def _not_there(path: str, exc: OSError) -> str:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return f"{path}: {exc.strerror}: the file is gone"
    return f"{path}: unreadable ({exc.strerror})"


def _check_open_file(fd: int, note: CheckpointNote, digest_budget: int) -> FileCheck:
    path = note.path
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        return FileCheck(f"{path}: not a regular file")
    if st.st_size != note.size_bytes:
        return FileCheck(
            f"{path}: {st.st_size} bytes now, {note.size_bytes} when saved: "
            f"changed on disk after its record"
        )
    if not note.sha256:
        return FileCheck(None)
    if st.st_size > FULL_DIGEST_LIMIT:
        return FileCheck(
            None, size_only=True
        )  # larger than any hook re-reads: size and presence only
    if st.st_size > digest_budget:
        # "verified" must mean verified: a file a hook could hash is not eligible unhashed (else
        # twelve
        # planted copies of one file would spend the budget and make the rest pass by size alone)
        return FileCheck(
            f"{path}: not verified: its sha256 was not re-read, the hashing budget was spent "
            f"on newer checkpoints ({max(0, digest_budget)} bytes left, {st.st_size} needed)"
        )
    h = hashlib.sha256()
    total = 0
    try:
        while total <= st.st_size:  # a byte past the size is enough to know the file grew
            chunk = os.read(fd, min(_CHUNK, st.st_size + 1 - total))
            if not chunk:
                break
            h.update(chunk)
            total += len(chunk)
    except OSError as exc:
        return FileCheck(f"{path}: unreadable ({exc.strerror})", hashed_bytes=total)
    if total != st.st_size:
        return FileCheck(
            f"{path}: {total} bytes read of {st.st_size}: changed on disk while being checked",
            hashed_bytes=total,
        )
    if h.hexdigest() != note.sha256:
        return FileCheck(
            f"{path}: sha256 differs from the one recorded after the save: changed on disk "
            f"after its record",
            hashed_bytes=total,
        )
    return FileCheck(None, hashed_bytes=total)


# savers of one file at a time: a folder recorded from them (a step folder, `checkpoint-20/`) lists
# this rank's parts only; other ranks' parts (`rng_state_1.pth`) and files written without torch
# (`trainer_state.json`, `config.json`) share the folder
PER_FILE_SAVERS = ("torch.save", "safetensors", "torch.save (into memory, then written)")


def _folder_check(note: CheckpointNote, digest_budget: int) -> FileCheck:
    """A checkpoint folder: every recorded file still there, unchanged; and, where the record is
    the whole folder (DCP's collective save), no file added."""
    if len(note.files) > MAX_FOLDER_FILES:
        return FileCheck(
            f"{note.path}: the record lists {len(note.files)} files, more than scout checks "
            f"({MAX_FOLDER_FILES})"
        )
    root = os.path.realpath(note.path)
    recorded = {f.name for f in note.files}
    budget = (
        digest_budget  # bytes re-read in all: a hook's time is bounded, a sharded checkpoint is not
    )
    hashed, size_only = 0, False
    for f in note.files:
        full = os.path.realpath(os.path.join(root, f.name))
        if os.path.commonpath([root, full]) != root or not f.name:
            return FileCheck(
                f"{note.path}: recorded file name {f.name!r} leaves the checkpoint folder",
                hashed,
                size_only,
            )
        one = dataclasses.replace(
            note, path=full, size_bytes=f.size_bytes, sha256=f.sha256, files=()
        )
        result = check_file(one, digest_budget=budget)
        hashed += result.hashed_bytes
        budget = max(0, budget - result.hashed_bytes)
        size_only = size_only or result.size_only
        if result.problem:
            return FileCheck(
                f"{note.path} (one of {len(note.files)} files): {result.problem}", hashed, size_only
            )
    if note.saver in PER_FILE_SAVERS:
        return FileCheck(None, hashed, size_only)
    seen = 0
    for dirpath, _dirnames, names in os.walk(root, followlinks=False):
        seen += len(names)
        if seen > MAX_FOLDER_FILES:
            return FileCheck(
                f"{note.path}: more than {MAX_FOLDER_FILES} files in the folder now: changed on "
                f"disk after its record",
                hashed,
                size_only,
            )
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), root)
            if rel not in recorded:
                return FileCheck(
                    f"{note.path}: file {rel!r} was not there when it was saved: changed on disk "
                    f"after its record",
                    hashed,
                    size_only,
                )
    return FileCheck(None, hashed, size_only)


def note_digest(note: CheckpointNote) -> str:
    """The identity of a note as read: a result recorded about it holds for these bytes only."""
    from scout_slurm.evidence.store import record_to_bytes

    return hashlib.sha256(record_to_bytes(note)).hexdigest()


def list_checkpoint_notes(folder) -> list[tuple[str, CheckpointNote]]:
    """The job's checkpoint notes with their file names in checkpoints/ (unreadable ones left
    out).
    """
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.store import list_named_records

    if not folder.checkpoints_dir.is_dir():
        return []
    try:
        named, _ = list_named_records(
            folder.checkpoints_dir, "*.json", CheckpointNote, root=folder.root
        )
    except EvidenceError:
        return []
    return named


def read_checkpoint_checks(folder, restart: int, node: str) -> CheckpointChecks | None:
    """The batch host's record of the job's checkpoint checks for run `restart`: only a regular
    file owned by root, naming this job, this run and this node; else None."""
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.store import read_record

    try:
        record = read_record(
            folder.checkpoint_checks_path(restart, node),
            CheckpointChecks,
            root=folder.root,
            owner=0,
        )
    except EvidenceError:
        return None
    if record.job_id != folder.job_id or record.restart != restart or record.node != node:
        return None
    return record


def find_checkpoint_checks(folder, restart: int) -> CheckpointChecks | None:
    """`read_checkpoint_checks` from whichever node wrote one for run `restart` (the batch host),
    for a reader that does not know which node that was (`scout checkpoints`)."""
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.layout import check_node_name

    try:
        names = sorted(os.listdir(folder.nodes_dir))
    except OSError:
        return None
    for name in names:
        try:
            check_node_name(name)
        except EvidenceError:
            continue
        record = read_checkpoint_checks(folder, restart, name)
        if record is not None:
            return record
    return None
