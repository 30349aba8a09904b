"""Read one run's evidence from the job folder for the localiser (the rim: the localiser itself
takes the records and reads nothing). Everything under `run-N/` was written by the job: read with
the safe reader, each unreadable file a problem, never a crash. The function that reaches outside
is `gather_evidence`; `cycle_collector_paused` is for the process that owns the interpreter."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.digest import MAX_WORLD, DigestsRead, read_node_digests
from scout_slurm.evidence.layout import (
    PROGRESS_SNAPSHOTS,
    RANK_EXITS,
    RANK_PLACES,
    JobFolder,
    RunFolder,
)
from scout_slurm.evidence.records import (
    ExitRecord,
    Finding,
    JobEvidence,
    ProgressSnapshot,
    RankPlace,
    StallDecision,
    VoteCoverage,
)
from scout_slurm.evidence.store import list_records, read_record

__all__ = ["MAX_WORLD", "cycle_collector_paused", "gather_evidence", "with_full_records"]


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Pause the cycle collector for the whole process while the body runs, and on leaving move
    everything that exists then out of its sight (gc.freeze; reference counting still frees it).
    For the caller that owns the process (the controller Epilog, the CLI) around a gather: a
    gather builds millions of small acyclic records, and the collector's passes over them cost
    more than reading them at 100k ranks (a third of the time, growing faster than the world);
    frozen, the localiser and the report after the gather do not pay for them either. A library
    function must not decide this for a process it does not own."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def gather_evidence(
    folder: JobFolder,
    restart: int,
    *,
    job_exit_code: int = -1,
    world_size: int | None = None,
    digests: bool = True,
) -> JobEvidence:
    """The run's evidence. With `digests`, the ranks that node Epilogs digested are read from one
    root-owned file a node (evidence/digest.py) and only the others' files are read; the result
    lists them in `abridged`. The process's cycle collector is left alone: a caller that owns the
    process pauses it around this (`cycle_collector_paused`)."""
    problems: list[str] = []
    root = folder.root
    dig = read_node_digests(folder, restart) if digests else DigestsRead.none()
    problems.extend(dig.problems)

    def many(directory: Path, pattern: str, cls, exclude=frozenset()):
        if not directory.exists():
            return []
        try:
            records, errors = list_records(directory, pattern, cls, root=root, exclude=exclude)
        except EvidenceError as exc:
            problems.append(str(exc))
            return []
        problems.extend(errors)
        return records

    # The digested ranks' files are not read again; when the digests hold the whole world, the
    # ranks folder is not even listed (200k names at 100k ranks).
    digested = dig.ranks
    sizes = Counter(p.world_size for p in dig.places.values())
    whole = bool(digested) and len(sizes) == 1 and digested == frozenset(range(next(iter(sizes))))
    if whole:
        places, exits = [], []
    else:
        skip = frozenset(
            name
            for r in digested
            for name in (RunFolder.rank_place_name(r), RunFolder.rank_exit_name(r))
        )
        places = many(folder.ranks_dir(restart), RANK_PLACES, RankPlace, skip)
        exits = many(folder.ranks_dir(restart), RANK_EXITS, ExitRecord, skip)
    places = [*dig.places.values(), *places]
    exits = [*dig.exits.values(), *exits]
    torchrun = any(p.launcher == "torchrun" for p in places)
    # An exit record carries its watchdog's final snapshot, taken after the last one it published:
    # the published one is not read again (a third of the files and bytes at the end of a job).
    # Under torchrun the exit records are per task and every rank's published snapshot is read.
    covered = (
        frozenset()
        if torchrun
        else frozenset(
            RunFolder.progress_name(e.rank)
            for e in exits
            if e.last_progress is not None and 0 <= e.rank < MAX_WORLD
        )
    )
    snaps = [*dig.snapshots.values()] + (
        []
        if whole
        else many(
            folder.progress_dir(restart),
            PROGRESS_SNAPSHOTS,
            ProgressSnapshot,
            covered | frozenset(RunFolder.progress_name(r) for r in digested),
        )
    )
    findings = many(folder.findings_dir(restart), "*.json", Finding)

    def one(path: Path, cls):
        """A single record of the run, None when absent (or unreadable: said in the problems)."""
        if not path.exists():
            return None
        try:
            return read_record(path, cls, root=root)
        except EvidenceError as exc:
            problems.append(str(exc))
            return None

    decision = one(folder.stall_decision_path(restart), StallDecision)
    coverage = one(folder.coverage_path(restart), VoteCoverage)
    if world_size is None:
        sizes = Counter(p.world_size for p in places if 0 < p.world_size <= MAX_WORLD)
        world_size = (
            sizes.most_common(1)[0][0]
            if sizes
            else max([r.rank + 1 for r in (*places, *exits) if 0 <= r.rank < MAX_WORLD] + [0])
        )
        # under torchrun a task starts several ranks: the watchdogs' progress records are per rank
        if torchrun:
            world_size = max([world_size] + [s.rank + 1 for s in snaps if 0 <= s.rank < MAX_WORLD])

    def by_rank(records, what):
        out = {}
        for r in records:
            if not 0 <= r.rank < world_size:
                problems.append(
                    f"{what} for rank {r.rank} outside the world of {world_size}: ignored"
                )
                continue
            out[r.rank] = r
        return out

    if torchrun:
        # place records are per Slurm task; under torchrun the ranks are the workers', placed by the
        # watchdogs' per-rank progress records; their exit records are the workers' own (the
        # watchdog writes one per worker from torchrun's agent, bootstrap/agent.py)
        problems.append(
            "torchrun: ranks are placed by their progress records (one Slurm task per node)"
        )
        places = []
    ledger = read_ledger(folder, restart, world_size) if decision is not None else {}
    return JobEvidence(
        job_id=folder.job_id,
        restart=restart,
        world_size=world_size,
        ledger=ledger,
        places=by_rank(places, "place"),
        exits=by_rank(exits, "exit record"),
        snapshots=by_rank(snaps, "progress"),
        findings=tuple(findings),
        decision=decision,
        job_exit_code=job_exit_code,
        problems=tuple(problems),
        coverage=coverage,
        abridged=frozenset() if torchrun else frozenset(r for r in digested if 0 <= r < world_size),
    )


MAX_LEDGER_DUMPS = 256  # Flight Recorder dumps read for a verdict (a larger job: none read)
MAX_LEDGER_BYTES = 64 << 20  # all of them together: past it the rest are not read (job-written)


def read_ledger(folder: JobFolder, restart: int, world: int, *, limit: int = MAX_LEDGER_DUMPS):
    """rank -> its places in its process groups, from the Flight Recorder dumps the ranks wrote
    on the watchdogs' request (untrusted: each read whole, bounded, or skipped); {} when there
    are none or more ranks than `limit` (the verdict then goes without them)."""
    from scout_slurm.evidence import flightrec
    from scout_slurm.evidence.safeio import list_names_below, safe_read_bytes

    if world > limit:
        return {}
    try:
        names = set(list_names_below(folder.run(restart).stacks_dir, folder.root))
    except EvidenceError:
        return {}
    positions, left = {}, MAX_LEDGER_BYTES
    run = folder.run(restart)
    for rank in range(world):
        # the dump scout asked for before it acted; else the one torch wrote itself when its NCCL
        # watchdog fired first (where the shim pointed it: never a path the job named)
        path = next(
            (
                p
                for p in (run.flight_recorder_path(rank), run.torch_flight_recorder_path(rank))
                if p.name in names
            ),
            None,
        )
        if path is None:
            continue
        try:
            data = safe_read_bytes(
                path, max_bytes=min(flightrec.MAX_DUMP_BYTES, left), root=folder.root
            )
        except EvidenceError:
            continue
        left -= len(data)
        if left <= 0:
            break
        found = flightrec.read_dump(data, rank)
        if found:
            positions[rank] = found
    return positions


def with_full_records(ev: JobEvidence, folder: JobFolder, ranks) -> JobEvidence:
    """`ev` with the whole records (stderr tail, collective times) of those of `ranks` that came
    abridged from node digests, read from the job's files; a record that cannot be read again
    keeps its abridged form."""
    want = sorted(r for r in set(ranks) if r in ev.abridged)[:256]
    if not want:
        return ev
    exits, snaps = dict(ev.exits), dict(ev.snapshots)
    done = set()
    for r in want:
        try:
            if r in exits:
                e = read_record(folder.rank_exit_path(ev.restart, r), ExitRecord, root=folder.root)
                if e.rank != r:
                    continue
                exits[r] = e
            if r in snaps:
                s = read_record(
                    folder.progress_path(ev.restart, r), ProgressSnapshot, root=folder.root
                )
                if s.rank != r:
                    continue
                snaps[r] = s
        except EvidenceError:
            continue
        done.add(r)
    return dataclasses.replace(ev, exits=exits, snapshots=snaps, abridged=ev.abridged - done)
