"""Stage 6, report (rim): what the incident leaves in the job's results folder for people and for
later incidents: the verdict, the drain decisions, and the incident report (Markdown; the HTML page
when the bundle draws). The functions that reach outside are `write_verdict`, `write_decisions`
and `write_report`."""

from __future__ import annotations

from scout_slurm.errors import ScoutError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import Verdict
from scout_slurm.evidence.store import atomic_write_bytes, write_record
from scout_slurm.localise.verdict import JobEvidence
from scout_slurm.log import get_logger
from scout_slurm.remediation.plan import DrainDecisions
from scout_slurm.remediation.records import ActionsRecord, RerunCheckpoints
from scout_slurm.report.markdown import render_incident_markdown

log = get_logger("scout.controller")


def write_verdict(folder: JobFolder, restart: int, verdict: Verdict) -> None:
    write_record(folder.verdict_path(restart), verdict)


def write_decisions(folder: JobFolder, record: DrainDecisions | None) -> None:
    """The drain decisions, for the watch list and the next incident's drain rule; failing to
    write them is logged, never raised."""
    if record is None:
        return
    try:
        write_record(folder.drain_decisions_path(record.restart), record)
    except (ScoutError, OSError) as exc:
        log.warning(
            "controller.decisions_not_written",
            error=str(exc),
            consequence="this incident will not count towards the drain rule's history",
        )


def write_report(
    folder: JobFolder, restart: int, verdict: Verdict, evidence: JobEvidence, record: ActionsRecord
) -> None:
    """The incident report, Markdown always; the HTML page when the bundle could be built."""
    # the pictures (latency, hardware, the HTML page) come from the bundle; failing to build or draw
    # them must never cost the Markdown report, the plan or the Epilog
    bundle = None
    try:
        from scout_slurm.report.bundle_loader import load_incident_bundle

        bundle = load_incident_bundle(
            folder, restart, evidence=evidence, verdict=verdict, actions=record
        )
    except Exception as exc:
        log.warning("controller.report_bundle_failed", job=folder.job_id, error=repr(exc))
    try:
        text = render_incident_markdown(verdict, evidence, record, bundle=bundle)
    except Exception as exc:
        log.warning("controller.report_bundle_failed", job=folder.job_id, error=repr(exc))
        bundle, text = None, render_incident_markdown(verdict, evidence, record)
    atomic_write_bytes(folder.report_path(restart), text.encode("utf-8"))
    if bundle is None:
        return
    try:
        from scout_slurm.report.html import render_incident_html

        atomic_write_bytes(
            folder.report_html_path(restart), render_incident_html(bundle).encode("utf-8")
        )
    except Exception as exc:
        log.warning("controller.report_html_failed", job=folder.job_id, error=repr(exc))


def write_rerun_checkpoints(folder: JobFolder, told: RerunCheckpoints) -> None:
    """What the rerun is told of the checkpoints (its scout-task reads it); failing to write it is
    logged: the rerun then checks its loads against nothing."""
    try:
        write_record(folder.rerun_checkpoints_path(told.restart), told)
    except (ScoutError, OSError) as exc:
        log.warning(
            "controller.rerun_checkpoints_not_written",
            error=str(exc),
            consequence="the rerun's loads are not checked against the rejected checkpoints",
        )
