"""The incident report in Markdown, for terminals and tickets (pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from scout_slurm.evidence.records import Verdict
from scout_slurm.localise.verdict import JobEvidence
from scout_slurm.remediation.records import ActionsRecord
from scout_slurm.report.show import render_timeline, render_verdict


def render_actions(record: ActionsRecord | None) -> list[str]:
    if record is None:
        return ["no remediation recorded"]
    lines = [f"status: {record.status.value}"]
    results = {(r.kind, r.target): r for r in record.results}
    for a in record.actions:
        r = results.get((a.kind, a.target))
        state = "pending" if r is None else ("done" if r.ok else "FAILED")
        lines.append(f"- [{state}] {a.describe()}" + (f" -> {r.message}" if r else ""))
    for h in record.held_back:
        lines.append(f"- held back: {h}")
    return lines


def render_incident_markdown(verdict: Verdict, evidence: JobEvidence, record: ActionsRecord | None) -> str:
    when = datetime.fromtimestamp(verdict.created_at, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = [f"# scout incident: job {verdict.job_id}, run {verdict.restart}", "", f"Written {when}.", "",
           "## Verdict", "", "```", *render_verdict(verdict), "```", "", "## Timeline", "", "```",
           *render_timeline(evidence), "```", "", "## Actions", "", *render_actions(record), ""]
    return "\n".join(out)
