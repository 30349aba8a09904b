"""torch's Flight Recorder dump of a rank, read for what it says of the rank's place in each
process group's collectives (pure): the last collective it enqueued and the last that completed,
and what that collective was (its op, tensor sizes and the call site in the job's code). The dump
is the job's file (untrusted): read whole or not at all.

Two forms: the JSON of `_dump_fr_trace_json` (no stack traces) and the pickle torch writes on
NCCL's collective timeout and `_dump_fr_trace` returns (with them). A pickle is read by an
unpickler that refuses every global: torch's dumps are plain dicts, lists, strings and numbers,
and a pickle that names any class or function (the only way unpickling runs code) is refused
whole, never loaded.

Flight Recorder sees what scout's own record cannot: functional collectives, collectives inside
compiled graphs, and on NCCL the device's progress (`last_completed` from CUDA events), not the
CPU's."""

from __future__ import annotations

import io
import json
import pickle
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
    sizes: str = ""  # its input tensors ("Float[4]"), "" when not in the dump
    site: str = ""  # where the job's code called it ("train.py:14 in train_step"): pickle dumps

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
                f" (completed up to #{self.last_completed}){self.what()}"
            )
        after = f"{self.op or '?'} #{self.last_enqueued}"
        return f"rank {self.rank}: outside any collective, after {after}{group}"

    def what(self) -> str:
        """ "; input Float[4], called at train.py:14 in train_step", or "" when the dump said
        neither."""
        parts = [f"input {self.sizes}"] if self.sizes else []
        if self.site:
            parts.append(f"called at {self.site}")
        return f"; {', '.join(parts)}" if parts else ""


class _PlainUnpickler(pickle.Unpickler):
    """Plain containers and scalars only: any global (class, function) refuses the whole file."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a global ({module[:40]}.{name[:40]}) in a dump")


def _load(data: bytes) -> Any:
    if data[:1] == b"\x80":  # a pickle (protocol 2 or later), as torch writes its dumps
        try:
            return _PlainUnpickler(io.BytesIO(data)).load()
        except Exception:  # noqa: BLE001 (a planted pickle may raise any error): not a dump
            return None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None


def _sizes(entry: dict) -> str:
    """ "Float[4], Float[2, 3]" from an entry's input sizes and dtypes (bounded)."""
    sizes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not isinstance(sizes, (list, tuple)):
        return ""
    dtypes = dtypes if isinstance(dtypes, (list, tuple)) else []
    out = []
    for i, shape in enumerate(list(sizes)[:4]):
        if not isinstance(shape, (list, tuple)) or not all(isinstance(n, int) for n in shape):
            return ""
        dtype = dtypes[i] if i < len(dtypes) and isinstance(dtypes[i], str) else "?"
        out.append(f"{dtype[:16]}[{', '.join(str(n) for n in list(shape)[:8])}]")
    more = f" and {len(sizes) - 4} more" if len(sizes) > 4 else ""
    return ", ".join(out) + more


# the frames of torch's own wrappers and of scout's, above the job's call site
_NOT_THE_JOBS = ("/torch/", "/scout_slurm/", "/site-packages/")


def _site(entry: dict) -> str:
    """The innermost frame of the job's own code that called the collective ("" when none)."""
    frames = entry.get("frames")
    if not isinstance(frames, (list, tuple)):
        return ""
    frames = [
        f for f in list(frames)[:64] if isinstance(f, dict) and isinstance(f.get("filename"), str)
    ]
    # the job's own file first; else the innermost framework frame (Lightning's loop), not torch's
    for skip in (_NOT_THE_JOBS, _NOT_THE_JOBS[:2]):
        for f in frames:
            name = f["filename"]
            if any(part in name for part in skip):
                continue
            short = "/".join(name.split("/")[-2:])[-80:]
            fn = f.get("name") if isinstance(f.get("name"), str) else "?"
            return f"{short}:{_int(f.get('line'))} in {fn[:60]}"
    return ""


def _int(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return -1
    return n if -1 <= n < 2**63 else -1


def read_dump(data: bytes, rank: int) -> tuple[LedgerPosition, ...]:
    """The rank's position in each process group ((): not a dump this reader understands)."""
    dump = _load(data)
    if not isinstance(dump, dict) or not isinstance(dump.get("pg_status"), dict):
        return ()
    entries = dump.get("entries") if isinstance(dump.get("entries"), list) else []
    names: dict[tuple[str, int], tuple[str, str, str]] = {}
    for e in entries:
        if isinstance(e, dict) and isinstance(e.get("profiling_name"), str):
            names[(str(e.get("pg_id", "")), _int(e.get("collective_seq_id")))] = (
                e["profiling_name"][:80],
                _sizes(e),
                _site(e),
            )
    out = []
    for group, status in sorted(dump["pg_status"].items(), key=lambda kv: str(kv[0]))[:64]:
        if not isinstance(status, dict):
            continue
        enqueued = _int(status.get("last_enqueued_collective"))
        op, sizes, site = names.get((str(group), enqueued), ("", "", ""))
        out.append(
            LedgerPosition(
                rank=rank,
                group=str(group)[:40],
                last_enqueued=enqueued,
                last_completed=_int(status.get("last_completed_collective")),
                op=op,
                sizes=sizes,
                site=site,
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
    first = group[waiting[0]]
    reasons = [
        f"torch's Flight Recorder: {len(waiting)} of {world} ranks wait inside "
        f"{first.op or 'a collective'} #{newest} of the default group{first.what()}"
    ]
    reasons += [f"{group[r].describe()}: it never enqueued #{newest}" for r in behind[:8]]
    return behind, tuple(reasons)
