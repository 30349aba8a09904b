"""A small, bounded history of each rank's progress, for the incident report's timeline (who
stopped when). The watchdog adds one fixed-size sample per publication to a ring file per rank,
`run-N/progress/history-<rank>.bin`, overwriting the oldest, so the file never grows past
HEADER + SLOTS * SLOT bytes: 4048 B, one 4 KiB block, at 112 slots (almost 2 minutes at the
default 1 s publish interval: the default 60 s stall floor and what came before it; 56 s in the
lab). The history illustrates; no decision reads it, so it is written
with one pwrite and no fsync. The function that reaches outside is `HistoryWriter.append`.

Layout (little-endian): header magic, version, slot size, slot count; then slots of
seq (1-based, 0 = never written), child state, flags, collectives entered but not completed,
wall clock, optimizer steps, collectives completed, crc32 of the slot. A torn or forged slot fails
its crc and is dropped by the reader.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.evidence.records import ChildState, ProgressSnapshot

MAGIC = 0x49484353  # "SCHI"
VERSION = 1
SLOTS = 112
MAX_SLOTS = 4096  # a reader never accepts a file claiming more
_HEADER = struct.Struct("<IHHII")  # magic, version, slot size, slots, reserved
_BODY = struct.Struct("<IBBHdqq")  # seq, state, flags, pending, wall, opt_steps, coll_completed
_SLOT = struct.Struct("<IBBHdqqI")  # _BODY + crc32 of it
MAX_BYTES = _HEADER.size + MAX_SLOTS * _SLOT.size
_STATES = tuple(ChildState)
_FLAG_IN_COLLECTIVE = 1


@dataclass(frozen=True)
class ProgressSample:
    seq: int
    at: float  # wall clock of the rank's node
    opt_steps: int
    coll_completed: int
    coll_entered: int  # one more than completed while waiting inside a collective
    state: ChildState
    in_collective: bool
    schema_version: int = VERSION


def sample_of(snap: ProgressSnapshot, seq: int) -> ProgressSample:
    return ProgressSample(
        seq=seq,
        at=snap.published_at,
        opt_steps=snap.opt_steps,
        coll_completed=snap.coll_completed,
        coll_entered=max(snap.coll_entered, snap.coll_completed),
        state=snap.child_state,
        in_collective=snap.in_collective,
    )


def encode_header(slots: int = SLOTS) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, _SLOT.size, slots, 0)


def encode_slot(s: ProgressSample) -> bytes:
    pending = max(0, min(0xFFFF, s.coll_entered - s.coll_completed))
    body = _BODY.pack(
        s.seq & 0xFFFFFFFF,
        _STATES.index(s.state),
        _FLAG_IN_COLLECTIVE if s.in_collective else 0,
        pending,
        float(s.at),
        _clamp64(s.opt_steps),
        _clamp64(s.coll_completed),
    )
    return body + struct.pack("<I", zlib.crc32(body))


def slot_offset(seq: int, slots: int) -> int:
    return _HEADER.size + ((seq - 1) % slots) * _SLOT.size


def _clamp64(v: int) -> int:
    return max(-(2**63), min(2**63 - 1, int(v)))


def decode_history(
    data: bytes, *, source: str = "history"
) -> tuple[tuple[ProgressSample, ...], list[str]]:
    """The valid samples of a ring file, oldest first, and what was wrong with it (pure; the
    bytes come from the job and may be anything)."""
    if len(data) < _HEADER.size:
        return (), [f"{source}: shorter than its header; ignored"]
    magic, version, slot_size, slots, _ = _HEADER.unpack_from(data)
    if magic != MAGIC or slot_size != _SLOT.size:
        return (), [f"{source}: not a scout progress history; ignored"]
    if version != VERSION:
        return (), [f"{source}: history version {version}, this scout reads {VERSION}; ignored"]
    if not 0 < slots <= MAX_SLOTS:
        return (), [f"{source}: claims {slots} slots (at most {MAX_SLOTS}); ignored"]
    out: dict[int, ProgressSample] = {}
    bad = 0
    for i in range(slots):
        off = _HEADER.size + i * _SLOT.size
        if off + _SLOT.size > len(data):
            break
        seq, state, flags, pending, at, steps, done, crc = _SLOT.unpack_from(data, off)
        if seq == 0:
            continue
        if (
            zlib.crc32(data[off : off + _BODY.size]) != crc
            or state >= len(_STATES)
            or not math.isfinite(at)
            or slot_offset(seq, slots) != off
        ):
            bad += 1
            continue
        out[seq] = ProgressSample(
            seq=seq,
            at=at,
            opt_steps=steps,
            coll_completed=done,
            coll_entered=done + pending,
            state=_STATES[state],
            in_collective=bool(flags & _FLAG_IN_COLLECTIVE),
        )
    problems = [f"{source}: {bad} damaged sample(s) dropped"] if bad else []
    return tuple(out[k] for k in sorted(out)), problems


class HistoryWriter:
    """One rank's ring file, opened on the first sample (truncated then: a run folder is new)."""

    def __init__(self, path: Path, slots: int = SLOTS) -> None:
        if not 0 < slots <= MAX_SLOTS:
            raise ValueError(f"history slots {slots}: must be 1..{MAX_SLOTS}")
        self.path, self.slots = Path(path), slots
        self.seq = 0
        self.fd: int | None = None
        self.opened_once = False
        self.failing = False  # the caller's note: the last append failed

    def append(self, snap: ProgressSnapshot) -> None:
        """Raises OSError when the file cannot be written; the caller decides how loud to be."""
        if self.fd is None:
            flags = (
                os.O_WRONLY
                | os.O_CREAT
                | os.O_NOFOLLOW
                | os.O_CLOEXEC
                | (0 if self.opened_once else os.O_TRUNC)
            )
            self.fd = os.open(self.path, flags, 0o644)
            self.opened_once = True
            try:
                os.pwrite(self.fd, encode_header(self.slots), 0)
            except OSError:
                self.close()
                raise
        self.seq += 1
        try:
            os.pwrite(
                self.fd, encode_slot(sample_of(snap, self.seq)), slot_offset(self.seq, self.slots)
            )
        except OSError:
            self.close()  # reopened on the next sample: the storage may come back
            raise

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            finally:
                self.fd = None
