"""Stage 5, apply (rim): the run's actions record claimed (created once: a second hook that planned
the same run defers to the first) and applied through remediation/apply.py, the one executor,
within the incident's budget; a record a killed hook left planned is resumed. The functions that
reach outside are `claim`, `apply` and `previous` (reads)."""

from __future__ import annotations

from scout_slurm.evidence.store import create_record_exclusive, read_record
from scout_slurm.incident.incident import Incident
from scout_slurm.log import get_logger
from scout_slurm.remediation.apply import apply_plan
from scout_slurm.remediation.records import ActionsRecord

log = get_logger("scout.controller")


def previous(incident: Incident) -> ActionsRecord | None:
    """The run's actions record when one is on record (a hook before this one planned the run);
    raises EvidenceError when it is there and cannot be read."""
    path = incident.folder.actions_path(incident.restart)
    if not path.exists():
        return None
    return read_record(path, ActionsRecord, root=incident.folder.root)


def claim(incident: Incident, record: ActionsRecord) -> ActionsRecord:
    """`record` written as the run's actions record, unless another hook wrote one first: then
    that one, which its writer applies."""
    path = incident.folder.actions_path(incident.restart)
    if create_record_exclusive(path, record):
        return record
    log.info("controller.raced", job=incident.job_id)  # another instance planned first; it applies
    return read_record(path, ActionsRecord, root=incident.folder.root)


def apply(incident: Incident, record: ActionsRecord) -> ActionsRecord:
    """The record's actions not yet done, applied within the budget; the record as it ends."""
    slurm, clock = incident.cfg.slurm, incident.clock
    return apply_plan(
        record,
        incident.folder.actions_path(incident.restart),
        incident.folder,
        timeout=slurm.timeout_s,
        retries=slurm.retries,
        retry_wait_s=slurm.retry_wait_s,
        deadline=incident.budget.deadline,
        env=incident.env,
        bin_dir=slurm.bin_dir,
        clock=clock.monotonic,
        wall=clock.wall,
        sleep=clock.sleep,
    )
