"""What a failure came from (pure): software, hardware, infrastructure or unknown, from the
strongest evidence the verdict's suspects left, and the evidence that decided it.

The order of strength: root evidence on the node (a hardware Xid class, ECC, a failed self-test;
the incident's decide stage adds it, `with_root_evidence`) over wrong numbers (an SDC verdict)
over what the rank's own exit says (the exception, its innermost frame, the signal). A job's own
words can lower the cause to `software` (it spares the job's nodes, nothing more); on their own
they never make a node's drain: that needs the site's drain rule, as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scout_slurm.evidence.records import Cause, ExitRecord, VerdictKind

# Exceptions that come from the script or its data, wherever they were raised (a KeyError inside a
# library still means the job asked for a key that is not there).
USER_EXCEPTIONS = frozenset(
    {
        "ValueError",
        "KeyError",
        "IndexError",
        "TypeError",
        "AttributeError",
        "NameError",
        "UnboundLocalError",
        "AssertionError",
        "ZeroDivisionError",
        "NotImplementedError",
        "ImportError",
        "ModuleNotFoundError",
        "FileNotFoundError",
        "IsADirectoryError",
        "NotADirectoryError",
        "RecursionError",
        "SyntaxError",
        "IndentationError",
        "LookupError",
        "StopIteration",
        "JSONDecodeError",
        "UnicodeDecodeError",
        "OutOfMemoryError",  # torch.OutOfMemoryError: the rank's own allocations
    }
)
# Messages of errors torch raises for the script's mistakes (shapes, devices, autograd misuse) and
# for the rank's own allocations.
USER_MESSAGES = re.compile(
    r"shapes cannot be multiplied|size mismatch|must match the size of tensor|"
    r"Expected all tensors to be on the same device|expected scalar type|"
    r"Trying to backward through the graph a second time|does not require grad|"
    r"modified by an inplace operation|device-side assert triggered|"
    r"CUDA out of memory|out of memory\. Tried to allocate|DefaultCPUAllocator: can't allocate",
    re.IGNORECASE,
)
# A device that is failing, whatever the code asked of it.
HARDWARE_MESSAGES = re.compile(
    r"uncorrectable ECC|ECC error|GPU is lost|fallen off the bus|uncorrectable NVLink|"
    r"CUDA error: unspecified launch failure|Xid",
    re.IGNORECASE,
)
# Storage and network outside the node's own hardware.
INFRASTRUCTURE_MESSAGES = re.compile(
    r"Input/output error|\[Errno 5\]|Stale file handle|\[Errno 116\]|No space left on device|"
    r"\[Errno 28\]|Disk quota exceeded|\[Errno 122\]|Network is unreachable|No route to host|"
    r"Name or service not known|Temporary failure in name resolution|Address already in use|"
    r"\[Errno 98\]|Connection refused|\[Errno 111\]",
    re.IGNORECASE,
)
SIGBUS = 7
# Where a library's or the interpreter's code lives: a frame anywhere else is the job's own.
LIBRARY_PATH = re.compile(
    r"/(site|dist)-packages/|/lib/python\d[\d.]*/|^<frozen |/scout_slurm/|^<eval_with_key>"
)


@dataclass(frozen=True)
class CauseFinding:
    cause: Cause
    evidence: str  # what decided it, in words for the verdict
    fault_site: str = ""  # "ValueError at train.py:73 in step" for the job's own fault


UNKNOWN = CauseFinding(Cause.UNKNOWN, "no evidence decides what the failure came from")


def exception_type(line: str) -> str:
    """'torch.OutOfMemoryError: ...' -> 'OutOfMemoryError' ("" when the line names none)."""
    head = line.split(":", 1)[0].strip()
    return head.rsplit(".", 1)[-1] if re.fullmatch(r"[A-Za-z_][\w.]*", head) else ""


def in_job_code(raised_at: str) -> bool:
    """Whether a frame 'path:line in fn' is the job's own code (not a library, not scout)."""
    path = raised_at.rsplit(" in ", 1)[0].rsplit(":", 1)[0]
    return bool(path) and not LIBRARY_PATH.search(path)


def short_site(raised_at: str) -> str:
    """'/w/train.py:73 in step' -> 'train.py:73 in step' (the file's name, not the folder)."""
    where, _, fn = raised_at.partition(" in ")
    path, _, line = where.rpartition(":")
    name = path.rsplit("/", 1)[-1] or path
    return f"{name}:{line}" + (f" in {fn}" if fn else "")


def of_exit(e: ExitRecord, exception: str) -> CauseFinding:
    """The cause one failed rank's exit shows (`exception`: the one the localiser counts as the
    rank's own, "" when none)."""
    if e.signal == SIGBUS:
        return CauseFinding(Cause.HARDWARE, f"rank {e.rank} was killed by SIGBUS (a memory error)")
    if not exception:
        return UNKNOWN
    etype = exception_type(exception)
    site = f"{etype or exception[:80]}" + (
        f" at {short_site(e.exception_at)}" if e.exception_at else ""
    )
    if HARDWARE_MESSAGES.search(exception):
        return CauseFinding(Cause.HARDWARE, f"rank {e.rank} raised a device error: {exception}")
    if INFRASTRUCTURE_MESSAGES.search(exception):
        return CauseFinding(
            Cause.INFRASTRUCTURE, f"rank {e.rank} raised a storage or network error: {exception}"
        )
    if etype in USER_EXCEPTIONS or USER_MESSAGES.search(exception):
        return CauseFinding(
            Cause.SOFTWARE,
            f"rank {e.rank} raised {etype or 'an error'} from the job's own code or data "
            f"({site}): a software failure",
            site,
        )
    if e.exception_at and in_job_code(e.exception_at):
        return CauseFinding(
            Cause.SOFTWARE, f"rank {e.rank} raised {site}, in the job's own code", site
        )
    return UNKNOWN


def judge(kind: VerdictKind, suspect_exits: Iterable[tuple[ExitRecord, str]]) -> CauseFinding:
    """The cause of a verdict from its suspects' exits (pairs of the exit record and the exception
    the localiser counts as the rank's own). Wrong numbers are the device's; otherwise the
    strongest of the suspects' causes: hardware over infrastructure over software; every suspect
    must agree on software for the verdict to be software."""
    if kind is VerdictKind.SDC:
        return CauseFinding(
            Cause.HARDWARE, "a rank computed wrong numbers (silent data corruption)"
        )
    if kind not in (VerdictKind.CRASH, VerdictKind.INFRA):
        return UNKNOWN
    found = [of_exit(e, exc) for e, exc in suspect_exits]
    if not found:
        return UNKNOWN
    for cause in (Cause.HARDWARE, Cause.INFRASTRUCTURE):
        hit = next((f for f in found if f.cause is cause), None)
        if hit is not None:
            return hit
    if all(f.cause is Cause.SOFTWARE for f in found):
        return found[0]
    return UNKNOWN


# faulthandler's frame line: '  File "/w/train.py", line 40 in step' (innermost first)
DUMP_FRAME = re.compile(
    r'\s*File "(?P<path>[^"]{1,400})", line (?P<line>\d{1,9}) in (?P<fn>\S{1,200})'
)


def of_hang_stack(rank: int, frames: Sequence[str]) -> CauseFinding:
    """What a hung rank's dumped main thread says (`frames`: faulthandler's current thread,
    innermost frame first): stopped in the job's own code (a sleep, a loop, a wait of its own),
    outside any library or collective, it is the job's software; anything else decides nothing."""
    for line in frames:
        m = DUMP_FRAME.match(line)
        if m is None:
            continue
        where = f"{m['path']}:{m['line']} in {m['fn']}"
        if not in_job_code(where):
            return UNKNOWN
        site = f"hang at {short_site(where)}"
        return CauseFinding(
            Cause.SOFTWARE,
            f"rank {rank} was in the job's own code when scout dumped its stack "
            f"({short_site(where)}), not in a collective or a library",
            site,
        )
    return UNKNOWN


def of_hang(stacks: Sequence[tuple[int, Sequence[str]]], suspects: Sequence[int]) -> CauseFinding:
    """A hang's cause from its suspects' dumped stacks: software only when every suspect's was
    read and every one stood in the job's own code."""
    by_rank = dict(stacks)
    found = [of_hang_stack(r, by_rank.get(r, ())) for r in suspects]
    if found and all(f.cause is Cause.SOFTWARE for f in found):
        return found[0]
    return UNKNOWN


def with_root_evidence(finding: CauseFinding, root_hardware: str) -> CauseFinding:
    """Root evidence of a hardware fault on a suspect's node ("" when none) outranks the rest."""
    if not root_hardware:
        return finding
    return CauseFinding(Cause.HARDWARE, f"the root check on the node found {root_hardware}")
