"""torch's Flight Recorder dump of a rank, read for what it says of the rank's place in each
process group's collectives (pure): the last collective it enqueued and the last that completed,
and what that collective was. The dump is the job's file (untrusted): read whole or not at all.

Flight Recorder sees what scout's own record cannot: functional collectives, collectives inside
compiled graphs, and on NCCL the device's progress (`last_completed` from CUDA events), not the
CPU's."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_DUMP_BYTES = 16 << 20


@dataclass(frozen=True)
class LedgerPosition:
    """One process group of one rank, as its Flight Recorder dump says."""

    rank: int
    group: str  # the process group's id ("0": the default group)
    last_enqueued: int  # collective sequence number, -1 when none
    last_completed: int
    op: str  # profiling name of the last enqueued one ("gloo:all_reduce"), "" when not in the dump

    @property
    def inside(self) -> bool:
        return self.last_enqueued > self.last_completed

    def describe(self) -> str:
        group = "" if self.group in ("0", "") else f" (group {self.group})"
        if self.last_enqueued < 0:
            return f"rank {self.rank}: no collective yet{group}"
        if self.inside:
            return (
                f"rank {self.rank}: inside {self.op or 'a collective'} #{self.last_enqueued}{group}"
                f" (completed up to #{self.last_completed})"
            )
        after = f"{self.op or '?'} #{self.last_enqueued}"
        return f"rank {self.rank}: outside any collective, after {after}{group}"


def _int(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return -1
    return n if -1 <= n < 2**63 else -1


def read_dump(data: bytes, rank: int) -> tuple[LedgerPosition, ...]:
    """The rank's position in each process group ((): not a dump this reader understands)."""
    try:
        dump = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return ()
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return ()
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names: dict[tuple[str, int], str] = {}
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("profiling_name"), str):
            names[(str(e.get("pg_id", "")), _int(e.get("collective_seq_id")))] = e[
                "profiling_name"
            ][:80]
    out = []
    for group, status in sorted(dump["pg_status"].items(), key=lambda kv: str(kv[0]))[:64]:
        if not isinstance(status, dict):
            continue
        enqueued = _int(status.get("last_enqueued_collective"))
        out.append(
            LedgerPosition(
                rank=rank,
                group=str(group)[:40],
                last_enqueued=enqueued,
                last_completed=_int(status.get("last_completed_collective")),
                op=names.get((str(group), enqueued), ""),
            )
        )
    return tuple(out)


def summary(positions: dict[int, tuple[LedgerPosition, ...]], world: int) -> list[str]:
    """A line per rank of the default group (then the others), the ranks without a dump named."""
    lines = []
    for rank in sorted(positions):
        for p in positions[rank]:
            lines.append(p.describe())
    missing = [r for r in range(world) if r not in positions]
    if missing and positions:
        shown = ", ".join(str(r) for r in missing[:16]) + (" ..." if len(missing) > 16 else "")
        lines.append(f"no Flight Recorder dump from ranks {shown}")
    return lines


def behind_in_ledger(
    positions: dict[int, tuple[LedgerPosition, ...]], world: int
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The ranks torch's Flight Recorder shows behind in the default process group (pure): a
    strict minority that never enqueued the collective every other rank waits inside (as the
    progress rule, one of two is no majority: see docs/HOW-IT-WORKS.md, "Two ranks"). Needs a dump
    from every rank; ((), ()) when the dumps do not say it (all equal, some missing, no group 0,
    half or more behind, or a rank ahead not waiting)."""
    group = {r: next((p for p in ps if p.group == "0"), None) for r, ps in positions.items()}
    if world < 2 or len(group) != world or any(p is None for p in group.values()):
        return (), ()
    newest = max(p.last_enqueued for p in group.values())
    if newest < 0:
        return (), ()
    waiting = [r for r, p in group.items() if p.last_enqueued == newest and p.inside]
    behind = tuple(sorted(r for r, p in group.items() if p.last_enqueued < newest))
    if not behind or len(behind) * 2 >= world or len(waiting) + len(behind) != world:
        return (), ()
    op = group[waiting[0]].op or "a collective"
    reasons = [
        f"torch's Flight Recorder: {len(waiting)} of {world} ranks wait inside {op} #{newest} "
        "of the default group"
    ]
    reasons += [f"{group[r].describe()}: it never enqueued #{newest}" for r in behind[:8]]
    return behind, tuple(reasons)
