"""Re-read a noted checkpoint from storage and compare it with its note. The function that
reaches outside is `file_problem`."""

from __future__ import annotations

import hashlib
import os
import stat

from scout_slurm.remediation.records import CheckpointNote

FULL_DIGEST_LIMIT = 1 << 30  # larger files: size and presence only, within a hook's time budget
MAX_FOLDER_FILES = 100_000   # a DCP folder: files listed and walked at most


def file_problem(note: CheckpointNote, *, full_digest_limit: int = FULL_DIGEST_LIMIT) -> str | None:
    path = note.path
    if not os.path.isabs(path) or not path.isprintable():
        return f"recorded path {path!r} is not an absolute printable path"
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}: the file is gone"
    if stat.S_ISDIR(st.st_mode) and note.files:
        return _folder_problem(note, full_digest_limit)
    if not stat.S_ISREG(st.st_mode):
        return f"{path}: not a regular file"
    if st.st_size != note.size_bytes:
        return f"{path}: {st.st_size} bytes now, {note.size_bytes} when saved: changed on disk after its record"
    if note.sha256 and st.st_size <= full_digest_limit:
        h = hashlib.sha256()
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except OSError as exc:
            return f"{path}: unreadable ({exc.strerror})"
        if h.hexdigest() != note.sha256:
            return f"{path}: sha256 differs from the one recorded after the save: changed on disk after its record"
    return None


def _folder_problem(note: CheckpointNote, full_digest_limit: int) -> str | None:
    """A checkpoint folder (DCP): every recorded file still there, unchanged, and no file added."""
    import dataclasses
    if len(note.files) > MAX_FOLDER_FILES:
        return f"{note.path}: the record lists {len(note.files)} files, more than scout checks ({MAX_FOLDER_FILES})"
    root = os.path.realpath(note.path)
    recorded = {f.name for f in note.files}
    budget = full_digest_limit  # bytes re-read in all: a hook's time is bounded, a sharded checkpoint is not
    for f in note.files:
        full = os.path.realpath(os.path.join(root, f.name))
        if os.path.commonpath([root, full]) != root or not f.name:
            return f"{note.path}: recorded file name {f.name!r} leaves the checkpoint folder"
        one = dataclasses.replace(note, path=full, size_bytes=f.size_bytes, sha256=f.sha256, files=())
        problem = file_problem(one, full_digest_limit=budget)
        if problem:
            return f"{note.path} (one of {len(note.files)} files): {problem}"
        if f.size_bytes <= budget:
            budget -= f.size_bytes
    seen = 0
    for dirpath, dirnames, names in os.walk(root, followlinks=False):
        seen += len(names)
        if seen > MAX_FOLDER_FILES:
            return f"{note.path}: more than {MAX_FOLDER_FILES} files in the folder now: changed on disk after its record"
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), root)
            if rel not in recorded:
                return f"{note.path}: file {rel!r} was not there when it was saved: changed on disk after its record"
    return None


def assess_job(folder, *, current_verdict=None):
    """Every noted checkpoint of a job, assessed (reads the notes, vote coverage and verdicts)."""
    from scout_slurm.errors import EvidenceError
    from scout_slurm.evidence.records import Verdict
    from scout_slurm.evidence.store import list_records, read_record
    from scout_slurm.remediation.eligibility import assess
    from scout_slurm.remediation.records import VoteCoverage

    notes = []
    if folder.checkpoints_dir.is_dir():
        try:
            notes, _ = list_records(folder.checkpoints_dir, "*.json", CheckpointNote, root=folder.root)
        except EvidenceError:
            notes = []
    coverage, verdicts = {}, {}
    for restart in folder.restarts():
        p = folder.run_dir(restart) / "votes.json"
        if p.exists():
            try:
                coverage[restart] = read_record(p, VoteCoverage, root=folder.root)
            except EvidenceError:
                pass
        vp = folder.verdict_path(restart)
        if vp.exists():
            try:
                verdicts[restart] = read_record(vp, Verdict, root=folder.root)
            except EvidenceError:
                pass
    if current_verdict is not None:
        verdicts[current_verdict.restart] = current_verdict
    return assess(notes, coverage, verdicts, file_problem)
