"""The batch host's node Epilog (root) checks the job's checkpoint notes as the job's own user and
records what it found, root-owned, in `nodes/<node>/checkpoints-<restart>.json`: the controller
decides from that record and opens no path a job named. The function that reaches outside is
`write_checkpoint_checks`."""

from __future__ import annotations

import time

from scout_slurm.evidence.checkfiles import list_checkpoint_notes, note_digest
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import write_record
from scout_slurm.hooks.nodefolder import ensure_node_dir
from scout_slurm.log import get_logger
from scout_slurm.remediation.records import CheckpointCheck, CheckpointChecks
from scout_slurm.remediation.verifyuser import is_verified, verify_as_job_user

log = get_logger("scout.epilog")

# The newest notes checked at most; older ones get no result (the controller: not verified). With
# the bounds on each result's texts the record stays well within what a reader takes (4 MiB).
MAX_CHECKED_NOTES = 256
MAX_PATH_SHOWN = 1024


def build_checkpoint_checks(
    folder: JobFolder,
    restart: int,
    node: str,
    *,
    uid: int,
    gid: int,
    time_budget_s: float,
    byte_budget: int,
    hook_uid: int | None = None,
) -> CheckpointChecks | None:
    """Check the job's checkpoint notes as `uid`/`gid` (the job's; `gid` < 0: the passwd entry's)
    within the budgets; None when the job noted no checkpoint. Writes nothing."""
    named = list_checkpoint_notes(folder)
    if not named:
        return None
    newest = sorted(named, key=lambda item: (item[1].step, item[1].saved_at), reverse=True)[
        :MAX_CHECKED_NOTES
    ]
    found = verify_as_job_user(
        [note for _, note in newest],
        uid=uid,
        gid=gid,
        time_budget_s=time_budget_s,
        byte_budget=byte_budget,
        hook_uid=hook_uid,
    )
    results = tuple(
        CheckpointCheck(
            note_file=name,
            note_digest=note_digest(note),
            path=_shown(note.path),
            step=note.step,
            problem=text or "",
            verified=is_verified(text),
        )
        for (name, note), text in zip(newest, found)
    )
    return CheckpointChecks(
        job_id=folder.job_id, restart=restart, node=node, checked_as_uid=uid, results=results
    )


def write_checkpoint_checks(
    folder: JobFolder,
    restart: int,
    node: str,
    *,
    uid: int,
    gid: int,
    time_budget_s: float,
    byte_budget: int,
) -> CheckpointChecks | None:
    """`build_checkpoint_checks`, and the record written (mode 0644) into this node's root-owned
    folder. None when the job noted no checkpoint (nothing is written). Raises EvidenceError when
    the node's folder is unsafe or the record cannot be written."""
    started = time.monotonic()
    record = build_checkpoint_checks(
        folder,
        restart,
        node,
        uid=uid,
        gid=gid,
        time_budget_s=time_budget_s,
        byte_budget=byte_budget,
    )
    if record is None:
        return None
    ensure_node_dir(folder, node)  # created if missing, no link followed
    write_record(folder.checkpoint_checks_path(restart, node), record, mode=0o644)
    results = record.results
    log.info(
        "epilog.checkpoint_checks",
        job=folder.job_id,
        node=node,
        restart=restart,
        uid=uid,
        checked=len(results),
        verified=sum(r.verified for r in results),
        seconds=round(time.monotonic() - started, 3),
    )
    return record


def checks_now(
    folder: JobFolder, restart: int, *, time_budget_s: float, byte_budget: int
) -> CheckpointChecks | None:
    """For an operator command (`scout checkpoints`): the files as they are now, read with no right
    the invoker lacks and none the job lacks: as root, in a child dropped to the owner of the job's
    checkpoints folder (the job's uid); otherwise with the invoker's own rights, non-blocking."""
    import os

    try:
        uid = os.stat(folder.checkpoints_dir, follow_symlinks=False).st_uid
    except OSError:
        return None
    if os.geteuid() == 0:
        return build_checkpoint_checks(
            folder,
            restart,
            "(now)",
            uid=uid,
            gid=-1,
            time_budget_s=time_budget_s,
            byte_budget=byte_budget,
        )
    from scout_slurm.evidence.checkfiles import check_file
    from scout_slurm.remediation.verifyuser import SIZE_ONLY

    named = sorted(
        list_checkpoint_notes(folder),
        key=lambda item: (item[1].step, item[1].saved_at),
        reverse=True,
    )
    left, results = byte_budget, []
    for name, note in named[:MAX_CHECKED_NOTES]:
        found = check_file(note, digest_budget=left)
        left = max(0, left - found.hashed_bytes)
        text = found.problem or (
            f"{SIZE_ONLY}: larger than any hook re-reads" if found.size_only else None
        )
        results.append(
            CheckpointCheck(
                note_file=name,
                note_digest=note_digest(note),
                path=_shown(note.path),
                step=note.step,
                problem=text or "",
                verified=is_verified(text),
            )
        )
    return CheckpointChecks(
        job_id=folder.job_id,
        restart=restart,
        node="(now)",
        checked_as_uid=os.geteuid(),
        results=tuple(results),
    )


def _shown(path: str) -> str:
    return path if len(path) <= MAX_PATH_SHOWN else path[: MAX_PATH_SHOWN - 3] + "..."
