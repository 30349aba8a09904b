"""The incident report and the acceptance report as one self-contained HTML page each (pure:
typed records in, a string out). No script, no network: styles inline, pictures inline SVG drawn
in Python (report/svg.py), and a Content-Security-Policy that forbids fetching or running
anything, so even text a job planted in its evidence can do nothing but be read.

API (for `scout show --html`, the controller's incident bundle and `scout acceptance`):

    render_incident_html(bundle: IncidentBundle) -> str
        bundle: report/bundle.py; fill it from the evidence with
        report/bundle_loader.load_incident_bundle(folder, restart).
    render_acceptance_html(report: AcceptanceReport) -> str
        report: the records below (AcceptanceCheck per judged step, LatencyCase per injected
        fault, optionally the IncidentBundle of each case, drawn in full below the summary).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from scout_slurm.localise.verdict import describe_exit, is_abnormal, is_cascade
from scout_slurm.remediation.records import ResumeFrom
from scout_slurm.report.bundle import IncidentBundle, incident_moments, primary_exits
from scout_slurm.report.svg import LatencyBar, esc, latency_chart_svg, phases_svg, timeline_svg

MAX_TABLE_ROWS = 256  # hardware rows shown (the suspects always are)
MAX_LIST = 40  # findings, reasoning lines, evidence lines shown


@dataclass(frozen=True)
class AcceptanceCheck:
    """One judged step of the acceptance test. passed None: not applicable here (say why in
    detail).
    """

    step: str
    passed: bool | None
    detail: str = ""
    measured: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class LatencyCase:
    """One injected fault: what was expected, what the verdict named, and how long it took."""

    case: str
    expected: str  # e.g. "rank 1 on n2, hang"
    named: str  # what the verdict said, e.g. "rank 1 on n2 (hang)"
    correct: bool
    detection_s: float | None  # fault -> detection (stall decision or finding)
    localisation_s: float | None  # fault -> verdict
    job_id: int = 0
    schema_version: int = 1


@dataclass(frozen=True)
class AcceptanceReport:
    title: str
    cluster: str
    started_at: float
    finished_at: float
    checks: tuple[AcceptanceCheck, ...]
    cases: tuple[LatencyCase, ...] = ()
    incidents: tuple[IncidentBundle, ...] = ()
    notes: tuple[str, ...] = ()
    schema_version: int = 1

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed is not False for c in self.checks)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;
color:#1c2833;max-width:1000px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #cfd8dc}
.sub{color:#546e7a}.verdict{font-size:18px;padding:10px 14px;border-radius:6px;background:#eceff1}
.verdict.bad{background:#fdecea;border-left:6px solid #c62828}
.verdict.ok{background:#e8f5e9;border-left:6px solid #2e7d32}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
th,td{border:1px solid #cfd8dc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eceff1}tr.suspect td{background:#fdecea;font-weight:600}td.num{text-align:right}
.badge{display:inline-block;padding:0 6px;border-radius:4px;font-size:12px;font-weight:600}
.badge.drained{background:#c62828;color:#fff}.badge.pass{background:#2e7d32;color:#fff}
.badge.fail{background:#c62828;color:#fff}.badge.na{background:#90a4ae;color:#fff}
code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#f5f7f8;padding:8px;overflow-x:auto;white-space:pre-wrap}
svg text{font:11px system-ui,sans-serif;fill:#263238}svg text.strong{font-weight:700}
svg text.note{fill:#78909c;font-style:italic}
svg text.tick{font-size:10px}.legend span{display:inline-block;margin-right:14px}
.legend i{display:inline-block;width:12px;height:10px;margin-right:4px;vertical-align:-1px}
.problems{color:#8d6e63}
"""


def _doc(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            # nothing is fetched and nothing runs: the page is what the evidence says, as text
            '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
            "style-src 'unsafe-inline'; "
            'img-src data:">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title, 200)}</title><style>{CSS}</style></head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def _utc(t: float, *, date: bool = False) -> str:
    if not t or t <= 0:
        return "unknown"
    try:
        d = datetime.fromtimestamp(t, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "unknown"
    return d.strftime("%Y-%m-%d %H:%M:%S UTC" if date else "%H:%M:%S.%f")[: None if date else -3]


def _legend() -> str:
    items = (
        ("#e3e8eb", "starting"),
        ("#2e7d32", "advancing"),
        ("#b0bec5", "not advancing"),
        ("#c62828", "stopped (SIGSTOP / D state)"),
        ("#fdecea", "suspect rank"),
    )
    marks = (
        ("#ef6c00", "fault injected"),
        ("#c62828", "detection"),
        ("#6a1b9a", "verdict"),
        ("#1565c0", "actions done"),
    )
    out = ['<p class="legend">'] + [
        f'<span><i style="background:{c}"></i>{t}</span>' for c, t in items
    ]
    out += [
        f'<span><i style="background:{c};height:2px;vertical-align:3px"></i>{t}</span>'
        for c, t in marks
    ]
    out.append("<span>\u00d7 exit (red: failed on its own, orange: cascade)</span></p>")
    return "".join(out)


def incident_section(bundle: IncidentBundle, *, heading_level: int = 2) -> list[str]:
    """The body of one incident (verdict, pictures, map, evidence, actions, checkpoint), to be
    placed in a page; the acceptance report draws one per case."""
    h = f"h{heading_level}"
    v, ev = bundle.verdict, bundle.evidence
    m = incident_moments(bundle)
    bad = v.kind.value not in ("clean", "unchecked")
    out = [f'<section class="incident" data-job="{v.job_id}" data-restart="{v.restart}">']
    who = "; ".join(
        f"rank {s.rank} on node {s.node} ({s.kind.value}, {s.confidence:.2f})"
        for s in v.suspects[:8]
    )
    if len(v.suspects) > 8:
        who += f"; and {len(v.suspects) - 8} more"
    out.append(
        f'<div class="verdict {"bad" if bad else "ok"}"><b>{esc(v.kind.value)}</b> '
        f"(confidence {v.confidence:.2f}): {esc(who or 'no suspect named', 2000)}"
        + (f"; first suspect step {v.first_suspect_step}" if v.first_suspect_step >= 0 else "")
        + (
            f'<br>cause: <b class="cause">{esc(v.cause.value)}</b> '
            f"({esc(v.cause_evidence or 'no evidence recorded', 600)})"
            if v.cause.value != "unknown" or v.kind.value in ("crash", "hang", "sdc", "infra")
            else ""
        )
        + (
            ' <span class="sub">(computed now from the evidence; the Epilog recorded none)</span>'
            if bundle.verdict_computed
            else ""
        )
        + "</div>"
    )
    checks = (
        v.coverage.lines()
        if v.coverage is not None
        else ("no record of scout's checks in this run",)
    )
    out.append('<p class="sub">Checks that ran: ' + "; ".join(esc(c, 400) for c in checks) + "</p>")

    out.append(f"<{h}>Who stopped when</{h}>")
    out.append(
        '<p class="sub">One row per rank: progress over time up to its last advance, from the '
        "samples the "
        "watchdogs kept. Times are relative to the fault (or the suspect's last progress); "
        "clocks of "
        "different nodes may differ by milliseconds, so progress order, not these times, "
        "decides who was "
        "first.</p>"
    )
    out.append(_legend())
    out.append(timeline_svg(bundle, m))

    out.append(f"<{h}>Detection latency</{h}>")
    out.append(phases_svg(m))
    out.append(
        '<table class="moments"><tr><th>moment</th><th>time (UTC)</th><th>after the '
        f"{'fault' if m.fault_at else 'last progress'}</th></tr>"
    )
    for name, t in (
        ("fault injected", m.fault_at),
        ("suspect's last progress", m.last_advance_at),
        ("detection", m.detected_at),
        ("verdict", m.verdict_at),
        ("actions done", m.actions_done_at),
    ):
        after = f"{t - m.origin:.2f} s" if t and m.origin else "-"
        out.append(f'<tr><td>{name}</td><td>{_utc(t)}</td><td class="num">{after}</td></tr>')
    out.append("</table>")

    out.append(f"<{h}>Suspects on the hardware</{h}>")
    out.append(_hardware_table(bundle))

    out.append(f"<{h}>Evidence</{h}>")
    out.append(_evidence(bundle))
    if bundle.flight_recorder:
        out.append(f"<{h}>torch's Flight Recorder: where each rank was</{h}>")
        out.append(
            '<pre class="flight-recorder">'
            + esc("\n".join(bundle.flight_recorder), 20000)
            + "</pre>"
        )
    for rank, frames in bundle.stacks:
        out.append(f'<{h} class="stack">Rank {rank}\'s stack when scout dumped it</{h}>')
        out.append(
            f'<pre class="stack" data-rank="{rank}">{esc(chr(10).join(frames), 20000)}</pre>'
        )

    out.append(f"<{h}>Actions</{h}>")
    out.append(_actions(bundle))

    out.append(f"<{h}>Checkpoint decision</{h}>")
    out.append(_checkpoint(bundle))
    if bundle.problems or ev.problems:
        out.append(f"<{h}>What could not be read</{h}>")
        probs = list(bundle.problems) + list(ev.problems)
        out.append(
            '<ul class="problems">'
            + "".join(f"<li>{esc(p)}</li>" for p in probs[:MAX_LIST])
            + "</ul>"
        )
    out.append("</section>")
    return out


def _hardware_table(bundle: IncidentBundle) -> str:
    rows = list(bundle.hardware)
    if not rows:
        return '<p class="note">no rank places recorded</p>'
    suspects, drained = bundle.suspect_ranks, set(bundle.drained)
    keep = [r for r in rows if r.rank in suspects]
    keep += [r for r in rows if r.rank not in suspects][: max(0, MAX_TABLE_ROWS - len(keep))]
    keep.sort(key=lambda r: r.rank)
    out = [
        "<table "
        'class="hwmap"><tr><th>rank</th><th>local</th><th>node</th><th>hostname</th><th>GPU '
        "UUID</th>"
        "<th>GPU serial</th><th>NIC</th><th>status</th></tr>"
    ]
    for r in keep:
        status = []
        if r.rank in suspects:
            status.append("suspect")
        if r.node in drained:
            status.append('<span class="badge drained">drained</span>')
        if r.map_missing:
            status.append("no hardware map")
        out.append(
            f'<tr class="{"suspect" if r.rank in suspects else "rank"}" data-rank="{r.rank}">'
            f'<td class="num">{r.rank}</td><td '
            f'class="num">{r.local_rank}</td><td>{esc(r.node, 128)}</td>'
            f"<td>{esc(r.hostname or '?', 128)}</td>"
            f"<td>{esc(', '.join(r.gpu_uuids) or '-', 400)}</td>"
            f"<td>{esc(', '.join(r.gpu_serials) or '-', 200)}</td><td>{esc(r.nic or '-', 128)}</td>"
            f"<td>{' '.join(status)}</td></tr>"
        )
    out.append("</table>")
    more = max(len(rows), bundle.evidence.world_size) - len(keep)
    if more > 0:
        out.append(
            f'<p class="note">{more} more rank(s) not listed (scout map JOBID shows all)</p>'
        )
    return "".join(out)


def _evidence(bundle: IncidentBundle) -> str:
    v, ev = bundle.verdict, bundle.evidence
    out = ['<div class="evidence"><p><b>Reasoning</b></p><ul>']
    out += [f"<li>{esc(r)}</li>" for r in v.reasoning[:MAX_LIST]]
    out.append("</ul>")
    for s in v.suspects[:8]:
        out.append(f"<p><b>rank {s.rank} on {esc(s.node, 128)}</b></p><ul>")
        out += [f"<li>{esc(e)}</li>" for e in s.evidence[:MAX_LIST]]
        out.append("</ul>")
        e = ev.exits.get(s.rank)
        if e is not None:
            how = describe_exit(e) if is_abnormal(e) else "exited 0"
            why = (
                " (scout ended it)" if e.killed_by_scout else " (cascade)" if is_cascade(e) else ""
            )
            out.append(f"<p>exit: {esc(how)}{why} at {_utc(e.at)}</p>")
            if e.stderr_tail:
                out.append("<pre>" + esc("\n".join(e.stderr_tail[-12:]), 4000) + "</pre>")
    findings = sorted(ev.findings, key=lambda f: f.at)[:MAX_LIST]
    if findings:
        out.append(
            '<table class="findings"><tr><th>time '
            "(UTC)</th><th>rank</th><th>kind</th><th>summary</th></tr>"
        )
        for f in findings:
            out.append(
                f"<tr><td>{_utc(f.at)}</td><td "
                f'class="num">{f.rank}</td><td>{esc(f.kind.value)}</td>'
                f"<td>{esc(f.summary)}</td></tr>"
            )
        out.append("</table>")
    firsts = primary_exits(ev)[:8]
    if firsts:
        out.append(
            "<p>failed on their own (not cascades), first first: "
            + ", ".join(f"rank {e.rank} ({esc(describe_exit(e))}, {_utc(e.at)})" for e in firsts)
            + "</p>"
        )
    out.append("</div>")
    return "".join(out)


def _actions(bundle: IncidentBundle) -> str:
    a = bundle.actions
    if a is None:
        return '<div class="actions"><p>no remediation recorded</p></div>'
    results = {(r.kind, r.target): r for r in a.results}
    out = [
        f'<div class="actions"><p>plan status: <b>{esc(a.status.value)}</b></p>'
        "<table><tr><th>action</th><th>state</th><th>result</th><th>time (UTC)</th></tr>"
    ]
    for p in a.actions[:MAX_LIST]:
        r = results.get((p.kind, p.target))
        state = "pending" if r is None else ("done" if r.ok else "FAILED")
        out.append(
            f"<tr><td>{esc(p.describe())}</td><td>{state}</td>"
            f"<td>{esc(r.message if r else '')}</td>"
            f"<td>{_utc(r.at) if r else '-'}</td></tr>"
        )
    out.append("</table>")
    if a.held_back:
        out.append(
            "<p>held back by the guards:</p><ul>"
            + "".join(f"<li>{esc(h)}</li>" for h in a.held_back[:MAX_LIST])
            + "</ul>"
        )
    out.append("</div>")
    return "".join(out)


def _checkpoint(bundle: IncidentBundle) -> str:
    a, res = bundle.actions, bundle.resume
    plan = [p.payload for p in (a.actions if a else ()) if isinstance(p.payload, ResumeFrom)]
    out = ['<div class="checkpoint">']
    if res is not None:
        out.append(
            f"<p>run {res.restart} resumes from <code>{esc(res.checkpoint, 500)}</code> (step "
            f"{res.step}): "
            f"{esc(res.reason, 1000)}</p>"
        )
    elif plan:
        out.append(
            f"<p>planned: resume from <code>{esc(plan[0].checkpoint, 500)}</code> "
            f"({esc(plan[0].describe(), 1000)})</p>"
        )
    else:
        out.append(
            "<p>no checkpoint chosen for a rerun (none noted, none eligible, or no requeue)</p>"
        )
    if bundle.verdict.first_suspect_step >= 0:
        out.append(
            f"<p>rule: the newest eligible checkpoint strictly before the first suspect step "
            f"({bundle.verdict.first_suspect_step}); `scout checkpoints JOBID` lists every "
            "checkpoint and why.</p>"
        )
    out.append("</div>")
    return "".join(out)


def render_incident_html(bundle: IncidentBundle) -> str:
    """The whole incident page for one run of one job."""
    v = bundle.verdict
    title = f"scout incident: job {v.job_id}, run {v.restart}"
    head = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">cluster {esc(bundle.cluster, 64)} \u00b7 world size {v.world_size} '
        "\u00b7 verdict written "
        f"{_utc(v.created_at, date=True)}</p>",
    ]
    return _doc(title, head + incident_section(bundle))


def _badge(passed: bool | None) -> str:
    if passed is None:
        return '<span class="badge na">n/a</span>'
    return (
        '<span class="badge pass">PASS</span>' if passed else '<span class="badge fail">FAIL</span>'
    )


def render_acceptance_html(report: AcceptanceReport) -> str:
    """The acceptance page: the verdict of each step, detection latency per case, then each
    case's incident in full."""
    title = report.title or "scout acceptance"
    not_applicable = sum(c.passed is None for c in report.checks)
    out = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="sub">cluster {esc(report.cluster, 64)} \u00b7 '
        f"{_utc(report.started_at, date=True)} to "
        f"{_utc(report.finished_at, date=True)}</p>",
        f'<div id="summary" class="verdict {"ok" if report.passed else "bad"}"><b>'
        f"{'PASSED' if report.passed else 'FAILED'}</b>: "
        f"{sum(c.passed is True for c in report.checks)} of {len(report.checks)} steps passed"
        + (f", {not_applicable} not applicable" if not_applicable else "")
        + "</div>",
        "<h2>Steps</h2>",
        '<table id="checks"><tr><th>step</th><th>result</th><th>measured</th><th>detail</th></tr>',
    ]
    for c in report.checks[:200]:
        out.append(
            "<tr "
            f'data-passed="{str(c.passed).lower()}"><td>{esc(c.step)}</td><td>{_badge(c.passed)}</td>'
            f"<td>{esc(c.measured)}</td><td>{esc(c.detail, 2000)}</td></tr>"
        )
    out.append("</table>")
    if report.cases:
        out.append("<h2>Detection latency per case</h2>")
        out.append(
            latency_chart_svg(
                [
                    LatencyBar(c.case, c.detection_s, c.localisation_s, c.correct)
                    for c in report.cases
                ]
            )
        )
        out.append(
            "<table "
            'id="cases"><tr><th>case</th><th>job</th><th>expected</th><th>named</th><th>right?</th>'
            "<th>to detection</th><th>to verdict</th></tr>"
        )
        for c in report.cases[:200]:
            det = f"{c.detection_s:.2f} s" if c.detection_s is not None else "-"
            loc = f"{c.localisation_s:.2f} s" if c.localisation_s is not None else "-"
            out.append(
                f"<tr><td>{esc(c.case)}</td><td "
                f'class="num">{c.job_id or "-"}</td><td>{esc(c.expected)}</td>'
                f'<td>{esc(c.named)}</td><td>{_badge(c.correct)}</td><td class="num">{det}</td>'
                f'<td class="num">{loc}</td></tr>'
            )
        out.append("</table>")
    if report.notes:
        out.append(
            "<h2>Notes</h2><ul>"
            + "".join(f"<li>{esc(n, 2000)}</li>" for n in report.notes[:MAX_LIST])
            + "</ul>"
        )
    for b in report.incidents[:32]:
        out.append(f"<h2>Incident: job {b.job_id}, run {b.restart}</h2>")
        out += incident_section(b, heading_level=3)
    return _doc(title, out)
