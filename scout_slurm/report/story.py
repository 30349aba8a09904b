"""A job's story for `scout show JOBID`: its runs in order, each incident first (what failed, the
cause, what was done, where it reran, how that ended), then the run shown in full; a run still
going says so (pure rendering; the suspects' stacks are read by evidence/stacks.py)."""

from __future__ import annotations

from dataclasses import dataclass

from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.remediation.records import ActionKind, ActionsRecord


@dataclass(frozen=True)
class RunStory:
    """One run as the story tells it: its verdict and actions as recorded (None: none yet)."""

    run: int
    verdict: Verdict | None
    actions: ActionsRecord | None
    nodes: tuple[str, ...]  # where its ranks ran (their place records)
    world: int
    exited: int  # ranks that left an exit record


def running(story: RunStory) -> bool:
    """No verdict on record and not every rank has exited: the run is still going (or ended
    without its Epilogs, which the text says too)."""
    return story.verdict is None and (story.world == 0 or story.exited < story.world)


def _who(v: Verdict) -> str:
    names = [f"rank {s.rank} on {s.node}" for s in v.suspects[:4]]
    more = f" and {len(v.suspects) - 4} more" if len(v.suspects) > 4 else ""
    return ", ".join(names) + more if names else "no rank named"


def _done(actions: ActionsRecord | None) -> list[str]:
    if actions is None:
        return ["    done: nothing recorded"]
    results = {(r.kind, r.target): r for r in actions.results}
    out = []
    for a in actions.actions:
        r = results.get((a.kind, a.target))
        state = "not applied yet" if r is None else ("done" if r.ok else "FAILED")
        out.append(f"    {a.kind.value} {a.target}: {state}")
    out += [f"    held back: {h}" for h in actions.held_back]
    return out or [f"    {actions.status.value}: nothing to do"]


def requeued(actions: ActionsRecord | None) -> bool:
    return actions is not None and any(a.kind is ActionKind.REQUEUE for a in actions.actions)


def render_story(job_id: int, stories: list[RunStory], shown: int) -> list[str]:
    """The runs in order: one paragraph each, the run `shown` marked (its full view follows)."""
    lines = [f"job {job_id}: {len(stories)} run{'s' if len(stories) != 1 else ''}"]
    for i, s in enumerate(stories):
        mark = " (shown below)" if s.run == shown else ""
        where = f" on {','.join(s.nodes)}" if s.nodes else ""
        if running(s):
            lines.append(
                f"run {s.run}{where}{mark}: running, no verdict yet ({s.exited} of "
                f"{s.world or '?'} ranks have exited; a run that ended without its Epilogs "
                "stays like this)"
            )
            continue
        v = s.verdict
        if v is None:
            lines.append(f"run {s.run}{where}{mark}: ended, no verdict on record")
            continue
        head = f"run {s.run}{where}{mark}: {v.kind.value}"
        if v.kind in (VerdictKind.CLEAN, VerdictKind.UNCHECKED):
            lines.append(head)
            continue
        lines.append(f"{head}: {_who(v)}; cause {v.cause.value}")
        if v.cause_evidence:
            lines.append(f"    why: {v.cause_evidence}")
        if v.first_suspect_step >= 0:
            lines.append(f"    first suspect step: {v.first_suspect_step}")
        lines += _done(s.actions)
        nxt = stories[i + 1] if i + 1 < len(stories) else None
        if nxt is not None:
            lines.append(
                f"    reran as run {nxt.run}" + (f" on {','.join(nxt.nodes)}" if nxt.nodes else "")
            )
        elif requeued(s.actions):
            lines.append("    requeued: the rerun has not started yet")
        else:
            lines.append("    the job ended here")
    return lines
