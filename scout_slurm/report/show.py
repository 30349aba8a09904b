"""`scout show`: the verdict and a per-rank timeline of one run, for a person (pure rendering)."""

from __future__ import annotations

from scout_slurm.evidence.records import Finding, FindingKind, JobEvidence, ScoutCost, Verdict
from scout_slurm.localise.verdict import describe_exit, is_abnormal, is_cascade


def render_verdict(v: Verdict) -> list[str]:
    lines = [f"verdict: {v.kind.value}  (confidence {v.confidence:.2f})"]
    if v.cause.value != "unknown" or v.kind.value in ("crash", "hang", "sdc", "straggler", "infra"):
        lines.append(f"cause: {v.cause.value}  ({v.cause_evidence or 'no evidence recorded'})")
    if v.suspects:
        lines.append("suspects:")
        for s in v.suspects:
            lines.append(f"  rank {s.rank} on node {s.node}: {s.kind.value} ({s.confidence:.2f})")
            lines += [f"      {e}" for e in s.evidence[:8]]
    else:
        lines.append("suspects: none")
    if v.first_suspect_step >= 0:
        lines.append(f"first suspect step: {v.first_suspect_step}")
    lines.append("reasoning:")
    lines += [f"  - {r}" for r in v.reasoning]
    lines.append(
        "checks that ran:"
        if v.coverage is not None
        else "checks that ran: no record (votes off in every form, or not run under scout-srun)"
    )
    if v.coverage is not None:
        lines += [f"  {c}" for c in v.coverage.lines()]
    return lines


def render_timeline(ev: JobEvidence) -> list[str]:
    header = (
        f"{'rank':>4}  {'node':<10} {'steps':>5} {'coll done':>9}  {'where':<28} {'process':<10} "
        "exit"
    )
    lines = [
        "timeline (progress at the end of the run; progress order decides who was first):",
        header,
    ]
    for r in range(ev.world_size):
        p = ev.last_progress(r)
        e = ev.exits.get(r)
        node = ev.node_of(r)
        if p is None:
            lines.append(
                f"{r:>4}  {node:<10} {'-':>5} {'-':>9}  {'no progress record':<28} {'-':<10} "
                f"{describe_exit(e) if e else 'no exit record'}"
            )
            continue
        where = f"inside {p.current_op}" if p.in_collective else "between collectives"
        if e is None:
            ex = "no exit record"
        elif not is_abnormal(e):
            ex = "exited 0"
        else:
            ex = describe_exit(e) + (
                " [scout ended it]" if e.killed_by_scout else " [cascade]" if is_cascade(e) else ""
            )
        lines.append(
            f"{r:>4}  {node:<10} {p.opt_steps:>5} {p.coll_completed:>9}  {where:<28} "
            f"{p.child_state.value:<10} {ex}"
        )
    return lines


def timing_findings(ev: JobEvidence) -> list[Finding]:
    """What the timing votes wrote: confirmed stragglers, a slow whole group, one-off stalls."""
    return sorted(
        (
            f
            for f in ev.findings
            if f.kind == FindingKind.STRAGGLER
            or (f.kind == FindingKind.INFO and f.component == "timing")
        ),
        key=lambda f: (f.at, f.rank),
    )


def render_timing(ev: JobEvidence) -> list[str]:
    found = timing_findings(ev)
    if not found:
        return []
    lines = ["timing votes:"]
    for f in found[:40]:
        what = f"{f.component} straggler" if f.kind == FindingKind.STRAGGLER else "note"
        lines.append(f"  step {f.step}: {what}: {f.summary}")
        lines += [f"      {d}" for d in f.details[:4]]
    return lines


def _off_thread(c: ScoutCost) -> str:
    """Said only when it happened: each such call took the GIL on the communication library's own
    thread, which can hold up that thread's next collective and, at the interpreter's end, abort a
    finished rank."""
    if not c.comm_thread_calls:
        return ""
    return f"; scout ran {c.comm_thread_calls} times on the communication library's threads"


def render_cost(costs: list[ScoutCost], problems: list[str] = ()) -> list[str]:
    """What scout's own work cost each rank, as the ranks measured it (every rank up to 8, else the
    spread and the costliest ranks)."""
    if not costs:
        return [
            "scout's own cost: no record (the job ran no optimizer step under scout's "
            "bootstrap, or an "
            "older scout)"
        ] + [f"  unreadable: {p}" for p in problems[:4]]

    def line(c: ScoutCost) -> str:
        share = f" = {100 * c.share:.2f} % of its step time" if c.share is not None else ""
        return (
            f"rank {c.rank}: {c.per_step_ms:.3f} ms a step{share} over {c.steps} steps (hooks "
            f"{c.hooks_cpu_ns / 1e6:.1f} ms CPU, wrappers {c.wrapper_ns / 1e6:.1f} ms for "
            f"{c.wrapper_calls} "
            f"collectives{_off_thread(c)})"
        )

    ordered = sorted(costs, key=lambda c: c.per_step_ms, reverse=True)
    lines = [
        "scout's own cost (measured in each rank: CPU of scout's hooks and collective wrappers):"
    ]
    if len(costs) <= 8:
        lines += [f"  {line(c)}" for c in sorted(costs, key=lambda c: c.rank)]
    else:
        per_step = sorted(c.per_step_ms for c in costs)
        lines.append(
            f"  {len(costs)} ranks: {per_step[0]:.3f} to {per_step[-1]:.3f} ms a step, median "
            f"{per_step[len(per_step) // 2]:.3f}; the costliest:"
        )
        lines += [f"  {line(c)}" for c in ordered[:3]]
    return lines + [f"  unreadable: {p}" for p in problems[:4]]


def render_show(
    job_id: int,
    cluster: str,
    restart: int,
    verdict: Verdict,
    ev: JobEvidence,
    actions: list[str] | None = None,
    *,
    computed: bool,
) -> str:
    lines = [
        f"job {job_id} on cluster {cluster}, run {restart} "
        + (
            "(verdict computed now from the evidence)"
            if computed
            else "(verdict recorded by the epilog)"
        ),
        "",
    ]
    lines += render_verdict(verdict)
    lines.append("")
    lines += render_timeline(ev)
    timing = render_timing(ev)
    if timing:
        lines += [""] + timing
    if actions:
        lines += ["", "actions:"] + [f"  {a}" for a in actions]
    return "\n".join(lines) + "\n"
