"""The one executor of remediation plans: applies each action through the one door to Slurm,
records each outcome in the actions file as it goes (so a killed hook resumes without doing
anything twice), retries within the hook's time budget, and keeps what it could not apply as
pending. The function that reaches outside is `apply_plan`."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from scout_slurm.errors import ScoutError, SlurmError, SlurmTimeout
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import write_record
from scout_slurm.log import get_logger
from scout_slurm.remediation.records import (
    ActionResult,
    ActionsRecord,
    Drain,
    Exclude,
    PlannedAction,
    PlanStatus,
    Requeue,
    ResumeFrom,
    ResumeInstruction,
)
from scout_slurm.slurm import ops

log = get_logger("scout.remediation")
TRANSIENT = (
    "Unable to contact slurm controller",
    "Connection refused",
    "Socket timed out",
    "Zero Bytes were transmitted",
    "slurm_receive_msg",
    "Resource temporarily unavailable",
)


def _transient(exc: SlurmError) -> bool:
    return isinstance(exc, SlurmTimeout) or any(t in str(exc) for t in TRANSIENT)


def _act(
    action: PlannedAction,
    record: ActionsRecord,
    folder: JobFolder,
    *,
    timeout: float,
    env: Mapping[str, str] | None,
    bin_dir: str,
) -> str:
    p = action.payload
    if isinstance(p, Drain):
        ops.drain_node(p.node, p.reason, timeout=timeout, env=env, bin_dir=bin_dir)
        return "drained"
    if isinstance(p, Requeue):
        # Asked before acting, not after a failure: an earlier run of this hook may have been killed
        # after Slurm requeued the job but before the result was recorded, and by now the rerun may
        # be running, where a second requeue would succeed and cost the job another restart.
        job = ops.job_info(p.job_id, timeout=timeout, env=env, bin_dir=bin_dir)
        if job.restart_count > record.restart:
            return f"already requeued (restart {job.restart_count})"
        ops.requeue_job(p.job_id, timeout=timeout, env=env, bin_dir=bin_dir)
        return "requeued"
    if isinstance(p, Exclude):
        merged = ops.exclude_nodes(
            p.job_id, list(p.nodes), timeout=timeout, env=env, bin_dir=bin_dir
        )
        return f"excluded nodes now {merged}"
    if isinstance(p, ResumeFrom):
        write_record(
            folder.resume_path(record.restart + 1),
            ResumeInstruction(
                job_id=record.job_id,
                restart=record.restart + 1,
                checkpoint=p.checkpoint,
                step=p.step,
                reason=p.describe(),
            ),
        )
        return f"run {record.restart + 1} will resume from {p.checkpoint}"
    raise ScoutError(f"unknown action {action.kind}")


def apply_plan(
    record: ActionsRecord,
    path: Path,
    folder: JobFolder,
    *,
    timeout: float,
    retries: int,
    retry_wait_s: float,
    deadline: float,
    env: Mapping[str, str] | None = None,
    bin_dir: str = "",
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> ActionsRecord:
    done = record.done()
    results = list(record.results)
    status = PlanStatus.APPLIED
    for action in record.actions:
        if (action.kind, action.target) in done:
            continue
        attempts, message, ok = 0, "", False
        while True:
            attempts += 1
            try:
                message = _act(
                    action,
                    record,
                    folder,
                    timeout=min(timeout, max(1.0, deadline - clock())),
                    env=env,
                    bin_dir=bin_dir,
                )
                ok = True
                break
            except SlurmError as exc:
                message = (
                    str(exc).splitlines()[0] + " | " + " ".join(str(exc).splitlines()[1:])[:500]
                )
                if not _transient(exc) or attempts > retries or clock() + retry_wait_s >= deadline:
                    break
                sleep(retry_wait_s)
            except ScoutError as exc:
                message = str(exc)
                break
        results.append(ActionResult(action.kind, action.target, ok, message, attempts, wall()))
        log.info(
            "remediation.action",
            action=action.describe(),
            ok=ok,
            message=message,
            attempts=attempts,
        )
        if not ok:
            status = PlanStatus.PARTIAL if any(r.ok for r in results) else PlanStatus.PENDING
        record = dataclasses.replace(
            record,
            results=tuple(results),
            status=status if not ok else record.status,
            updated_at=wall(),
        )
        write_record(path, record)
        if not ok:
            # later actions depend on this one (exclude after requeue): keep them pending
            return record
    record = dataclasses.replace(record, status=PlanStatus.APPLIED, updated_at=wall())
    write_record(path, record)
    return record
