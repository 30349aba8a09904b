"""The incident report in Markdown, for terminals and tickets (pure)."""

from __future__ import annotations

import html
from datetime import UTC, datetime

from scout_slurm.evidence.records import JobEvidence, Verdict
from scout_slurm.remediation.records import ActionsRecord
from scout_slurm.report.bundle import IncidentBundle, incident_moments
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


def _cell(value: object, limit: int = 200) -> str:
    """A Markdown table cell from evidence text: one line, no column break, no markup."""
    text = "".join(c if c.isprintable() else "\ufffd" for c in " ".join(str(value).split())[:limit])
    return html.escape(text, quote=False).replace("|", "\\|").replace("`", "'") or "-"


def render_latency(bundle: IncidentBundle) -> list[str]:
    m = incident_moments(bundle)
    rows = [
        ("fault injected", m.fault_at),
        ("suspect's last progress", m.last_advance_at),
        ("detection", m.detected_at),
        ("verdict", m.verdict_at),
        ("actions done", m.actions_done_at),
    ]
    start = "the fault" if m.fault_at else "the suspect's last progress"
    out = [f"| moment | after {start} |", "|---|---:|"]
    out += [f"| {name} | {t - m.origin:.2f} s |" for name, t in rows if t and m.origin]
    return out if len(out) > 2 else ["the moments of this incident are not known"]


def render_hardware(bundle: IncidentBundle, limit: int = 64) -> list[str]:
    """Suspects first, then the lowest ranks: rank, node, GPU UUID, NIC, and what scout did."""
    suspects, drained = bundle.suspect_ranks, set(bundle.drained)
    rows = sorted(bundle.hardware, key=lambda r: (r.rank not in suspects, r.rank))[:limit]
    if not rows:
        return ["no rank places recorded"]
    out = [
        "| rank | node | hostname | GPU UUID | GPU serial | NIC | |",
        "|---:|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = ", ".join(
            n
            for n, on in (("**suspect**", r.rank in suspects), ("drained", r.node in drained))
            if on
        )
        out.append(
            f"| {r.rank} | {_cell(r.node)} | {_cell(r.hostname or '?')} | "
            f"{_cell(', '.join(r.gpu_uuids))} | "
            f"{_cell(', '.join(r.gpu_serials))} | {_cell(r.nic)} | {note} |"
        )
    if bundle.evidence.world_size > len(rows):
        out.append(
            f"\n{bundle.evidence.world_size - len(rows)} more rank(s): `scout map {bundle.job_id}`"
        )
    return out


def render_incident_markdown(
    verdict: Verdict,
    evidence: JobEvidence,
    record: ActionsRecord | None,
    bundle: IncidentBundle | None = None,
) -> str:
    """With a bundle (report/bundle.py), also the detection latency and the suspects' hardware."""
    when = datetime.fromtimestamp(verdict.created_at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = [
        f"# scout incident: job {verdict.job_id}, run {verdict.restart}",
        "",
        f"Written {when}.",
        "",
        "## Verdict",
        "",
        "```",
        *render_verdict(verdict),
        "```",
        "",
        "## Timeline",
        "",
        "```",
        *render_timeline(evidence),
        "```",
        "",
    ]
    if bundle is not None:
        out += [
            "## Detection latency",
            "",
            *render_latency(bundle),
            "",
            "## Suspects on the hardware",
            "",
            *render_hardware(bundle),
            "",
        ]
    out += ["## Actions", "", *render_actions(record), ""]
    return "\n".join(out)
