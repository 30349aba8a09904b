"""Node digests: each node's Epilog reads its own ranks' records (a few files, in parallel with
every other node) and writes them, abridged, into one root-owned file; the controller then reads
one file a node instead of three a rank, and parses no collective ring twice.

What is abridged can change no verdict: the localiser reads of a stderr tail only whether a line
names a peer's failure (kept: the last such line) and its last 3 lines (kept), and of a ring only
each collective's (seq, op, bytes) (kept; the entry and exit times are not). The controller reads
the suspects' full records again for the report (`evidence.gather.with_full_records`).

Trust: the tasks file is the job's, and so are the records; a rank goes into the digest only when
its place record is on this node under its own rank number, its exit and progress records (where
present) are its own and readable, and the job was not started by torchrun. Every other rank is
left to the controller, which reads its files as if there were no digest. The digest is read only
when root owns it, from a folder that is no link, and when it names this job, run and node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from dataclasses import dataclass, field

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.cascade import mentions_peer_failure
from scout_slurm.evidence.codec import (
    KIND_KEY,
    decode_record,
    parse_json_unbounded,
    record_from_obj,
)
from scout_slurm.evidence.layout import JobFolder, check_node_name, node_digest_name
from scout_slurm.evidence.records import (
    CollectiveEntry,
    DigestedRank,
    ExitRecord,
    NodeDigest,
    NodeTasks,
    ProgressSnapshot,
    RankPlace,
)
from scout_slurm.evidence.safeio import (
    DIR_LIST,
    MAX_RECORD_BYTES,
    open_below,
    read_at,
    safe_read_bytes,
)

MAX_TASKS_PER_NODE = 4096
MAX_WORLD = 1_000_000  # the largest world the localiser reads (ranks 0 to MAX_WORLD - 1)
TAIL_KEPT = 3  # what the verdict quotes of a failed rank's stderr
BYTES_READ_PER_NODE = 32 * 1024 * 1024  # 8 ranks of real records: ~80 KB


def abridge_tail(lines: tuple[str, ...]) -> tuple[str, ...]:
    """The last TAIL_KEPT lines, preceded by the last earlier line that names a peer's failure
    when only such an earlier line does (pure). `mentions_peer_failure` answers the same for
    the result as for `lines`: no pattern spans two lines, so a tail names a peer's failure
    exactly when one of its lines does."""
    last = lines[-TAIL_KEPT:]
    if len(lines) <= TAIL_KEPT or not mentions_peer_failure(lines) or mentions_peer_failure(last):
        return tuple(last)
    for line in reversed(lines[:-TAIL_KEPT]):
        if mentions_peer_failure((line,)):
            return (line, *last)
    return tuple(
        lines
    )  # a match no single line makes: keep everything rather than change the answer


@dataclass
class _Rings:
    """Distinct rings, as (seq, op, nbytes, group_size) without times, by first appearance."""

    index: dict[tuple, int] = field(default_factory=dict)
    rings: list[tuple[CollectiveEntry, ...]] = field(default_factory=list)

    def add(self, recent: tuple[CollectiveEntry, ...]) -> int:
        key = tuple((e.seq, e.op, e.nbytes, e.group_size) for e in recent)
        at = self.index.get(key)
        if at is None:
            at = self.index[key] = len(self.rings)
            self.rings.append(tuple(CollectiveEntry(s, o, n, g, 0, 0) for s, o, n, g in key))
        return at


def _without_ring(s: ProgressSnapshot | None) -> ProgressSnapshot | None:
    return None if s is None else dataclasses.replace(s, recent=())


class _OverBudget(Exception):
    pass


@dataclass
class _Reader:
    """Reads the job's records for the digest within a byte budget: what a job writes must not
    keep a node in its Epilog, nor make the digest large."""

    root: object
    left: int

    def optional(self, path, cls):
        """The record, None when the file does not exist; EvidenceError when it exists but
        cannot be used."""
        try:
            data = safe_read_bytes(path, root=self.root, max_bytes=MAX_RECORD_BYTES)
        except EvidenceError:
            if not os.path.lexists(path):
                return None
            raise
        self.left -= len(data)
        if self.left < 0:
            raise _OverBudget
        return decode_record(data, cls, source=os.fspath(path))


def build_node_digest(
    folder: JobFolder, restart: int, node: str, *, now: float
) -> tuple[NodeDigest | None, str]:
    """The digest of `node`'s ranks for run `restart` (None when there is nothing to digest) and a
    line saying what was left out. Reads the job's files; writes nothing."""
    check_node_name(node)
    reader = _Reader(folder.root, BYTES_READ_PER_NODE)
    try:
        tasks = reader.optional(folder.node_tasks_path(restart, node), NodeTasks)
    except (EvidenceError, _OverBudget) as exc:
        return None, f"no digest: {str(exc) or 'the tasks file is too big'}"
    if tasks is None:
        return (
            None,
            "no digest: the job left no list of this node's ranks (started without "
            "scout-srun, or by torchrun)",
        )
    if (tasks.job_id, tasks.restart, tasks.node) != (folder.job_id, restart, node):
        return None, (
            f"no digest: the tasks file names job {tasks.job_id}, run {tasks.restart}, node "
            f"{tasks.node!r}, "
            f"not job {folder.job_id}, run {restart}, node {node!r}"
        )
    ranks = sorted({r for r in tasks.ranks if 0 <= r < MAX_WORLD})
    if not ranks or len(ranks) > MAX_TASKS_PER_NODE:
        return (
            None,
            f"no digest: the tasks file lists {len(tasks.ranks)} ranks (1 to "
            f"{MAX_TASKS_PER_NODE} expected)",
        )
    rings = _Rings()
    rows: list[DigestedRank] = []
    left: list[int] = []
    for r in ranks:
        try:
            place = reader.optional(folder.rank_place_path(restart, r), RankPlace)
            if (
                place is None
                or place.rank != r
                or place.node != node
                or place.launcher == "torchrun"
            ):
                left.append(r)
                continue
            exit_rec = reader.optional(folder.rank_exit_path(restart, r), ExitRecord)
            progress = None
            if exit_rec is None or exit_rec.last_progress is None:
                progress = reader.optional(folder.progress_path(restart, r), ProgressSnapshot)
        except EvidenceError:
            left.append(r)  # the controller reads it again and says what is wrong with it
            continue
        except _OverBudget:
            return None, (
                f"no digest: this node's ranks' records exceed {BYTES_READ_PER_NODE >> 20} MiB "
                "(real ones take a few KiB a rank); left to the controller"
            )
        if (exit_rec is not None and exit_rec.rank != r) or (
            progress is not None and progress.rank != r
        ):
            left.append(r)
            continue
        final = (
            exit_rec.last_progress
            if exit_rec is not None and exit_rec.last_progress is not None
            else progress
        )
        ring = rings.add(final.recent) if final is not None else -1
        if exit_rec is not None:
            exit_rec = dataclasses.replace(
                exit_rec,
                stderr_tail=abridge_tail(exit_rec.stderr_tail),
                last_progress=_without_ring(exit_rec.last_progress),
            )
        rows.append(
            DigestedRank(
                rank=r, place=place, exit=exit_rec, progress=_without_ring(progress), ring=ring
            )
        )
    if not rows:
        return (
            None,
            f"no digest: none of the {len(ranks)} listed ranks has a place record of its own "
            "on this node",
        )
    note = f"{len(rows)} rank(s) digested" + (
        f"; left to the controller: ranks {left[:20]}" if left else ""
    )
    return NodeDigest(
        job_id=folder.job_id,
        restart=restart,
        node=node,
        rings=tuple(rings.rings),
        ranks=tuple(rows),
        written_at=now,
    ), note


# --------------------------------------------------------------------------------------------
# The controller's side
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DigestsRead:
    places: dict[int, RankPlace]
    exits: dict[int, ExitRecord]
    snapshots: dict[int, ProgressSnapshot]
    nodes: tuple[str, ...]  # whose digest was used
    problems: tuple[str, ...]

    @property
    def ranks(self) -> frozenset[int]:
        return frozenset(self.places)

    @staticmethod
    def none(*problems: str) -> DigestsRead:
        return DigestsRead({}, {}, {}, (), problems)


def _decode_digest(data: bytes, shown: str, interned: dict) -> NodeDigest:
    """A NodeDigest whose ranks' snapshots carry their rings again. Each distinct ring is built
    once for the whole job (`interned`, by its JSON text) and shared by every rank that ran it."""
    obj, _ = parse_json_unbounded(data, shown)
    if (
        type(obj) is not dict
        or obj.get(KIND_KEY) != NodeDigest.KIND
        or type(obj.get("rings")) is not list
        or type(obj.get("ranks")) is not list
    ):
        return record_from_obj(NodeDigest, obj, source=shown)  # refuses it, saying why
    built = []
    for ring in obj["rings"]:
        key = json.dumps(ring, sort_keys=True, separators=(",", ":"))
        if key not in interned:
            interned[key] = record_from_obj(
                NodeDigest, dict(obj, rings=[ring], ranks=[]), source=shown
            ).rings[0]
        built.append(interned[key])
    for row in obj["ranks"]:
        if type(row) is not dict:
            continue  # the typed build below refuses it
        index = row.get("ring")
        if index == -1:
            continue
        if type(index) is not int or not 0 <= index < len(built):
            raise EvidenceError(
                f"{shown}: rank {row.get('rank')!r} names ring {index!r} of {len(built)}; "
                "the digest is not read"
            )
        exit_obj = row.get("exit")
        for snap in (
            exit_obj.get("last_progress") if type(exit_obj) is dict else None,
            row.get("progress"),
        ):
            if type(snap) is dict and snap.get("recent") == []:
                snap["recent"] = built[index]
    return record_from_obj(NodeDigest, dict(obj, rings=[]), source=shown)


def read_node_digests(folder: JobFolder, restart: int) -> DigestsRead:
    """Every node digest of run `restart` that root wrote for this job and run, merged; a rank
    two digests claim is taken from neither (the controller reads its files)."""
    places: dict[int, RankPlace] = {}
    exits: dict[int, ExitRecord] = {}
    snaps: dict[int, ProgressSnapshot] = {}
    problems: list[str] = []
    used: list[str] = []
    nodes_dir = folder.nodes_dir
    if not nodes_dir.is_dir():
        return DigestsRead.none()
    shown_dir = os.fspath(nodes_dir)
    try:
        dir_fd = open_below(
            os.fspath(folder.root),
            list(folder.nodes_dir_parts()),
            shown_dir,
            DIR_LIST,
        )
    except EvidenceError as exc:
        return DigestsRead.none(str(exc))
    name = node_digest_name(restart)
    interned: dict = {}
    claimed: dict[int, str] = {}
    refused: set[int] = set()  # read from their files instead
    try:
        with os.scandir(dir_fd) as entries:
            listing = sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        for node in listing:
            try:
                check_node_name(node)
            except EvidenceError:
                continue
            shown = os.path.join(shown_dir, node, name)
            try:
                node_fd = os.open(
                    node, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                )
            except OSError:
                continue
            try:
                st = os.fstat(node_fd)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                    problems.append(
                        f"{os.path.join(shown_dir, node)}: not root's folder; its digest is "
                        "not read"
                    )
                    continue
                try:
                    data = read_at(node_fd, name, shown, 64 * 1024 * 1024, owner=0)
                except EvidenceError as exc:
                    if os.path.lexists(os.path.join(shown_dir, node, name)):
                        problems.append(str(exc))
                    continue
            finally:
                os.close(node_fd)
            try:
                digest = _decode_digest(data, shown, interned)
            except EvidenceError as exc:
                problems.append(str(exc))
                continue
            if (digest.job_id, digest.restart, digest.node) != (folder.job_id, restart, node):
                problems.append(
                    f"{shown}: names job {digest.job_id}, run {digest.restart}, node "
                    f"{digest.node!r}; "
                    "not this job's: not read"
                )
                continue
            taken = 0
            for row in digest.ranks:
                r = row.rank
                if (
                    row.place.rank != r
                    or row.place.node != node
                    or not 0 <= r < MAX_WORLD
                    or (row.exit is not None and row.exit.rank != r)
                    or (row.progress is not None and row.progress.rank != r)
                ):
                    problems.append(
                        f"{shown}: rank {r}'s records do not match it; its files are read instead"
                    )
                    refused.add(r)
                    continue
                if r in claimed:
                    problems.append(
                        f"rank {r} is in the digests of {claimed[r]} and {node}: its files "
                        "are read instead"
                    )
                    refused.add(r)
                    continue
                claimed[r] = node
                places[r] = row.place
                if row.exit is not None:
                    exits[r] = row.exit
                if row.progress is not None:
                    snaps[r] = row.progress
                taken += 1
            if taken:
                used.append(node)
    except OSError as exc:
        problems.append(f"{shown_dir}: cannot be listed: {exc.strerror or exc}")
    finally:
        os.close(dir_fd)
    for r in refused:
        places.pop(r, None)
        exits.pop(r, None)
        snaps.pop(r, None)
    return DigestsRead(places, exits, snaps, tuple(used), tuple(problems))
