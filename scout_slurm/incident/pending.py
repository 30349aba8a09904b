"""Incidents whose handling began and has not ended, so that a controller Epilog killed half-way
(Slurm's timeout, an out-of-memory kill, a reboot) does not leave its incident `planned` for ever.

While a hook handles run N of a job it holds an flock on `results/lock-N` (the kernel frees it when
the hook dies, however it dies) and keeps a marker `<root>/<cluster>/pending/<job>-<N>.json`
holding the hook's context; the marker goes when the plan reached an end. Every later controller
run on the cluster, for any job, looks at the markers whose lock nobody holds and completes those
incidents, through the same stages (incident/run.py `handle`) and the same actions record, so
nothing is done twice.
The functions that reach outside are `held_lock`, `write_marker`, `remove_marker`, `list_markers`.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.store import list_named_records, write_record
from scout_slurm.jobenv import HookContext
from scout_slurm.log import get_logger

log = get_logger("scout.pending")
MAX_MARKERS = 1000  # read at most this many markers a run (oldest first)
_MARKER = re.compile(r"^(\d{1,12})-(\d{1,6})\.json$")


@dataclass(frozen=True)
class PendingIncident:
    """A marker: whose incident, the hook context to handle it again, since when."""

    KIND: ClassVar[str] = "pending-incident"
    job_id: int
    job_uid: int
    job_user: str
    cluster: str
    restart: int
    job_nodelist: str
    exit_code_raw: int
    work_dir: str
    since: float
    holder: str  # "controller" or "batch-host <node>": who began it
    schema_version: int = 1

    @classmethod
    def of(cls, ctx: HookContext, *, since: float, holder: str) -> PendingIncident:
        return cls(
            job_id=ctx.job_id,
            job_uid=ctx.job_uid,
            job_user=ctx.job_user,
            cluster=ctx.cluster,
            restart=ctx.restart,
            job_nodelist=ctx.job_nodelist,
            exit_code_raw=ctx.exit_code_raw,
            work_dir=ctx.work_dir,
            since=since,
            holder=holder,
        )

    def context(self) -> HookContext:
        """The hook context to handle this incident again (as the controller: no node)."""
        return HookContext(
            job_id=self.job_id,
            job_uid=self.job_uid,
            job_user=self.job_user,
            cluster=self.cluster,
            restart=self.restart,
            node="",
            job_nodelist=self.job_nodelist,
            exit_code_raw=self.exit_code_raw,
            script_context="epilog_slurmctld",
            work_dir=self.work_dir,
        )


class Busy(Exception):
    """Another live hook holds this incident's lock."""


class held_lock:
    """`with held_lock(folder, restart):` the flock of run `restart`'s incident, not blocking:
    raises Busy while another process holds it. The lock file is opened without following links
    in the SlurmUser-owned results folder (the job cannot write there)."""

    def __init__(self, folder: JobFolder, restart: int) -> None:
        self.path = folder.lock_path(restart)
        self.fd = -1

    def __enter__(self) -> held_lock:
        try:
            self.fd = os.open(
                self.path,
                os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                0o644,
            )
        except OSError as exc:
            raise EvidenceError(
                f"{self.path}: cannot open the incident's lock ({exc.strerror}); is the "
                "results folder there and SlurmUser's (laid out by the Prolog)?"
            ) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self.fd)
            self.fd = -1
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise Busy(str(self.path)) from None
            raise EvidenceError(f"{self.path}: cannot lock ({exc.strerror})") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the flock
            self.fd = -1


def write_marker(folder: JobFolder, marker: PendingIncident) -> None:
    try:
        write_record(
            folder.pending_path(marker.restart), marker, mode=0o644
        )  # the folder (0750) keeps others out
    except (EvidenceError, OSError) as exc:
        # without it, only a rerun by hand completes this incident if this hook dies: say so
        log.warning(
            "pending.marker_not_written", job=marker.job_id, restart=marker.restart, error=str(exc)
        )


def remove_marker(folder: JobFolder, restart: int) -> None:
    try:
        os.unlink(folder.pending_path(restart))
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning(
            "pending.marker_not_removed", job=folder.job_id, restart=restart, error=str(exc)
        )


def list_markers(folder_of_cluster: JobFolder) -> Iterator[PendingIncident]:
    """The cluster's markers, oldest first (names only decide what is read; each is checked to name
    its own job and run). `folder_of_cluster` is any job's folder of that cluster."""
    d = folder_of_cluster.pending_dir
    if not d.is_dir():
        return
    try:
        named, errors = list_named_records(
            d, "*.json", PendingIncident, root=folder_of_cluster.root, max_files=MAX_MARKERS
        )
    except EvidenceError as exc:
        log.warning("pending.unreadable", folder=str(d), error=str(exc))
        return
    for e in errors[:5]:
        log.warning("pending.marker_unreadable", error=e)
    markers = []
    for name, m in named:
        match = _MARKER.match(name)
        if (
            not match
            or (int(match.group(1)), int(match.group(2))) != (m.job_id, m.restart)
            or m.cluster != folder_of_cluster.cluster
        ):
            log.warning(
                "pending.marker_refused",
                name=name,
                why="does not name its own job, run and cluster",
            )
            continue
        markers.append(m)
    yield from sorted(markers, key=lambda m: m.since)


def due(
    markers: list[PendingIncident],
    *,
    now: float,
    current: tuple[int, int],
    min_age_s: float,
    max_age_s: float,
) -> tuple[list[PendingIncident], list[PendingIncident]]:
    """(to complete, too old to complete) among the markers (pure): not the current incident, old
    enough that its own hook had time to take the lock, young enough that Slurm still knows the
    job."""
    todo, stale = [], []
    for m in markers:
        if (m.job_id, m.restart) == current:
            continue
        age = now - m.since
        if age > max_age_s:
            stale.append(m)
        elif age >= min_age_s:
            todo.append(m)
    return todo, stale


def abandon(folder: JobFolder, marker: PendingIncident, *, now: float) -> None:
    """A marker too old to complete: its job is gone from Slurm. Said in the log, then removed."""
    log.error(
        "pending.abandoned",
        job=marker.job_id,
        restart=marker.restart,
        age_s=round(now - marker.since),
        holder=marker.holder,
        consequence="the incident stays as its records are; rerun `scout-epilog-slurmctld` by "
        "hand if needed",
    )
    remove_marker(dataclasses.replace(folder, job_id=marker.job_id), marker.restart)
