"""The batch host's node Epilog (root) checks the job's checkpoint notes as the job's own user and
records what it found, root-owned, in `nodes/<node>/checkpoints-<restart>.json`: the controller
decides from that record and opens no path a job named. The function that reaches outside is
`write_checkpoint_checks`."""

from __future__ import annotations

import time

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import write_record
from scout_slurm.log import get_logger
from scout_slurm.remediation.checkfiles import list_checkpoint_notes, note_digest
from scout_slurm.remediation.records import CheckpointCheck, CheckpointChecks
from scout_slurm.remediation.verifyuser import is_verified, verify_as_job_user

log = get_logger("scout.epilog")

# The newest notes checked at most; older ones get no result (the controller: not verified). With
# the bounds on each result's texts the record stays well within what a reader takes (4 MiB).
MAX_CHECKED_NOTES = 256
MAX_PATH_SHOWN = 1024


def write_checkpoint_checks(folder: JobFolder, restart: int, node: str, *, uid: int, gid: int,
                            time_budget_s: float, byte_budget: int) -> CheckpointChecks | None:
    """Check the job's checkpoint notes as `uid`/`gid` (the job's; `gid` < 0: the passwd entry's)
    within the budgets, and write the record (mode 0644) into this node's root-owned folder. None
    when the job noted no checkpoint (nothing is written). Raises EvidenceError when the node's
    folder is unsafe or the record cannot be written."""
    started = time.monotonic()
    named = list_checkpoint_notes(folder)
    if not named:
        return None
    newest = sorted(named, key=lambda item: (item[1].step, item[1].saved_at), reverse=True)[:MAX_CHECKED_NOTES]
    found = verify_as_job_user([note for _, note in newest], uid=uid, gid=gid, time_budget_s=time_budget_s,
                               byte_budget=byte_budget)
    results = tuple(
        CheckpointCheck(note_file=name, note_digest=note_digest(note), path=_shown(note.path), step=note.step,
                        problem=text or "", verified=is_verified(text))
        for (name, note), text in zip(newest, found))
    record = CheckpointChecks(job_id=folder.job_id, restart=restart, node=node, checked_as_uid=uid,
                              results=results)
    from scout_slurm.hooks.epilog import _node_dir   # created if missing, no link followed
    _node_dir(folder, node)
    write_record(folder.checkpoint_checks_path(restart, node), record, mode=0o644)
    log.info("epilog.checkpoint_checks", job=folder.job_id, node=node, restart=restart, uid=uid,
             notes=len(named), checked=len(results), verified=sum(r.verified for r in results),
             not_checked=len(named) - len(results), seconds=round(time.monotonic() - started, 3))
    return record


def _shown(path: str) -> str:
    return path if len(path) <= MAX_PATH_SHOWN else path[:MAX_PATH_SHOWN - 3] + "..."
