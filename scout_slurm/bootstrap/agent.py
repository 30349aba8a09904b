"""torchrun's own agent as the instrument for its workers (issue 43).

Under `scout-srun ... torchrun ...` the Slurm task is the torchrun agent and the ranks are its
workers, which scout's shim did not start and cannot wait for. The agent knows each worker's global
rank, pid and exit code, and which attempt it is on (`--max-restarts`): it finds them out in
`LocalElasticAgent._monitor_workers`, which it calls every `monitor_interval`. The bootstrap (on
PYTHONPATH in the agent's Python too) wraps that method when torchrun imports it, and writes what
the agent learnt into the task's node-local progress folder (`agent.json`, /dev/shm): the workers
of each attempt when they start, and each attempt's end. The shim's watchdog reads it to write one
exit record per worker, to signal the workers themselves, and to hold its stall clock while torchrun
restarts its workers. The record is written only when something changed (an attempt's workers
known, an attempt ended), atomically, and never breaks the agent: a failure is said once.

The record (`AgentRecord`, version 1) is pure data read by `read_agent` (bounded, untrusted: the job
wrote it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AGENT_RECORD = "agent.json"
VERSION = 1
MAX_BYTES = 1 << 20
MAX_WORKERS = 4096
MAX_ATTEMPTS = 64


@dataclass(frozen=True)
class WorkerExit:
    """One worker of one attempt, as torchrun saw it. `exit_code`: the process's code (None while
    it runs, or when torchrun stopped it after another worker failed); `signal`: the signal that
    ended it (0 if none)."""

    rank: int  # the worker's global rank (torch's RANK)
    local_rank: int
    pid: int
    exit_code: int | None = None
    signal: int = 0


@dataclass(frozen=True)
class Attempt:
    """One start of the worker group. `state`: running, succeeded or failed; `restarting`: torchrun
    restarts the group after this failure (restarts left)."""

    number: int  # TORCHELASTIC_RESTART_COUNT of its workers: 0, then 1, ...
    state: str
    workers: tuple[WorkerExit, ...]
    restarting: bool = False
    ended_at: float = 0.0

    def failed(self) -> tuple[WorkerExit, ...]:
        return tuple(w for w in self.workers if w.exit_code not in (None, 0) or w.signal)


@dataclass(frozen=True)
class AgentRecord:
    max_restarts: int
    attempts: tuple[Attempt, ...] = field(default_factory=tuple)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def pids(self) -> tuple[int, ...]:
        """The pids of the current attempt's workers."""
        current = self.current
        return tuple(w.pid for w in current.workers if w.pid > 0) if current else ()


def to_json(record: AgentRecord) -> bytes:
    return json.dumps(
        {
            "version": VERSION,
            "max_restarts": record.max_restarts,
            "attempts": [
                {
                    "number": a.number,
                    "state": a.state,
                    "restarting": a.restarting,
                    "ended_at": a.ended_at,
                    "workers": [
                        [w.rank, w.local_rank, w.pid, w.exit_code, w.signal] for w in a.workers
                    ],
                }
                for a in record.attempts
            ],
        },
        separators=(",", ":"),
    ).encode()


def _int(value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{value!r} is not an integer in [{lo}, {hi}]")
    return value


def parse(data: bytes) -> AgentRecord:
    """The record from its bytes; ValueError for anything else (pure)."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {MAX_BYTES}")
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError("not a version 1 agent record")
    attempts = []
    for a in doc.get("attempts", [])[:MAX_ATTEMPTS]:
        state = a.get("state")
        if state not in ("running", "succeeded", "failed"):
            raise ValueError(f"attempt state {state!r}")
        workers = []
        for w in a.get("workers", [])[:MAX_WORKERS]:
            rank, local, pid, code, sig = w
            workers.append(
                WorkerExit(
                    rank=_int(rank, 0, 1 << 20),
                    local_rank=_int(local, 0, 1 << 16),
                    pid=_int(pid, 0, 1 << 22),
                    exit_code=None if code is None else _int(code, 0, 255),
                    signal=_int(sig, 0, 64),
                )
            )
        attempts.append(
            Attempt(
                number=_int(a.get("number"), 0, 1 << 16),
                state=state,
                workers=tuple(workers),
                restarting=bool(a.get("restarting")),
                ended_at=float(a.get("ended_at", 0.0)),
            )
        )
    return AgentRecord(_int(doc.get("max_restarts", 0), 0, 1 << 20), tuple(attempts))


def read_agent(progress_dir: Path) -> AgentRecord | None:
    """The agent's record in a task's progress folder; None when there is none or it cannot be
    read (a record the agent is writing is replaced atomically, so none is half-written)."""
    try:
        fd = os.open(progress_dir / AGENT_RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return parse(data)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


# -- in the agent's process ----------------------------------------------------------------------


class AgentNotes:
    """What the wrapped `_monitor_workers` learnt, written on change."""

    def __init__(self, progress_dir: Path) -> None:
        self.path = progress_dir / AGENT_RECORD
        self.record: AgentRecord | None = None

    def after_monitor(self, agent: Any, group: Any, result: Any) -> None:
        spec = group.spec
        remaining = int(getattr(agent, "_remaining_restarts", 0))
        number = int(spec.max_restarts) - remaining
        state = getattr(getattr(result, "state", None), "name", "")
        running = tuple(
            WorkerExit(int(w.global_rank), int(w.local_rank), max(0, int(w.id or 0)))
            for w in group.workers
        )
        attempts = list(self.record.attempts) if self.record else []
        if not attempts or attempts[-1].number != number:
            attempts.append(Attempt(number, "running", running))
        elif attempts[-1].state != "running":
            return  # this attempt's end is on record already
        if state == "HEALTHY":
            if attempts[-1].workers == running and self.record is not None:
                return  # nothing new
            attempts[-1] = Attempt(number, "running", running)
        elif state == "SUCCEEDED":
            attempts[-1] = Attempt(
                number,
                "succeeded",
                tuple(WorkerExit(w.rank, w.local_rank, w.pid, 0) for w in running),
                ended_at=time.time(),
            )
        elif state in ("FAILED", "UNHEALTHY"):
            failures = getattr(result, "failures", {}) or {}
            workers = []
            for w in running:
                f = failures.get(w.rank)
                code = getattr(f, "exitcode", None) if f is not None else None
                if code is None:
                    workers.append(w)  # still running: torchrun stops it now
                elif code < 0:
                    workers.append(WorkerExit(w.rank, w.local_rank, w.pid, None, -code))
                else:
                    workers.append(WorkerExit(w.rank, w.local_rank, w.pid, min(code, 255)))
            attempts[-1] = Attempt(
                number, "failed", tuple(workers), restarting=remaining > 0, ended_at=time.time()
            )
        else:
            return
        self.record = AgentRecord(int(spec.max_restarts), tuple(attempts[-MAX_ATTEMPTS:]))
        tmp = self.path.with_name(f".{AGENT_RECORD}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, to_json(self.record))
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


def watch_agent(module: Any, progress_dir: Path, guard: Any) -> None:
    """Wrap `LocalElasticAgent._monitor_workers` of torchrun's agent module (called by the
    import hook); the agent's own call and result are untouched whatever the notes do."""
    cls = getattr(module, "LocalElasticAgent", None)
    original = getattr(cls, "_monitor_workers", None)
    if cls is None or original is None or getattr(original, "_scout_wrapped", False):
        sys.stderr.write(
            "scout: torchrun's agent has no LocalElasticAgent._monitor_workers here: the workers' "
            "exits are not recorded per rank\n"
        )
        return
    notes = AgentNotes(progress_dir)

    def _monitor_workers(self, worker_group):
        result = original(self, worker_group)
        guard.run("torchrun agent record", notes.after_monitor, self, worker_group, result)
        return result

    _monitor_workers._scout_wrapped = True  # type: ignore[attr-defined]
    cls._monitor_workers = _monitor_workers
