"""The shared-memory progress record: one small file in /dev/shm per rank, written by the
bootstrap inside the training process and read from outside by the watchdog.

Layout (little-endian, fixed): a header with a seqlock generation, counters, and a ring of the
last RING collectives. The writer bumps the generation to odd, writes, bumps it to even; readers
retry while it is odd or changed, so a reader never sees a torn record. One writer lock per
process (the DDP comm hook completes on gloo's thread).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.evidence.records import CollectiveEntry

MAGIC = 0x52504353  # "SCPR"
VERSION = 1
RING = 64

# magic, version, gen, pid, rank, world, flags, coll_entered, coll_completed, in_collective,
# cur_op, cur_nbytes, opt_steps, pg_seq, last_change_ns, last_step_ns
_HEADER = struct.Struct("<IIQqiiIQQIIQQqQQ")
_ENTRY = struct.Struct("<QIIQQQ")  # seq, op, group_size, nbytes, entered_ns, left_ns
_GEN = struct.Struct(
    "<Q"
)  # the seqlock generation (offset 8); also an entry's left_ns (its last field)
_LEFT_AT = _ENTRY.size - 8
SIZE = _HEADER.size + RING * _ENTRY.size

OPS = (
    "none",
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "all_gather_object",
    "broadcast_object_list",
    "ddp_bucket_all_reduce",
    "other",
    # scout_vote: scout's own collectives on its side group (votes, replay; peers wait there)
    "scout_vote",
    "all_gather_single",
    "reduce_scatter_single",
)  # FSDP2's on torch 2.13 (appended: codes stay as written)
OP_CODES = {name: i for i, name in enumerate(OPS)}
_OTHER = OP_CODES["other"]
FLAG_ACTIVE = 1
FLAG_BUSY = 2  # inside a checkpoint save or load: busy, not hung (task/stallclock.py)
# the process called init_process_group (set before torch's rendezvous, so a rank waiting there for
# its peers is told from one that never came; task/stallclock.py), and every writer sets it: a
# record with a writer is past init
FLAG_INIT = 4


@dataclass(frozen=True)
class ProgressView:
    pid: int
    rank: int
    world_size: int
    active: bool
    coll_entered: int
    coll_completed: int
    in_collective: bool
    current_op: str
    current_nbytes: int
    opt_steps: int
    pg_seq: int
    last_change_ns: int
    last_step_ns: int
    recent: tuple[CollectiveEntry, ...]
    busy: bool = False  # FLAG_BUSY: inside a checkpoint save or load
    entered_init: bool = (
        False  # FLAG_INIT: the process called init_process_group (it may still wait there)
    )

    @property
    def position(self) -> tuple[int, int, int]:
        return (self.coll_entered, self.coll_completed, self.opt_steps)


def create(path: Path) -> None:
    """Create an empty record (the shim does this before starting the child)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        buf = mmap.mmap(fd, SIZE)
        _HEADER.pack_into(buf, 0, MAGIC, VERSION, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0)
        buf.close()
    finally:
        os.close(fd)


def mark_entering_init(progress_dir: Path | None) -> None:
    """Called by the bootstrap as the process enters init_process_group, before torch's rendezvous:
    sets FLAG_INIT (and the record's last change) in each record of this task that no writer
    has opened yet (the one the shim created for its rank; the rank needs no reading of the
    environment). Under torchrun no record exists before init: nothing is marked. Never raises:
    the job's init goes on whatever happens here."""
    if progress_dir is None:
        return
    try:
        for name in os.listdir(progress_dir):
            if name.startswith("rank-") and name.endswith(".bin"):
                _mark_init(Path(progress_dir) / name)
    except Exception:  # noqa: BLE001 - called bare from the patched init_process_group: never break it
        pass


def _mark_init(path: Path) -> None:
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size < SIZE:
            return
        buf = mmap.mmap(fd, SIZE)
    finally:
        os.close(fd)
    try:
        h = list(_HEADER.unpack_from(buf, 0))
        if h[0] != MAGIC or h[1] != VERSION or h[3] > 0 or h[2] % 2:
            return  # not a record, or a writer owns it (it set FLAG_INIT itself)
        gen = h[2]
        _GEN.pack_into(buf, 8, gen + 1)  # odd while the header changes (readers retry)
        h[2], h[6], h[14] = gen + 1, h[6] | FLAG_INIT, time.monotonic_ns()
        _HEADER.pack_into(buf, 0, *h)
        _GEN.pack_into(buf, 8, gen + 2)
    finally:
        buf.close()


class ProgressWriter:
    """Used inside the training process. Each call costs about a microsecond."""

    def __init__(self, path: Path, *, rank: int, world_size: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            self._buf = mmap.mmap(fd, SIZE)
        finally:
            os.close(fd)
        self._lock = threading.Lock()
        self._gen = 0
        h = list(_HEADER.unpack_from(self._buf, 0))
        if h[0] != MAGIC or h[1] != VERSION:
            raise ValueError(f"{path}: not a scout progress record")
        self._entered = h[7]
        self._completed = h[8]
        self._steps = h[12]
        self._pg_seq = -1
        self._in = 0
        self._op = 0
        self._nbytes = 0
        self._last_change = time.monotonic_ns()
        self._last_step = 0
        self._pid = os.getpid()
        self._rank = rank
        self._world = world_size
        self._flags = FLAG_ACTIVE | FLAG_INIT  # opened once init_process_group returned: past it
        # timing votes (bootstrap.timing): ns outside any collective (compute) and inside at least
        # one
        # (collectives, overlapping ones counted once); outside time counts only while `_idle_since`
        # is set
        self._idle_ns = 0
        self._busy_ns = 0
        self._idle_since: int | None = None
        self._busy_since = 0
        self._paused = False  # scout's own work (votes, replay): its collectives count as neither
        with self._lock:
            self._write_header()

    def _write_header(self) -> None:
        """Under the lock. The generation goes odd first (an entry written before this, in the same
        change, is covered too), the header is written with the odd value, then it goes even."""
        self._gen += 1
        odd = self._gen * 2 - 1
        _GEN.pack_into(self._buf, 8, odd)
        _HEADER.pack_into(
            self._buf,
            0,
            MAGIC,
            VERSION,
            odd,
            self._pid,
            self._rank,
            self._world,
            self._flags,
            self._entered,
            self._completed,
            self._in,
            self._op,
            self._nbytes,
            self._steps,
            self._pg_seq,
            self._last_change,
            self._last_step,
        )
        _GEN.pack_into(self._buf, 8, odd + 1)

    def enter(self, op: str, nbytes: int, group_size: int, pg_seq: int = -1) -> int:
        now = time.monotonic_ns()
        code = OP_CODES.get(op, _OTHER)
        with self._lock:
            self._entered += 1
            seq = self._entered
            if self._in == 0 and not self._paused:
                if self._idle_since is not None:
                    self._idle_ns += now - self._idle_since
                    self._idle_since = None
                self._busy_since = now
            self._in += 1
            self._op = code
            self._nbytes = nbytes
            if pg_seq >= 0:
                self._pg_seq = pg_seq
            self._last_change = now
            _GEN.pack_into(self._buf, 8, self._gen * 2 + 1)  # odd before the ring entry changes too
            _ENTRY.pack_into(
                self._buf,
                _HEADER.size + (seq % RING) * _ENTRY.size,
                seq,
                code,
                group_size,
                nbytes,
                now,
                0,
            )
            self._write_header()
        return seq

    def leave(self, seq: int) -> None:
        self.leave_many((seq,))

    def leave_many(self, seqs: tuple[int, ...] | list[int]) -> None:
        """Several collectives completed (DDP's buckets at the end of a backward): one change."""
        now = time.monotonic_ns()
        with self._lock:
            self._completed += len(seqs)
            self._in = max(0, self._in - len(seqs))
            self._last_change = now
            for seq in seqs:
                if (
                    seq > self._entered - RING
                ):  # its ring entry is still its own: only its left_ns changes
                    _GEN.pack_into(self._buf, 8, self._gen * 2 + 1)
                    _GEN.pack_into(
                        self._buf, _HEADER.size + (seq % RING) * _ENTRY.size + _LEFT_AT, now
                    )
            if self._in == 0:
                self._op = 0
                self._nbytes = 0
                if not self._paused:
                    self._busy_ns += now - self._busy_since
                    self._idle_since = now
            self._write_header()

    def step(self) -> int:
        now = time.monotonic_ns()
        with self._lock:
            self._steps += 1
            self._last_change = now
            self._last_step = now
            self._write_header()
            return self._steps

    @property
    def last_step_ns(self) -> int:
        """When the last optimizer step ended (monotonic ns)."""
        return self._last_step

    def take_timing(self, *, resume: bool) -> tuple[int, int]:
        """(ns outside collectives, ns inside) since the last take, then zero both. Outside time
        stops
        counting here (scout's own work is not the job's compute) and, with `resume`, starts again
        now."""
        now = time.monotonic_ns()
        with self._lock:
            if self._in == 0 and self._idle_since is not None:
                self._idle_ns += now - self._idle_since
            out = (self._idle_ns, self._busy_ns)
            self._idle_ns = self._busy_ns = 0
            self._idle_since = now if (resume and self._in == 0) else None
            self._paused = not resume
            return out

    def pause_timing(self) -> None:
        """Scout's own work begins (votes, replay): not the job's compute."""
        now = time.monotonic_ns()
        with self._lock:
            if self._in == 0 and self._idle_since is not None:
                self._idle_ns += now - self._idle_since
            self._idle_since = None
            self._paused = True

    def resume_timing(self) -> None:
        with self._lock:
            self._paused = False
            if self._in == 0:
                self._idle_since = time.monotonic_ns()

    def set_busy(self, on: bool) -> None:
        """Mark a checkpoint save or load (the watchdog then gives the start-up limit, not the
        floor).
        """
        with self._lock:
            self._flags = (self._flags | FLAG_BUSY) if on else (self._flags & ~FLAG_BUSY)
            self._last_change = time.monotonic_ns()
            self._write_header()

    def beat(self) -> None:
        """The training advanced without a collective (a model's forward, e.g. in an evaluation
        loop): the rank's idle clock restarts; its position among the ranks does not change."""
        with self._lock:
            self._last_change = time.monotonic_ns()
            self._write_header()

    def set_pg_seq(self, value: int) -> None:
        with self._lock:
            self._pg_seq = value
            self._write_header()

    def deactivate(self) -> None:
        with self._lock:
            self._flags &= ~FLAG_ACTIVE
            self._write_header()

    @property
    def steps(self) -> int:
        return self._steps


def read(path: Path, *, retries: int = 100) -> ProgressView | None:
    """A consistent view of a record, or None if it does not exist yet or is not one."""
    try:
        with open(path, "rb") as fh:
            for _ in range(retries):
                data = os.pread(fh.fileno(), SIZE, 0)
                if len(data) < SIZE:
                    return None
                h = _HEADER.unpack_from(data, 0)
                if h[0] != MAGIC or h[1] != VERSION:
                    return None
                # the copy is consistent only if no write began or ended while it was taken
                if h[2] % 2 == 0 and os.pread(fh.fileno(), 8, 8) == data[8:16]:
                    break
                time.sleep(0.0005)
            else:
                return None
    except OSError:
        return None
    (
        _,
        _,
        _,
        pid,
        rank,
        world,
        flags,
        entered,
        completed,
        in_coll,
        op,
        nbytes,
        steps,
        pg_seq,
        last_change,
        last_step,
    ) = h
    entries = []
    for i in range(RING):
        seq, code, gsize, nb, ent, left = _ENTRY.unpack_from(data, _HEADER.size + i * _ENTRY.size)
        if seq and seq > entered - RING:
            entries.append(
                CollectiveEntry(
                    seq=seq,
                    op=OPS[code] if code < len(OPS) else "other",
                    nbytes=nb,
                    group_size=gsize,
                    entered_ns=ent,
                    left_ns=left,
                )
            )
    entries.sort(key=lambda e: e.seq)
    return ProgressView(
        pid=pid,
        rank=rank,
        world_size=world,
        active=bool(flags & FLAG_ACTIVE),
        coll_entered=entered,
        coll_completed=completed,
        in_collective=in_coll > 0,
        current_op=OPS[op] if op < len(OPS) else "other",
        current_nbytes=nbytes,
        opt_steps=steps,
        pg_seq=pg_seq,
        last_change_ns=last_change,
        last_step_ns=last_step,
        recent=tuple(entries),
        busy=bool(flags & FLAG_BUSY),
        entered_init=bool(flags & FLAG_INIT),
    )


def flight_recorder_request(shm_dir: Path, rank: int) -> Path:
    """The node-local file the watchdog creates to ask rank `rank` for torch's Flight Recorder
    dump (the bootstrap's dump thread looks for it twice a second: a stat on tmpfs, never shared
    storage)."""
    return Path(shm_dir) / f"flight-recorder-request-{int(rank)}"
