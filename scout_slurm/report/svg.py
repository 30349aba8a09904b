"""Pictures of an incident as inline SVG, drawn here in Python so the page needs no script to
render (pure: records in, markup out). Every text drawn comes from evidence the job wrote: it is
escaped and cut to a bound, and the number of rows and marks drawn is bounded too.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scout_slurm.evidence.history import ProgressSample
from scout_slurm.evidence.records import ChildState
from scout_slurm.localise.verdict import describe_exit, is_abnormal, is_cascade
from scout_slurm.report.bundle import IncidentBundle, IncidentMoments, rank_last_advance

MAX_ROWS = 48  # ranks drawn in a timeline; the suspects always are
MAX_TEXT = 300  # characters of any one text from the evidence
WIDTH = 980
LABEL_W = 170  # rank labels on the left
STATE_W = 250  # end-of-run text on the right
ROW_H = 22
TOP = 46  # room for the moment labels and the axis
COLOURS = {
    "starting": "#e3e8eb",
    "advancing": "#2e7d32",
    "idle": "#b0bec5",
    "stopped": "#c62828",
    "exited": "#455a64",
}
MOMENT_COLOURS = {
    "fault": "#ef6c00",
    "last progress": "#8d6e63",
    "detection": "#c62828",
    "verdict": "#6a1b9a",
    "actions done": "#1565c0",
}


def esc(value: object, limit: int = MAX_TEXT) -> str:
    """Escaped text for HTML or SVG, cut to `limit` characters (the cut is said with an ellipsis).
    Control characters are replaced: they are not valid in XML and mean nothing to a reader."""
    text = str(value)
    if len(text) > limit:
        text = text[:limit] + "\u2026"
    text = "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in text)
    return html.escape(text, quote=True)


def _num(x: float) -> str:
    return f"{x:.1f}"


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if abs(s) < 100 else f"{s:.0f} s"


def pick_rows(world: int, suspects: frozenset[int], limit: int = MAX_ROWS) -> list[int]:
    """The ranks to draw, in rank order: every suspect, their neighbours, then the lowest ranks."""
    chosen = [r for r in sorted(suspects) if 0 <= r < world][:limit]
    want = set(chosen)
    for r in sorted(suspects):
        for n in (r - 1, r + 1):
            if 0 <= n < world and len(want) < limit:
                want.add(n)
    r = 0
    while len(want) < min(limit, world) and r < world:
        want.add(r)
        r += 1
    return sorted(want)


@dataclass(frozen=True)
class _Segment:
    kind: str
    start: float
    end: float


def segments(samples: Sequence[ProgressSample]) -> list[_Segment]:
    """Consecutive samples merged into runs of one kind: starting (no advance yet: imports,
    rendezvous), advancing (its position changed since the previous sample), idle, stopped
    (SIGSTOP or uninterruptible sleep), exited."""
    out: list[_Segment] = []
    moved = False
    for a, b in zip(samples, samples[1:]):
        if b.state in (ChildState.STOPPED, ChildState.DISK_SLEEP):
            kind = "stopped"
        elif b.state == ChildState.EXITED and a.state == ChildState.EXITED:
            kind = "exited"
        elif (a.opt_steps, a.coll_entered, a.coll_completed) != (
            b.opt_steps,
            b.coll_entered,
            b.coll_completed,
        ):
            kind, moved = "advancing", True
        else:
            kind = "idle" if moved else "starting"
        if out and out[-1].kind == kind and out[-1].end == a.at:
            out[-1] = _Segment(kind, out[-1].start, b.at)
        else:
            out.append(_Segment(kind, a.at, b.at))
    return out


class _Scale:
    def __init__(self, t0: float, t1: float, x0: float, x1: float) -> None:
        self.t0, self.t1 = t0, max(t1, t0 + 1.0)
        self.x0, self.x1 = x0, x1

    def x(self, t: float) -> float:
        t = min(max(t, self.t0), self.t1)
        return self.x0 + (t - self.t0) / (self.t1 - self.t0) * (self.x1 - self.x0)


def _nice_step(span: float, target: int = 8) -> float:
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _moment_marks(m: IncidentMoments) -> list[tuple[str, float]]:
    marks = [
        ("fault", m.fault_at),
        ("detection", m.detected_at),
        ("verdict", m.verdict_at),
        ("actions done", m.actions_done_at),
    ]
    if not m.fault_at:
        marks.insert(0, ("last progress", m.last_advance_at))
    return [(n, t) for n, t in marks if t > 0]


def timeline_svg(bundle: IncidentBundle, moments: IncidentMoments) -> str:
    """One row per rank: its progress over time up to its last advance (green), idle (grey),
    stopped (red), its exit; the incident's moments as vertical lines; suspects highlighted."""
    ev = bundle.evidence
    rows = pick_rows(ev.world_size, bundle.suspect_ranks)
    times: list[float] = []
    for r in rows:
        times += [s.at for s in bundle.history.get(r, ())]
        e = ev.exits.get(r)
        if e is not None and e.at > 0:
            times.append(e.at)
        p = ev.last_progress(r)
        if p is not None and p.published_at > 0:
            times.append(p.published_at)
            times.append(max(0.0, p.published_at - p.idle_s))
    marks = _moment_marks(moments)
    times += [t for _, t in marks]
    times = [t for t in times if t > 0 and math.isfinite(t)]
    height = TOP + ROW_H * max(1, len(rows)) + 60
    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="per-rank progress timeline">'
    ]
    if not rows or not times:
        out.append(
            f'<text x="10" y="{TOP}" class="note">no progress recorded for this run</text></svg>'
        )
        return "".join(out)
    t0, t1 = min(times), max(times)
    # around the incident: from just before the first advance, not from the imports before it
    firsts = [
        seg.start
        for r in rows
        for seg in segments(bundle.history.get(r, ()))[:64]
        if seg.kind == "advancing"
    ]
    if firsts:
        t0 = max(t0, min(firsts) - max(1.0, 0.1 * (t1 - min(firsts))))
    pad = max(0.5, (t1 - t0) * 0.03)
    scale = _Scale(t0 - pad, t1 + pad, LABEL_W, WIDTH - STATE_W)
    origin = moments.origin or t0
    # axis: seconds relative to the fault (or the suspect's last progress)
    step = _nice_step(scale.t1 - scale.t0)
    k = math.ceil((scale.t0 - origin) / step)
    axis_y = TOP - 6
    out.append(
        f'<g class="axis"><line x1="{LABEL_W}" y1="{axis_y}" x2="{WIDTH - STATE_W}" y2="{axis_y}" '
        'stroke="#90a4ae"/>'
    )
    while origin + k * step <= scale.t1 and k < 10_000:
        t = origin + k * step
        x = scale.x(t)
        label = "0" if k == 0 else f"{k * step:+g} s"
        out.append(
            f'<line x1="{_num(x)}" y1="{axis_y - 3}" x2="{_num(x)}" y2="{axis_y + 3}" '
            'stroke="#90a4ae"/>'
            f'<text x="{_num(x)}" y="{axis_y - 5}" class="tick" text-anchor="middle">{label}</text>'
        )
        k += 1
    out.append("</g>")
    for i, r in enumerate(rows):
        y = TOP + i * ROW_H
        suspect = r in bundle.suspect_ranks
        node = ev.node_of(r)
        cls = "rank-row suspect" if suspect else "rank-row"
        out.append(f'<g class="{cls}" data-rank="{r}">')
        if suspect:
            out.append(
                f'<rect class="band" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}" '
                'fill="#fdecea"/>'
            )
        label = f"rank {r} \u00b7 {node}" + (" \u00b7 suspect" if suspect else "")
        out.append(
            f'<text x="6" y="{y + 15}" '
            f'class="{"label strong" if suspect else "label"}">{esc(label, 60)}</text>'
        )
        samples = bundle.history.get(r, ())
        drawn = 0
        if len(samples) >= 2:
            for seg in segments(samples):
                x0, x1 = scale.x(seg.start), scale.x(seg.end)
                out.append(
                    f'<rect class="bar {seg.kind}" x="{_num(x0)}" y="{y + 5}" '
                    f'width="{_num(max(1.0, x1 - x0))}" '
                    f'height="{ROW_H - 10}" fill="{COLOURS[seg.kind]}"><title>rank {r} {seg.kind} '
                    f"{_seconds(seg.start - origin)} to {_seconds(seg.end - origin)}</title></rect>"
                )
                drawn += 1
        else:
            p = ev.last_progress(r)
            if p is not None and p.published_at > 0:
                # no history kept: the last snapshot still says when the rank last advanced
                adv = rank_last_advance(bundle, r)
                xs, xa, xe = scale.x(scale.t0), scale.x(adv), scale.x(p.published_at)
                out.append(
                    f'<rect class="bar advancing" x="{_num(xs)}" y="{y + 5}" '
                    f'width="{_num(max(1.0, xa - xs))}" '
                    f'height="{ROW_H - 10}" fill="{COLOURS["advancing"]}" '
                    f'opacity="0.6"><title>rank {r} '
                    "advancing (no history kept: from its last snapshot)</title></rect>"
                )
                idle_kind = (
                    "stopped"
                    if p.child_state in (ChildState.STOPPED, ChildState.DISK_SLEEP)
                    else "idle"
                )
                out.append(
                    f'<rect class="bar {idle_kind}" x="{_num(xa)}" y="{y + 5}" '
                    f'width="{_num(max(1.0, xe - xa))}" '
                    f'height="{ROW_H - 10}" fill="{COLOURS[idle_kind]}"/>'
                )
                drawn += 2
        adv = rank_last_advance(bundle, r)
        if adv > 0:
            xa = scale.x(adv)
            out.append(
                f'<line class="last-advance" x1="{_num(xa)}" y1="{y + 2}" x2="{_num(xa)}" '
                f'y2="{y + ROW_H - 2}" '
                f'stroke="#1b5e20" stroke-width="2"><title>rank {r} last advanced at '
                f"{_seconds(adv - origin)}</title></line>"
            )
        e = ev.exits.get(r)
        if e is not None and e.at > 0:
            xe = scale.x(e.at)
            colour = (
                "#b71c1c"
                if r in bundle.suspect_ranks or (is_abnormal(e) and not is_cascade(e))
                else "#455a64"
                if not is_abnormal(e)
                else "#ef6c00"
            )
            out.append(
                f'<path class="exit" d="M{_num(xe - 5)} {y + 6} l10 10 m0 -10 l-10 10" '
                f'stroke="{colour}" '
                f'stroke-width="2.5"><title>rank {r}: '
                f"{esc(describe_exit(e) if is_abnormal(e) else 'exited 0')} "
                f"at {_seconds(e.at - origin)}</title></path>"
            )
        out.append(
            f'<text x="{WIDTH - STATE_W + 8}" y="{y + 15}" '
            f'class="state">{esc(_end_text(bundle, r), 60)}</text>'
        )
        if not drawn:
            out.append(
                f'<text x="{LABEL_W + 4}" y="{y + 15}" class="note">no progress recorded</text>'
            )
        out.append("</g>")
    # the moments, over all rows, labels placed on lines below so that close ones stay readable
    bottom = TOP + ROW_H * len(rows)
    labels = _place_labels(
        [(scale.x(t), f"{name} {_seconds(t - origin)}") for name, t in marks], WIDTH - 4
    )
    for (name, t), (lx, level, anchor) in zip(marks, labels):
        x = scale.x(t)
        c = MOMENT_COLOURS[name]
        out.append(
            f'<g class="moment" data-moment="{esc(name)}"><line x1="{_num(x)}" y1="{TOP - 2}" '
            f'x2="{_num(x)}" '
            f'y2="{bottom}" stroke="{c}" stroke-width="1.5" stroke-dasharray="5 3"/>'
            f'<text x="{_num(lx)}" y="{bottom + 12 + 11 * level}" fill="{c}" class="tick" '
            f'text-anchor="{anchor}">{esc(name)} {_seconds(t - origin)}</text></g>'
        )
    if ev.world_size > len(rows):
        out.append(
            f'<text x="6" y="{height - 2}" class="note">{ev.world_size - len(rows)} more '
            "rank(s) not drawn"
            "</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _place_labels(
    items: list[tuple[float, str]], right: float, char_w: float = 5.6
) -> list[tuple[float, int, str]]:
    """(x, line, anchor) for labels wanted at x: the first line where it does not overlap the
    previous label there; a label that would run past `right` ends at x instead of starting."""
    ends: list[float] = []
    out = []
    for x, text in items:
        w = len(text) * char_w
        start, anchor = x + 3, "start"
        if start + w > right:
            start, anchor = x - 3 - w, "end"
        level = next((i for i, e in enumerate(ends) if start > e + 6), len(ends))
        if level == len(ends):
            ends.append(0.0)
        ends[level] = start + w
        out.append((start + w if anchor == "end" else start, level, anchor))
    return out


def _end_text(bundle: IncidentBundle, r: int) -> str:
    ev = bundle.evidence
    p = ev.last_progress(r)
    if p is None:
        return "no progress record"
    where = f"in {p.current_op}" if p.in_collective else "between collectives"
    text = f"step {p.opt_steps}, {p.coll_completed} coll done, {where}"
    if p.child_state in (ChildState.STOPPED, ChildState.DISK_SLEEP):
        text += f", {p.child_state.value}"
    return text


def phases_svg(moments: IncidentMoments) -> str:
    """One incident's latency as a stacked bar: fault (or last progress) -> detection -> verdict
    -> actions done."""
    phases = moments.phases()
    height = 84
    out = [
        f'<svg class="phases" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="detection latency">'
    ]
    if not phases:
        out.append(
            '<text x="10" y="30" class="note">the moments of this incident are not '
            "known</text></svg>"
        )
        return "".join(out)
    total = max(phases[-1][2] - phases[0][1], 1e-3)
    scale = _Scale(phases[0][1], phases[0][1] + total, 10, WIDTH - 10)
    colours = ("#ef6c00", "#c62828", "#6a1b9a", "#1565c0")
    labels = _place_labels(
        [(scale.x(a), f"{label}: {_seconds(b - a)}") for label, a, b in phases], WIDTH - 4
    )
    for i, ((label, a, b), (lx, level, anchor)) in enumerate(zip(phases, labels)):
        x0, x1 = scale.x(a), scale.x(b)
        out.append(
            f'<g class="phase"><rect class="bar" x="{_num(x0)}" y="8" '
            f'width="{_num(max(2.0, x1 - x0))}" '
            f'height="22" fill="{colours[i % 4]}"><title>{esc(label)}: '
            f"{_seconds(b - a)}</title></rect>"
            f'<text x="{_num(lx)}" y="{44 + 12 * level}" class="tick" '
            f'text-anchor="{anchor}">{esc(label)}: '
            f"{_seconds(b - a)}</text></g>"
        )
    out.append("</svg>")
    return "".join(out)


@dataclass(frozen=True)
class LatencyBar:
    label: str
    detection_s: float | None
    localisation_s: float | None
    ok: bool = True


def latency_chart_svg(bars: Sequence[LatencyBar], *, limit: int = 64) -> str:
    """Detection and localisation latency per case, two horizontal bars each."""
    bars = list(bars)[:limit]
    row = 34
    height = 30 + row * max(1, len(bars)) + 10
    out = [
        f'<svg id="latency" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="detection latency per case">'
        f'<rect x="{LABEL_W + 40}" y="6" width="12" height="10" fill="#c62828"/>'
        f'<text x="{LABEL_W + 56}" y="15" class="tick">fault to detection</text>'
        f'<rect x="{LABEL_W + 180}" y="6" width="12" height="10" fill="#6a1b9a"/>'
        f'<text x="{LABEL_W + 196}" y="15" class="tick">fault to verdict (localisation)</text>'
    ]
    values = [
        v
        for b in bars
        for v in (b.detection_s, b.localisation_s)
        if v is not None and math.isfinite(v)
    ]
    top = max([1.0] + values)
    x0, x1 = LABEL_W + 40, WIDTH - 90
    for i, b in enumerate(bars):
        y = 26 + i * row
        out.append(
            f'<g class="case" data-ok="{str(b.ok).lower()}"><text x="6" y="{y + 16}" class="label">'
            f"{esc(b.label, 40)}</text>"
        )
        for j, (v, colour) in enumerate(
            ((b.detection_s, "#c62828"), (b.localisation_s, "#6a1b9a"))
        ):
            yy = y + 3 + j * 13
            if v is None or not math.isfinite(v):
                out.append(f'<text x="{x0}" y="{yy + 10}" class="note">not measured</text>')
                continue
            w = max(1.0, max(0.0, v) / top * (x1 - x0))
            out.append(
                f'<rect class="bar" x="{x0}" y="{yy}" width="{_num(w)}" height="11" '
                f'fill="{colour}"/>'
                f'<text x="{_num(x0 + w + 4)}" y="{yy + 10}" class="tick">{_seconds(v)}</text>'
            )
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)
