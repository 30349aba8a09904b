"""The training process's writes into the evidence root (findings, coverage, cost, checkpoint
notes, Flight Recorder dumps): one `EvidenceWriter` a process, started by the bootstrap's entry
(patches.install_from_config) in a real job, so a hung root never stalls the training thread.
Until it is started (a unit test, a hand-run script) the writes are made on the caller's thread.

The writer is process-wide, as the bootstrap's one runtime is: every witness writes through it
without being handed it, which keeps their call sites one import away from the synchronous form."""

from __future__ import annotations

import atexit
import os
from pathlib import Path
from typing import Any

from scout_slurm.evidence.writer import EvidenceWriter

FLUSH_AT_EXIT_S = 5.0  # what the held records may add to the process's end, at most
STACKS_PROBE_S = 5.0  # how long the stacks file's folder may take to answer at start

_writer: EvidenceWriter | None = None


def _forget_in_child() -> None:
    # a forked child (a DataLoader worker) has the writer's queue but not its thread: it writes
    # on its own thread, as before any writer
    global _writer
    _writer = None


os.register_at_fork(after_in_child=_forget_in_child)


def start(root: Path | str) -> EvidenceWriter:
    """The process's writer (made once); its held records get FLUSH_AT_EXIT_S at the end."""
    global _writer
    if _writer is None:
        _writer = EvidenceWriter(root)
        atexit.register(close)
    return _writer


def current() -> EvidenceWriter | None:
    return _writer


def close(timeout: float = FLUSH_AT_EXIT_S) -> None:
    if _writer is not None:
        _writer.close(timeout)


def flush(timeout: float = FLUSH_AT_EXIT_S) -> bool:
    """Before an os._exit: what was enqueued lands, or the bound passes."""
    return _writer.flush(timeout) if _writer is not None else True


def answering() -> bool:
    """False while the root is known not to answer (a write stalled, or records dropped): a read
    of the root on the training thread is not worth its risk then."""
    return _writer is None or not (_writer.stalled or _writer.dropped)


def write_record(path: Path, record: Any, *, mode: int = 0o644) -> None:
    if _writer is not None:
        _writer.write_record(path, record, mode=mode)
        return
    from scout_slurm.evidence.store import write_record as write_now

    write_now(path, record, mode=mode)


def write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    if _writer is not None:
        _writer.write(path, data, mode=mode)
        return
    from scout_slurm.evidence.safeio import atomic_write_bytes

    atomic_write_bytes(path, data, mode=mode)


def mkdir(path: Path) -> None:
    if _writer is not None:
        _writer.mkdir(path)
        return
    Path(path).mkdir(parents=True, exist_ok=True)


def probe(path: Path | str, timeout: float) -> bool:
    """Does `path`'s folder answer within `timeout`? (Without a writer: not asked, True.)"""
    if _writer is None:
        return True
    return _writer.probe(os.path.dirname(os.fspath(path)) or ".", timeout) is not None
