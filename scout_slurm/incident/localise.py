"""Stage 2, localise (pure): the verdict for the gathered evidence, by localise/verdict.py's rules,
with what the incident could not gather said in its reasoning."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scout_slurm.evidence.records import Verdict, VerdictKind
from scout_slurm.localise.verdict import JobEvidence, localise

NOTHING_FOUND = (VerdictKind.CLEAN, VerdictKind.UNCHECKED)


def verdict_of(found: JobEvidence, *, now: float, missing_nodes: Sequence[str] = ()) -> Verdict:
    """The verdict; `missing_nodes`: the nodes whose Epilog evidence never came."""
    verdict = localise(found, now=now)
    if not missing_nodes:
        return verdict
    note = f"node epilog evidence missing from: {', '.join(missing_nodes)}"
    return dataclasses.replace(verdict, reasoning=(*verdict.reasoning, note))


def is_incident(verdict: Verdict) -> bool:
    """Whether the verdict found anything to act on or to report."""
    return verdict.kind not in NOTHING_FOUND
