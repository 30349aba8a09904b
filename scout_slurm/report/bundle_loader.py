"""Fill an IncidentBundle from one run's evidence folder. Everything under `run-N/` was written
by the job: read with the safe, bounded reader; what cannot be read becomes a line of the page's
problems, never a crash. The function that reaches outside is `load_incident_bundle`."""

from __future__ import annotations

import time
from collections.abc import Callable

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.gather import gather_evidence, with_full_records
from scout_slurm.evidence.history import MAX_BYTES, ProgressSample, decode_history
from scout_slurm.evidence.layout import JobFolder, check_node_name
from scout_slurm.evidence.records import JobEvidence, Verdict
from scout_slurm.evidence.stacks import load_stacks
from scout_slurm.evidence.store import read_record, safe_read_bytes
from scout_slurm.localise.verdict import localise
from scout_slurm.remediation.records import ActionsRecord, ResumeInstruction
from scout_slurm.report.bundle import IncidentBundle
from scout_slurm.report.html import MAX_TABLE_ROWS
from scout_slurm.report.map_loader import read_maps
from scout_slurm.report.map_table import rank_map_rows
from scout_slurm.report.svg import pick_rows

MAX_HISTORY_RANKS = 4096  # histories read at most for one page


def read_histories(
    folder: JobFolder, restart: int, ranks: list[int]
) -> tuple[dict[int, tuple[ProgressSample, ...]], list[str]]:
    out: dict[int, tuple[ProgressSample, ...]] = {}
    problems: list[str] = []
    for r in ranks[:MAX_HISTORY_RANKS]:
        path = folder.history_path(restart, r)
        if not path.exists() and not path.is_symlink():
            continue  # a run from before histories were kept, or a rank that never published
        try:
            data = safe_read_bytes(path, max_bytes=MAX_BYTES, root=folder.root)
        except EvidenceError as exc:
            problems.append(str(exc))
            continue
        samples, errs = decode_history(data, source=str(path))
        problems += errs
        # a sample claiming another rank's place is impossible here (one file per rank); a
        # sample with a clock far outside the run's would stretch the picture: keep it, it is drawn
        # clamped
        if samples:
            out[r] = samples
    return out, problems


def _valid_node(name: str) -> bool:
    try:
        check_node_name(name)  # a place record is the job's: its node name may be a path
    except EvidenceError:
        return False
    return True


def load_incident_bundle(
    folder: JobFolder,
    restart: int,
    *,
    evidence: JobEvidence | None = None,
    verdict: Verdict | None = None,
    actions: ActionsRecord | None = None,
    verdict_computed: bool = False,
    wall: Callable[[], float] = time.time,
) -> IncidentBundle:
    """The bundle of run `restart`. Records the caller already holds (the controller has the
    evidence, verdict and actions in hand) are used as given; the rest is read."""
    problems: list[str] = []
    ev = evidence if evidence is not None else gather_evidence(folder, restart)
    computed = verdict_computed
    if verdict is None:
        vpath = folder.verdict_path(restart)
        if vpath.exists():
            try:
                verdict = read_record(vpath, Verdict, root=folder.root)
            except EvidenceError as exc:
                problems.append(str(exc))
        if verdict is None:
            verdict, computed = localise(ev, now=wall()), True
    if actions is None:
        apath = folder.actions_path(restart)
        if apath.exists():
            try:
                actions = read_record(apath, ActionsRecord, root=folder.root)
            except EvidenceError as exc:
                problems.append(str(exc))
    resume = None
    rpath = folder.resume_path(restart + 1)
    if rpath.exists():
        try:
            resume = read_record(rpath, ResumeInstruction, root=folder.root)
        except EvidenceError as exc:
            problems.append(str(exc))
    # the suspects' stderr as the job left it, not as a node digest abridged it
    ev = with_full_records(ev, folder, [s.rank for s in verdict.suspects])
    # only the ranks the timeline draws: a page for 100k ranks reads a few dozen histories
    history, errs = read_histories(
        folder, restart, pick_rows(ev.world_size, frozenset(s.rank for s in verdict.suspects))
    )
    problems += errs
    # only the places the table lists (every suspect, then the lowest ranks): a hook with a
    # 100k-rank
    # job reads a few hundred hardware maps at most
    suspects = {s.rank for s in verdict.suspects}
    others = [r for r in sorted(ev.places) if r not in suspects][
        : max(0, MAX_TABLE_ROWS - len(suspects))
    ]
    places = [ev.places[r] for r in sorted(suspects.intersection(ev.places) | set(others))]
    maps, errs = read_maps(folder, {p.node for p in places if _valid_node(p.node)})
    problems += errs
    return IncidentBundle(
        cluster=folder.cluster,
        verdict=verdict,
        evidence=ev,
        actions=actions,
        history=history,
        hardware=tuple(rank_map_rows(places, maps)),
        resume=resume,
        verdict_computed=computed,
        problems=tuple(problems[:200]),
        stacks=tuple(load_stacks(folder, restart, [s.rank for s in verdict.suspects])),
        flight_recorder=tuple(load_flight_recorder(folder, restart, ev.world_size)),
    )


def load_flight_recorder(folder: JobFolder, run: int, world: int) -> list[str]:
    """What torch's Flight Recorder dumps of the run say of each rank's place in its collectives
    (report lines; [] when no rank left one). At most 64 dumps are read, suspects' or not."""
    from scout_slurm.evidence import flightrec
    from scout_slurm.evidence.gather import read_ledger

    positions = read_ledger(folder, run, min(world, 64), limit=64)
    return flightrec.summary(positions, world)
