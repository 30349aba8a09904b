"""The out-of-band watchdog: runs in the shim's process, outside the training process, so it
sees the child exit, stop (SIGSTOP), sit in uninterruptible sleep, or stop advancing even when
the child is stuck inside C++. Watchdogs of all ranks agree on who is behind through the
evidence folder (no working collective needed) and end the step with a documented exit code;
the one that decides says so in one `scout:` line of the job's output (task/stallnotice.py).
A rank that has not entered init_process_group is on no clock until a peer waits there
(task/stallclock.py): a program outside torch.distributed is watched for its exit only.

States: WATCHING -> SUSPECT -> (WATCHING | TERMINATING) -> DONE; an illegal transition raises.
"""

from __future__ import annotations

import enum
import math
import os
import signal
import statistics
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from scout_slurm.bootstrap.agent import AgentRecord, read_agent
from scout_slurm.config import WatchdogConfig
from scout_slurm.errors import EvidenceError, ScoutError
from scout_slurm.evidence import history as history_mod
from scout_slurm.evidence.codec import decode_record, record_to_bytes
from scout_slurm.evidence.history import HistoryWriter
from scout_slurm.evidence.layout import PROGRESS_SNAPSHOTS, JobFolder
from scout_slurm.evidence.records import (
    Cause,
    ChildState,
    ExitRecord,
    Finding,
    FindingKind,
    ProgressSnapshot,
    RendezvousMark,
    StallDecision,
)
from scout_slurm.evidence.safeio import MAX_RECORD_BYTES
from scout_slurm.evidence.store import (
    create_record_exclusive,
    list_records,
    read_record,
    write_record,
)
from scout_slurm.evidence.writer import EvidenceWriter
from scout_slurm.jobenv import TaskContext
from scout_slurm.localise.stall import decide_stall
from scout_slurm.log import get_logger
from scout_slurm.task import exitcodes, publishing, stallclock, stallnotice
from scout_slurm.task import progress as progress_mod
from scout_slurm.task.evidencehealth import EvidenceHealth, storage_errno

log = get_logger("scout.watchdog")
PEERS_S = 15.0  # how long reading the peers' snapshots (or making the decision) may wait
LOOK_S = 1.0  # how long a look at a peer's mark or decision may wait for the evidence root
FR_WAIT_S = 2.0  # for the Flight Recorder dumps, once the stacks are in (the thread looks at 2 Hz)
STACK_SIGNAL = signal.SIGRTMIN + 5  # the bootstrap registers faulthandler on it
STDERR_DRAIN_S = (
    2.0  # how long the child's last stderr lines may take to reach the tail after it exited
)
STACK_WAIT_S = (
    1.0  # how long a stack dump may take to appear before the process is read from outside
)


class WatchState(enum.Enum):
    WATCHING = "watching"
    SUSPECT = "suspect"
    TERMINATING = "terminating"
    DONE = "done"


TRANSITIONS: dict[WatchState, frozenset[WatchState]] = {
    WatchState.WATCHING: frozenset({WatchState.SUSPECT, WatchState.TERMINATING, WatchState.DONE}),
    WatchState.SUSPECT: frozenset({WatchState.WATCHING, WatchState.TERMINATING, WatchState.DONE}),
    WatchState.TERMINATING: frozenset({WatchState.DONE}),
    WatchState.DONE: frozenset(),
}


def proc_state(pid: int) -> ChildState:
    """The process's scheduler state from /proc (R/S running, T stopped, D uninterruptible)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read(4096)
        state = raw.rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ChildState.EXITED
    return {
        "T": ChildState.STOPPED,
        "t": ChildState.STOPPED,
        "D": ChildState.DISK_SLEEP,
        "Z": ChildState.EXITED,
        "X": ChildState.EXITED,
    }.get(state, ChildState.RUNNING)


@dataclass
class StartupPoint:
    """A point of the start-up every rank of a job step passes (init_process_group, the job's first
    collective), as one watchdog learnt it: `since`, when (its monotonic clock; None: not yet)."""

    name: str
    path: Callable[[int, int], Path]  # the step's mark in the evidence folder (restart, step id)
    reached: Callable[[RankTracker], bool]
    since: float | None = None
    mine: bool = False  # a rank of this task passed it (the mark is written)
    next_look: float = 0.0


@dataclass
class RankTracker:
    """What one rank's record did over time, in this node's monotonic clock."""

    rank: int
    path: Path
    last_position: tuple[int, int, int] | None = None
    last_change: float = 0.0
    last_steps: int = 0
    last_step_at: float = 0.0
    intervals: deque = field(default_factory=lambda: deque(maxlen=32))
    view: progress_mod.ProgressView | None = None

    def observe(self, view: progress_mod.ProgressView, now: float) -> None:
        # the record's own last change counts too: a forward without a collective (evaluation) and
        # the start or end of a checkpoint save restart the idle clock, not the rank's position
        pos = (*view.position, view.last_change_ns)
        if pos != self.last_position:
            self.last_position = pos
            self.last_change = now
        if view.opt_steps > self.last_steps:
            if self.last_step_at:
                self.intervals.append(
                    (now - self.last_step_at) / (view.opt_steps - self.last_steps)
                )
            self.last_steps = view.opt_steps
            self.last_step_at = now
        self.view = view

    def entered_init(self) -> bool:
        """Has the process called init_process_group (the bootstrap marks it before the
        rendezvous)?
        """
        return self.view is not None and self.view.entered_init

    def entered_collective(self) -> bool:
        """Has the process entered a collective (the job's first, or one of scout's after it)?
        An optimizer step counts as past it: a job whose collectives scout's record cannot see
        (functional ones, those inside compiled graphs) is still training, on the stall clock."""
        v = self.view
        return v is not None and (v.coll_entered > 0 or v.opt_steps > 0)

    def between_init_and_first_collective(self) -> bool:
        """Past init_process_group (its record's writer opened when init returned) and in no
        collective
        yet. A rank still waiting at the rendezvous is not: its clock runs as a waiting rank's."""
        v = self.view
        return v is not None and v.pid > 0 and v.coll_entered == 0 and v.opt_steps == 0

    def idle_s(
        self,
        now: float,
        peer_at_init_since: float | None,
        peer_in_collective_since: float | None = None,
    ) -> float:
        """Seconds on the stall clock (stallclock.idle_from: none before init, or before the first
        collective, while no peer waits there)."""
        return now - self.idle_since(now, peer_at_init_since, peer_in_collective_since)

    def idle_since(
        self,
        now: float,
        peer_at_init_since: float | None,
        peer_in_collective_since: float | None = None,
    ) -> float:
        return stallclock.idle_from(
            last_change=self.last_change,
            entered_init=self.entered_init(),
            peer_at_init_since=peer_at_init_since,
            now=now,
            entered_collective=not self.between_init_and_first_collective(),
            peer_in_collective_since=peer_in_collective_since,
        )

    def watched(self) -> bool:
        v = self.view
        return v is None or v.pid <= 0 or v.active

    def typical_step_s(self) -> float:
        return statistics.median(self.intervals) if len(self.intervals) >= 3 else 0.0

    def phase(self, cfg: WatchdogConfig) -> str:
        """startup (training has not advanced: the stall clock is not armed), checkpoint I/O, or
        training.
        """
        v = self.view
        if v is None:
            return stallclock.PHASE_STARTUP
        return stallclock.phase(
            armed_=stallclock.armed(
                opt_steps=v.opt_steps,
                coll_completed=v.coll_completed,
                arm_after_collectives=cfg.arm_after_collectives,
            ),
            busy=v.busy,
        )

    def threshold_s(self, cfg: WatchdogConfig) -> float:
        return stallclock.threshold_s(
            phase_=self.phase(cfg),
            floor_s=cfg.stall_floor_s,
            factor=cfg.stall_factor,
            typical_step_s=self.typical_step_s(),
            startup_limit_s=cfg.startup_grace_s,
        )


def confirm_window_s(cfg: WatchdogConfig) -> float:
    """How long a watchdog watches its peers' publications before it decides: long enough to see a
    live watchful peer publish several times (so a silent one is told from a slow writer)."""
    return max(2.0, 4 * cfg.publish_interval_s)


class Watchdog:
    def __init__(
        self,
        *,
        ctx: TaskContext,
        cfg: WatchdogConfig,
        folder: JobFolder,
        child: subprocess.Popen,
        shm_dir: Path,
        stderr_tail: deque,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        init_line: str = "",
        torchrun: bool = False,
        writer: EvidenceWriter | None = None,
        pid_namespace: bool = False,
    ) -> None:
        self.ctx, self.cfg, self.folder, self.child = ctx, cfg, folder, child
        # the child is a container runtime whose processes have their own PID namespace
        # (apptainer --pid/--containall): the pid a progress record holds is the container's,
        # translated to the host's before scout reads /proc or signals it (task/apptainer.py)
        self.pid_namespace = pid_namespace
        self.host_pids: dict[int, int] = {}
        # the job's evidence writer: the loop's writes are enqueued there, never waited for (a
        # hung evidence root stalls the writer's helper, not this loop); None: written here
        self.writer = writer
        self.history_seq: dict[int, int] = {}
        self.written_seen = 0
        self.shm_dir, self.stderr_tail = shm_dir, stderr_tail
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.state = WatchState.WATCHING
        self.started = clock()
        self.trackers: dict[int, RankTracker] = {}
        self.publish_seq = 0
        self.next_publish = 0.0
        self.last_publish = -math.inf
        self.suspect_since = 0.0
        self.peer_seq_at_suspect: dict[int, int] = {}
        self.external_signal = 0
        self.stacks_requested = False
        self.stacks_asked_at = 0.0
        self.stacks_size_before = 0
        self.stacks_signalled = False  # the bootstrap's handler was asked (its record active)
        self.exception_before_signal = (
            None  # stderrtail.ExceptionSeen, frozen when scout or anyone signals
        )
        self.signalled = False
        self.reported_stalled: set[int] = (
            set()
        )  # ranks whose stall_suspect finding this window wrote
        self.health = EvidenceHealth(policy=cfg.on_evidence_loss, grace_s=cfg.evidence_loss_grace_s)
        self.histories: dict[int, HistoryWriter] = {}  # for the report's timeline only
        self.next_history = 0.0
        # when this watchdog learnt that a rank of its step entered init_process_group, then the
        # job's
        # first collective; until then a rank of its own not there is on no clock
        # (stallclock.idle_from)
        self.rendezvous = StartupPoint(
            "init_process_group", folder.rendezvous_path, RankTracker.entered_init
        )
        self.first_collective = StartupPoint(
            "first collective", folder.first_collective_path, RankTracker.entered_collective
        )
        self.init_line = (
            init_line  # said once, when this task's rank enters init (shim.init_banner)
        )
        self.decided_here: dict[int, ProgressSnapshot] | None = (
            None  # the snapshots, when this watchdog decided
        )
        # under torchrun the child is the agent and the ranks its workers (bootstrap/agent.py):
        # their pids and exits come from the agent's record; its attempts hold the stall clock
        self.torchrun = torchrun
        self.agent: AgentRecord | None = None
        self.attempt = 0
        self.workers: tuple[int, ...] = ()

    # -- state machine ------------------------------------------------------------------
    def _to(self, new: WatchState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise ScoutError(f"watchdog: illegal transition {self.state.value} -> {new.value}")
        log.info("watchdog.state", rank=self.ctx.rank, old=self.state.value, new=new.value)
        self.state = new

    # -- signals --------------------------------------------------------------------------
    def on_signal(self, signum: int, frame) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._freeze_exception()
            self.external_signal = signum
        try:
            os.kill(self.child.pid, signum)
        except ProcessLookupError:
            pass

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> int:
        while True:
            status = self._reap()
            if status is not None:
                return self._on_exit(status, killed_by_scout=False)
            now = self.clock()
            if self.torchrun:
                self._follow_agent(now)
            self._observe(now)
            if self._publish_due(now):
                self._publish(now)
            self._writer_health(now)
            if self.health.should_end_job(now):
                return self._end_for_lost_evidence(now)
            decision = self._check_stall(now)
            if decision is not None:
                return self._terminate(decision)
            self.sleep(self._next_sleep(self.clock()))

    def _reap(self) -> int | None:
        try:
            pid, status = os.waitpid(self.child.pid, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return None
        self.child.returncode = os.waitstatus_to_exitcode(status)
        return status

    def _observe(self, now: float) -> None:
        try:
            names = [
                n for n in os.listdir(self.shm_dir) if n.startswith("rank-") and n.endswith(".bin")
            ]
        except OSError:
            names = []
        for name in names:
            try:
                rank = int(name[5:-4])
            except ValueError:
                continue
            tracker = self.trackers.get(rank)
            if tracker is None:
                tracker = self.trackers[rank] = RankTracker(
                    rank, self.shm_dir / name, last_change=now
                )
                self.next_publish = now  # a new rank is published at once
            view = progress_mod.read(tracker.path)
            if view is not None:
                tracker.observe(view, now)
        self._follow_startup(now)
        self._sample_history(now)

    def _idle(self, tracker: RankTracker, now: float) -> float:
        return tracker.idle_s(now, self.rendezvous.since, self.first_collective.since)

    def _follow_startup(self, now: float) -> None:
        """Learn when a rank of this job step passed each point of the start-up
        (task/stallclock.py):
        init_process_group, then the job's first collective."""
        if self._follow(self.rendezvous, now) and self.init_line:
            _say(self.init_line)  # this task's rank entered init: what else is on, said once
        self._follow(self.first_collective, now)

    def _follow(self, point: StartupPoint, now: float) -> bool:
        """From this task's own record (then said once a step in the evidence folder for the other
        watchdogs), or from that mark, looked for at most once a publish interval while no rank of
        this task has passed the point (one stat, like the decision check beside it; never after).
        True when this task's own rank has just passed it."""
        if point.mine or not self.trackers:
            return False
        path = point.path(self.ctx.restart, self.ctx.step_id)
        mine = [t.rank for t in self.trackers.values() if point.reached(t)]
        if mine:
            point.mine = True
            if point.since is None:
                point.since = now
            if self.writer is not None:  # the first mark stays (the helper makes it or not)
                self.writer.create_new(
                    path,
                    record_to_bytes(
                        RendezvousMark(
                            rank=mine[0],
                            node=self.ctx.node,
                            step_id=self.ctx.step_id,
                            at=self.wall(),
                        )
                    ),
                )
            elif not path.exists():
                try:
                    create_record_exclusive(
                        path,
                        RendezvousMark(
                            rank=mine[0],
                            node=self.ctx.node,
                            step_id=self.ctx.step_id,
                            at=self.wall(),
                        ),
                    )
                except (ScoutError, OSError) as exc:
                    # the peers' start-up clocks then wait for their own ranks: later, never sooner
                    log.warning(
                        "watchdog.startup_mark_unwritten",
                        point=point.name,
                        rank=self.ctx.rank,
                        path=str(path),
                        error=str(exc),
                    )
            return True
        if point.since is not None or now < point.next_look:
            return False
        point.next_look = now + self.cfg.publish_interval_s
        if self._exists(path):
            point.since = now
            log.info("watchdog.peer_passed", point=point.name, rank=self.ctx.rank, path=str(path))
        return False

    def _training_pid(self, tracker: RankTracker) -> int:
        v = tracker.view
        if v is None or v.pid <= 0:
            return self.child.pid
        if not self.pid_namespace:
            return v.pid
        if v.pid not in self.host_pids:
            found = host_pid(v.pid, self.child.pid)
            if found is None:
                return self.child.pid  # not found (yet): the runtime, never a stranger
            self.host_pids[v.pid] = found
        return self.host_pids[v.pid]

    def snapshot(
        self, tracker: RankTracker, now: float, *, exited: bool = False
    ) -> ProgressSnapshot:
        v = tracker.view
        state = ChildState.EXITED if exited else proc_state(self._training_pid(tracker))
        if v is None:
            return ProgressSnapshot(
                rank=tracker.rank,
                node=self.ctx.node,
                pid=self.child.pid,
                published_at=self.wall(),
                child_state=state
                if exited or self.clock() - self.started > 1
                else ChildState.STARTING,
                coll_entered=0,
                coll_completed=0,
                in_collective=False,
                current_op="none",
                opt_steps=0,
                pg_seq=-1,
                idle_s=round(self._idle(tracker, now), 3),
                step_time_s=0.0,
                bootstrap_active=False,
                publish_seq=self.publish_seq,
                threshold_s=tracker.threshold_s(self.cfg),
                entered_init=False,
            )
        return ProgressSnapshot(
            rank=tracker.rank,
            node=self.ctx.node,
            pid=v.pid,
            published_at=self.wall(),
            child_state=state,
            coll_entered=v.coll_entered,
            coll_completed=v.coll_completed,
            in_collective=v.in_collective,
            current_op=v.current_op,
            opt_steps=v.opt_steps,
            pg_seq=v.pg_seq,
            idle_s=round(self._idle(tracker, now), 3),
            step_time_s=round(tracker.typical_step_s(), 4),
            recent=v.recent[-16:],
            bootstrap_active=v.active,
            publish_seq=self.publish_seq,
            threshold_s=tracker.threshold_s(self.cfg),
            entered_init=v.entered_init,
        )

    def _publish_due(self, now: float) -> bool:
        """At the steady rate while every rank advances, at the fast rate once one is watchful
        (see publishing.py); the fast check reads /proc at most once per fast interval."""
        if now >= self.next_publish:
            return True
        if now < self.last_publish + self.cfg.publish_interval_s:
            return False
        return any(
            publishing.is_watchful(
                idle_s=self._idle(t, now),
                threshold_s=t.threshold_s(self.cfg),
                state=proc_state(self._training_pid(t)),
            )
            for t in self.trackers.values()
        )

    def _publish(self, now: float, *, exited: bool = False) -> None:
        self.publish_seq += 1
        watchful = False
        for tracker in self.trackers.values():
            snap = self.snapshot(tracker, now, exited=exited)
            watchful = watchful or publishing.published_watchful(snap)
            self._write_evidence(
                self.folder.progress_path(self.ctx.restart, tracker.rank), snap, what="progress"
            )
        self.last_publish = now
        self.next_publish = now + publishing.next_interval(
            watchful,
            fast_s=self.cfg.publish_interval_s,
            steady_s=self.cfg.steady_publish_interval_s,
        )

    def _sample_history(self, now: float, *, exited: bool = False) -> None:
        """Every fast publish interval, whatever the snapshot's own rate: the timeline needs the
        advancing phase too, and a sample is one pwrite without fsync (evidence/history.py)."""
        if not exited and now < self.next_history:
            return
        self.next_history = now + self.cfg.publish_interval_s
        for tracker in self.trackers.values():
            self._add_history(tracker.rank, self.snapshot(tracker, now, exited=exited))

    def _add_history(self, rank: int, snap: ProgressSnapshot) -> None:
        """One sample into the rank's bounded ring file. It only illustrates the report, so a
        failure is logged, never counted against the job (the snapshot write above is)."""
        if self.writer is not None:
            seq = self.history_seq[rank] = self.history_seq.get(rank, 0) + 1
            path = self.folder.history_path(self.ctx.restart, rank)
            if seq == 1:
                self.writer.pwrite(path, history_mod.encode_header(history_mod.SLOTS), 0, new=True)
            slot = history_mod.encode_slot(history_mod.sample_of(snap, seq))
            self.writer.pwrite(path, slot, history_mod.slot_offset(seq, history_mod.SLOTS))
            return
        writer = self.histories.get(rank)
        if writer is None:
            writer = self.histories[rank] = HistoryWriter(
                self.folder.history_path(self.ctx.restart, rank)
            )
        try:
            writer.append(snap)
            writer.failing = False
        except OSError as exc:
            if not writer.failing:  # once per outage, not once a second
                log.warning("watchdog.history_failed", rank=rank, error=str(exc))
            writer.failing = True

    def _write_evidence(self, path: Path, record, *, what: str) -> bool:
        """Write one record; a storage that refuses writes is said loudly in the job's stderr and
        counted towards ending the job (see evidencehealth)."""
        if self.writer is not None:
            self.writer.write_record(path, record)  # refusals come back in _writer_health
            return True
        try:
            write_record(path, record)
        except ScoutError as exc:
            if storage_errno(exc) is None:
                log.warning(f"watchdog.{what}_failed", rank=self.ctx.rank, error=str(exc))
                return False
            now = self.clock()
            if self.health.failed(now, str(path), exc):
                log.error(
                    "watchdog.evidence_unwritable",
                    rank=self.ctx.rank,
                    path=str(path),
                    error=str(exc),
                    policy=self.health.policy,
                    grace_s=self.health.grace_s,
                )
                _say(f"scout: rank {self.ctx.rank}: {self.health.message(now)}")
            return False
        if self.health.succeeded():
            log.warning(
                "watchdog.evidence_writable_again",
                rank=self.ctx.rank,
                failures=self.health.failures,
            )
            _say(f"scout: rank {self.ctx.rank}: evidence can be written again")
        return True

    def _writer_health(self, now: float) -> None:
        """The writer's refusals since the last look, counted as `_write_evidence` counts its own
        (a full or read-only root ends the job by the site's policy); a hung root is no refusal:
        the writer says it and holds the records back."""
        if self.writer is None:
            return
        failures = self.writer.take_failures()
        for f in failures:
            exc = EvidenceError(f.message)
            exc.__cause__ = OSError(f.errno, os.strerror(f.errno), f.path)
            if storage_errno(exc) is None:
                log.warning("watchdog.write_failed", rank=self.ctx.rank, error=f.message)
            elif self.health.failed(now, f.path, exc):
                log.error(
                    "watchdog.evidence_unwritable",
                    rank=self.ctx.rank,
                    path=f.path,
                    error=f.message,
                    policy=self.health.policy,
                    grace_s=self.health.grace_s,
                )
                _say(f"scout: rank {self.ctx.rank}: {self.health.message(now)}")
        before, self.written_seen = self.written_seen, self.writer.written
        if not failures and self.written_seen > before and self.health.succeeded():
            log.warning(
                "watchdog.evidence_writable_again",
                rank=self.ctx.rank,
                failures=self.health.failures,
            )
            _say(f"scout: rank {self.ctx.rank}: evidence can be written again")

    def _end_for_lost_evidence(self, now: float) -> int:
        _say(
            f"scout: rank {self.ctx.rank}: ENDING THE JOB (exit code {exitcodes.EVIDENCE_LOST}): "
            f"{self.health.message(now)}"
        )
        log.error(
            "watchdog.ending_for_lost_evidence",
            rank=self.ctx.rank,
            lost_for_s=round(self.health.lost_for(now), 1),
            failures=self.health.failures,
            last_error=self.health.last_error,
        )
        self._to(WatchState.TERMINATING)
        self._freeze_exception()
        status = self._escalate()
        self._on_exit(status, killed_by_scout=True)
        return exitcodes.EVIDENCE_LOST

    def _same_bug_line(self, record: ExitRecord) -> str:
        """`same_bug` against this rank's exit on the run before (job-owned, read with no
        follow).
        """
        if self.ctx.restart <= 0:
            return ""
        if self.writer is not None and (self.writer.stalled or self.writer.dropped):
            return ""  # the root does not answer: this line is not worth the exit
        try:
            before = read_record(
                self.folder.rank_exit_path(self.ctx.restart - 1, self.ctx.rank),
                ExitRecord,
                root=self.folder.root,
            )
        except (ScoutError, OSError):
            return ""
        return same_bug(record, before, self.ctx.restart - 1).replace("JOBID", str(self.ctx.job_id))

    def _freeze_exception(self) -> None:
        """The exception the child printed before anyone signalled it: one printed afterwards (a
        handler that turns SIGTERM into an exception) says nothing about why it stopped."""
        if not self.signalled:
            self.signalled = True
            self.exception_before_signal = getattr(self.stderr_tail, "last_exception", None)

    # -- stalls ---------------------------------------------------------------------------
    def _decision_path(self) -> Path:
        return self.folder.stall_decision_path(self.ctx.restart)

    def _exists(self, path: Path) -> bool:
        """Is a peer's mark there? Through the writer's helper, for at most LOOK_S: a root that
        does not answer is "not yet" (the watchdog decides from what it has)."""
        if self.writer is None:
            return path.exists()
        return self.writer.probe(path, LOOK_S) == 0

    def _existing_decision(self) -> StallDecision | None:
        path = self._decision_path()
        if self.writer is not None:
            data = self.writer.read(path, LOOK_S, max_bytes=MAX_RECORD_BYTES, root=self.folder.root)
            if not isinstance(data, bytes):
                return None  # not there, or the root does not answer: no peer's decision known
            try:
                return decode_record(data, StallDecision, source=str(path))
            except ScoutError as exc:
                log.warning("watchdog.decision_unreadable", error=str(exc))
                return None
        if not path.exists():
            return None
        try:
            return read_record(path, StallDecision, root=self.folder.root)
        except ScoutError as exc:
            log.warning("watchdog.decision_unreadable", error=str(exc))
            return None

    def _next_sleep(self, now: float) -> float:
        """The poll interval, or less when a window opens, a threshold passes or the window ends
        sooner (stallclock.py): the call then comes at the threshold, not up to a poll later."""
        confirm_s = confirm_window_s(self.cfg)
        due = []
        for t in self.trackers.values():
            if t.watched():
                threshold = t.threshold_s(self.cfg)
                since = t.idle_since(now, self.rendezvous.since, self.first_collective.since)
                # just past the moment: the rules compare with '>'
                due.append(
                    since + stallclock.confirm_from_s(threshold, confirm_s) + stallclock.MIN_SLEEP_S
                )
                due.append(since + threshold + stallclock.MIN_SLEEP_S)
        if self.state == WatchState.SUSPECT:
            due.append(self.suspect_since + confirm_s)
        return stallclock.next_sleep_s(now=now, poll_s=self.cfg.poll_interval_s, due=due)

    def _check_stall(self, now: float) -> StallDecision | None:
        existing = self._existing_decision()
        if existing is not None:
            return existing
        if self._agent_restarting():
            return None  # torchrun is restarting its workers: the next attempt is watched anew
        confirm_s = confirm_window_s(self.cfg)
        # a record the training process deactivated (process group destroyed, interpreter exiting)
        # is not watched for stalls: the process is done with collectives
        idle = [
            (t, self._idle(t, now), t.threshold_s(self.cfg))
            for t in self.trackers.values()
            if t.watched()
        ]
        # the confirmation window opens while a rank is idle, before its threshold (stallclock.py)
        if not any(stallclock.confirming(i, th, confirm_s) for _, i, th in idle):
            if self.state == WatchState.SUSPECT:
                self._to(WatchState.WATCHING)
                self.stacks_requested = False  # a later window dumps the stacks again
                self.reported_stalled.clear()
            return None
        if self.state == WatchState.WATCHING:
            self._to(WatchState.SUSPECT)
            self.suspect_since = now
            self._request_stacks()
            self.peer_seq_at_suspect = {s.rank: s.publish_seq for s in self._peer_snapshots() or ()}
        stalled = [(t, i, th) for t, i, th in idle if stallclock.stalled(i, th)]
        for t, i, th in stalled:
            if t.rank in self.reported_stalled:
                continue
            self.reported_stalled.add(t.rank)
            self._write_finding(
                Finding(
                    rank=t.rank,
                    node=self.ctx.node,
                    kind=FindingKind.STALL_SUSPECT,
                    at=self.wall(),
                    summary=f"rank {t.rank} made no progress for {i:.1f} s (threshold {th:.1f} s, "
                    f"{t.phase(self.cfg)})",
                    details=(f"process state: {proc_state(self._training_pid(t)).value}",),
                    step=t.view.opt_steps if t.view else -1,
                )
            )
        if not stallclock.may_decide(
            now=now, window_since=self.suspect_since, confirm_s=confirm_s, any_stalled=bool(stalled)
        ):
            return None
        if any(t.phase(self.cfg) == stallclock.PHASE_CHECKPOINT and i <= th for t, i, th in idle):
            return (
                None  # a rank of this node is in a checkpoint save or load, within its limit: busy
            )
        snapshots = self._peer_snapshots()
        if snapshots is None:
            # the evidence root does not answer: no job-wide view, so no decision (the job runs
            # on as if scout were not there; the writer has said the root hangs)
            log.warning("watchdog.peers_unknown", rank=self.ctx.rank)
            return None
        peers = {s.rank: s for s in snapshots}
        # a peer whose last word was a steady heartbeat gets a steady interval more to speak
        silent = frozenset(
            r
            for r, s in peers.items()
            if r in self.peer_seq_at_suspect
            and s.publish_seq == self.peer_seq_at_suspect[r]
            and s.child_state != ChildState.EXITED
            and now - self.suspect_since
            >= publishing.silent_after(
                s,
                confirm_s=confirm_s,
                fast_s=self.cfg.publish_interval_s,
                steady_s=self.cfg.steady_publish_interval_s,
            )
        )
        for r, s in peers.items():
            if r in silent or s.child_state == ChildState.EXITED or r in self.trackers:
                continue
            if (
                s.opt_steps > 0
                and s.threshold_s >= self.cfg.startup_grace_s
                and s.idle_s <= s.threshold_s
            ):
                # a peer in a checkpoint save or load (its limit is the start-up one): busy
                return None
            if s.idle_s < s.threshold_s / 2:
                return None  # a peer is still advancing: not a job-wide stall (yet)
        if proc_state(self.child.pid) == ChildState.EXITED:
            # this task's process ended after this turn's reap: the next turn takes the exit path
            # (its exit record, EXITED published) and the ranks still waiting decide with it.
            # Deciding
            # here would set this rank's fresh exit beside a peer's snapshot that the peer's shim,
            # slower
            # under load, has not yet refreshed, and name this rank for a death that followed the
            # peer's.
            return None
        for t in self.trackers.values():
            peers[t.rank] = self.snapshot(t, now)
        # under torchrun the ranks are the workers', not the Slurm tasks': their records say how
        # many
        world = max(
            [self.ctx.world_size] + [t.view.world_size for t in self.trackers.values() if t.view]
        )
        call = decide_stall(peers, world, silent)
        reasoning = call.reasoning
        at_startup = not any(
            stallclock.armed(
                opt_steps=s.opt_steps,
                coll_completed=s.coll_completed,
                arm_after_collectives=self.cfg.arm_after_collectives,
            )
            for s in peers.values()
        )
        before_init = [r for r in call.culprits if r in peers and not peers[r].entered_init]
        if at_startup and before_init:
            reasoning = (
                f"startup hang: rank(s) {', '.join(map(str, before_init))} had not entered "
                f"init_process_group while peers waited there; the start-up limit of "
                f"{self.cfg.startup_grace_s:g} s, which runs for a rank not at the rendezvous "
                "once a "
                "peer is, passed",
                *reasoning,
            )
        elif at_startup:
            reasoning = (
                "startup hang: no rank had completed a training step (the stall clock arms "
                "at the first "
                f"optimizer step or after {self.cfg.arm_after_collectives} collectives); the "
                "start-up "
                f"limit of {self.cfg.startup_grace_s:g} s passed without progress",
                *reasoning,
            )
        decision = StallDecision(
            decided_by=self.ctx.rank,
            at=self.wall(),
            culprits=call.culprits,
            kind=call.kind,
            reasoning=reasoning,
            phase=stallclock.PHASE_STARTUP if at_startup else stallclock.PHASE_TRAINING,
        )
        if self.writer is not None:
            made = self.writer.create_exclusive(
                self._decision_path(), record_to_bytes(decision), PEERS_S
            )
            if made is None:
                log.warning("watchdog.decision_unwritten", rank=self.ctx.rank)
                return None  # not recorded, so not acted on: the peers could not see it
        else:
            made = create_record_exclusive(self._decision_path(), decision)
        if made:
            self.decided_here = dict(
                peers
            )  # this watchdog says it in the job's output (_terminate)
        return self._existing_decision() or decision

    def _peer_snapshots(self) -> list[ProgressSnapshot] | None:
        """The peers' published snapshots; None when the evidence root did not answer in time."""
        if self.writer is not None:
            got = self.writer.list_records(
                self.folder.progress_dir(self.ctx.restart),
                PROGRESS_SNAPSHOTS,
                ProgressSnapshot,
                root=self.folder.root,
                timeout=PEERS_S,
            )
            if got is None:
                return None
            records, errors = got
        else:
            records, errors = list_records(
                self.folder.progress_dir(self.ctx.restart),
                PROGRESS_SNAPSHOTS,
                ProgressSnapshot,
                root=self.folder.root,
            )
        for e in errors:
            log.warning("watchdog.peer_unreadable", error=e)
        return records

    def _stacks_path(self) -> Path:
        return self.folder.stacks_path(self.ctx.restart, self.ctx.rank)

    def _stacks_size(self) -> int:
        if self.writer is not None:  # through the helper: a hung root answers "nothing yet"
            return self.writer.size(self._stacks_path(), LOOK_S) or 0
        try:
            return self._stacks_path().stat().st_size
        except OSError:
            return 0

    def _request_stacks(self) -> None:
        if self.stacks_requested:
            return
        self.stacks_requested = True
        self.stacks_asked_at = self.clock()
        self.stacks_size_before = self._stacks_size()
        self.stacks_signalled = False
        if self.writer is not None and (
            self.writer.stalled or self.writer.probe(self._stacks_path().parent, LOOK_S) is None
        ):
            # the training process's dump handler writes into the root itself: on a root that
            # does not answer it would sit there in D state, so it is not asked
            log.warning("watchdog.stacks_not_asked", rank=self.ctx.rank, why="evidence root hung")
            return
        for t in self.trackers.values():
            if t.view is None or not t.view.active:
                continue  # the bootstrap's handler is only there while the record is active
            try:
                os.kill(self._training_pid(t), STACK_SIGNAL)
                self.stacks_signalled = True
            except ProcessLookupError:
                pass
            try:  # and torch's Flight Recorder, dumped by the bootstrap's own thread
                progress_mod.flight_recorder_request(self.shm_dir, t.rank).touch()
            except OSError:
                pass

    def _wait_flight_recorder(self, deadline: float) -> None:
        """Until the bootstrap's thread took the Flight Recorder dumps asked for (it removes each
        request), at most until `deadline`: a rank whose Python cannot run leaves its request."""
        asked = [progress_mod.flight_recorder_request(self.shm_dir, r) for r in self.trackers]
        while any(p.exists() for p in asked) and self.clock() < deadline:
            self.sleep(0.05)
        for p in asked:
            try:
                p.unlink()
            except OSError:
                pass

    def _ensure_stacks(self) -> None:
        """Before anything is killed: wait (bounded) for the dump the stack signal asked for; when
        none came (a stopped process runs no handler; an inactive record has none), read the
        processes from outside into the same file, saying why."""
        if self.stacks_signalled:
            deadline = self.stacks_asked_at + STACK_WAIT_S
            while self._stacks_size() <= self.stacks_size_before and self.clock() < deadline:
                self.sleep(0.05)
            if self._stacks_size() > self.stacks_size_before:
                self._wait_flight_recorder(min(deadline, self.clock() + FR_WAIT_S))
                return
            why = (
                f"no Python stack dump within {STACK_WAIT_S:g} s of the stack signal "
                "(process state: "
                + ", ".join(
                    sorted(
                        {proc_state(self._training_pid(t)).value for t in self.trackers.values()}
                    )
                )
                + ")"
            )
        else:
            why = (
                "no Python stack dump asked: the progress record is inactive or absent (closed at "
                "destroy_process_group() or interpreter exit, or never opened), so the "
                "bootstrap's handler "
                "may be gone and the signal could kill the process"
            )
        from scout_slurm.task.procstack import describe_process

        pids = list(
            dict.fromkeys(
                [self._training_pid(t) for t in self.trackers.values()] or [self.child.pid]
            )
        )
        lines = [
            "--- scout watchdog, "
            f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(self.wall()))}Z: {why}; "
            "the processes as /proc shows them:"
        ]
        for pid in pids:
            lines += describe_process(pid)
        try:
            with open(self._stacks_path(), "a") as fh:
                fh.write("\n".join(lines) + "\n")
        except OSError as exc:
            log.warning("watchdog.stacks_unwritable", rank=self.ctx.rank, error=str(exc))
        log.info("watchdog.stacks_from_proc", rank=self.ctx.rank, reason=why)

    def _write_finding(self, finding: Finding) -> None:
        name = f"{finding.kind.value}-rank-{finding.rank}-{int(finding.at * 1000)}.json"
        self._write_evidence(
            self.folder.findings_dir(self.ctx.restart) / name, finding, what="finding"
        )

    def _terminate(self, decision: StallDecision) -> int:
        self._to(WatchState.TERMINATING)
        if self.decided_here is not None:
            # once a job step: only the watchdog whose decision record was created says it, before
            # any rank is signalled (the step's other output, gloo's errors, follows)
            _say(
                stallnotice.ending_line(
                    decision,
                    self.decided_here,
                    job_id=self.ctx.job_id,
                    world_size=max(self.ctx.world_size, len(self.decided_here)),
                )
            )
        mine = [r for r in self.trackers if r in decision.culprits]
        self._request_stacks()
        self._ensure_stacks()  # the stacks first: nothing is signalled before they are in
        self._freeze_exception()
        now = self.clock()
        for r in mine:
            t = self.trackers[r]
            self._write_finding(
                Finding(
                    rank=r,
                    node=self.ctx.node,
                    kind=decision.kind,
                    at=self.wall(),
                    summary=f"rank {r} named by the watchdogs: {decision.kind.value}",
                    details=decision.reasoning,
                    step=t.view.opt_steps if t.view else -1,
                )
            )
        final = {r: self.snapshot(t, now) for r, t in self.trackers.items()}
        status = self._escalate()
        self._on_exit(status, killed_by_scout=True, final=final)
        return exitcodes.STALL_CULPRIT if mine else exitcodes.STALL_PEER

    def _escalate(self) -> int:
        """SIGTERM then SIGCONT (a stopped child dies on resuming, before it can run on), grace,
        SIGKILL. Under torchrun the same for each of the agent's workers, so that none is left
        behind (a stopped worker would keep the step's output open)."""
        pid = self.child.pid
        workers = self._worker_pids() if self.torchrun else ()
        status = None
        for sig, wait in (
            (signal.SIGTERM, 0.0),
            (signal.SIGCONT, self.cfg.grace_s),
            (signal.SIGKILL, 10.0),
        ):
            for target in ((pid,) if status is None else ()) + workers:  # a reaped pid: never
                try:
                    os.kill(target, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = self.clock() + wait
            while self.clock() < deadline:
                if status is None:
                    status = self._reap()
                if status is not None and all(proc_state(w) is ChildState.EXITED for w in workers):
                    return status
                self.sleep(0.05)
        if status is None:
            status = self._reap()
        return status if status is not None else 0

    # -- torchrun ---------------------------------------------------------------------------------
    def _follow_agent(self, now: float) -> None:
        """The agent's record read; a new attempt (torchrun restarted its workers) starts the
        workers' trackers anew and is said once in the job's output."""
        record = read_agent(self.shm_dir)
        if record is None or record.current is None:
            return
        self.agent = record
        current = record.current
        workers = record.pids()
        if (current.number, workers) == (self.attempt, self.workers):
            return
        new_attempt = current.number != self.attempt
        self.attempt, self.workers = current.number, workers
        self.trackers.clear()  # the old workers' clocks: the new ones are on their own
        self.next_publish = now
        if not new_attempt:
            # torchrun restarted the group without counting an attempt (another node's agent
            # failed and joined the rendezvous again)
            log.info("watchdog.torchrun_workers", rank=self.ctx.rank, pids=list(workers))
            return
        before = record.attempts[-2] if len(record.attempts) > 1 else None
        why = ""
        if before is not None and before.failed():
            failed = before.failed()
            # the worker that failed, not those torchrun then ended with SIGTERM
            w = next((f for f in failed if f.signal != signal.SIGTERM), failed[0])
            why = f" after rank {w.rank} " + (
                f"ended on signal {w.signal}" if w.signal else f"exited with code {w.exit_code}"
            )
        log.info("watchdog.torchrun_attempt", rank=self.ctx.rank, attempt=current.number)
        if self.ctx.rank == 0:
            _say(
                f"scout: torchrun restarted its workers (attempt {current.number + 1} of "
                f"{record.max_restarts + 1}){why}; scout watches the new attempt"
            )

    def _agent_restarting(self) -> bool:
        """torchrun is between two sets of workers: its attempt failed with restarts left, or a
        worker it started has gone while its record still says running (it is replacing them, or
        about to notice)."""
        if not self.torchrun:
            return False
        record = self.agent  # read by _follow_agent in this same turn of the loop
        current = record.current if record is not None else None
        if current is None:
            return False
        if current.state == "failed":
            return current.restarting
        return current.state == "running" and any(
            proc_state(p) is ChildState.EXITED for p in record.pids()
        )

    def _worker_pids(self) -> tuple[int, ...]:
        """The agent's workers now alive and still its children (a recycled pid is not signalled):
        from its record and from the workers' own progress records."""
        record = read_agent(self.shm_dir) or self.agent
        pids = set(record.pids() if record is not None else ())
        pids |= {t.view.pid for t in self.trackers.values() if t.view is not None and t.view.pid}
        return tuple(sorted(p for p in pids if p > 0 and _parent(p) == self.child.pid))

    def _worker_exits(
        self,
        status: int,
        *,
        killed_by_scout: bool,
        snaps: dict[int, ProgressSnapshot],
    ) -> list[ExitRecord]:
        """One exit record per worker of torchrun's last attempt, from the agent's record (empty
        when there is none: the workers' exits are then not known)."""
        record = read_agent(self.shm_dir) or self.agent
        current = record.current if record is not None else None
        if current is None:
            return []
        failed = current.failed()
        own = [w for w in failed if not (w.signal == signal.SIGTERM and len(failed) > 1)]
        out = []
        for w in current.workers:
            stopped = w.exit_code is None and not w.signal  # torchrun ended it, or scout, or Slurm
            by_torchrun = current.state == "failed" and w not in own
            blamed = w in own and len(own) == 1
            # a worker's own lines ("[rankN]:") are its evidence, never another worker's; the
            # lone failing worker also gets the lines no rank prefixed (torchrun's summary, its
            # own before init_process_group), but not torchrun's exception as its own
            tail, mine = self._worker_lines(w.rank), self._worker_exception(w.rank)
            if blamed:
                tail += self._worker_lines(None)[-20:]
                mine = mine or self._worker_exception(None)
            out.append(
                ExitRecord(
                    rank=w.rank,
                    node=self.ctx.node,
                    pid=w.pid,
                    exit_code=-1 if w.exit_code is None else w.exit_code,
                    signal=signal.SIGTERM if stopped else w.signal,
                    core_dumped=False,
                    at=self.wall(),
                    killed_by_scout=killed_by_scout and current.state == "running",
                    last_progress=snaps.get(w.rank),
                    stderr_tail=tail,
                    external_termination=bool(self.external_signal) or by_torchrun,
                    exception=mine.line if mine is not None else "",
                    exception_position=mine.position if mine is not None else -1,
                    exception_at=mine.raised_at if mine is not None else "",
                )
            )
        return out

    def _worker_exception(self, rank: int | None):
        """The last exception worker `rank` printed on its own lines (None: on the lines no rank
        prefixed), not torchrun's summary of a failed worker; None when there is none."""
        of = getattr(self.stderr_tail, "exceptions_of", None)
        seen = [e for e in (of(rank) if of is not None else ()) if not _launchers(e.line)]
        return seen[-1] if seen else None

    def _worker_lines(self, rank: int | None) -> tuple[str, ...]:
        """The lines of the task's output that torch attributed to worker `rank` (its uncaught
        exception, "[rankN]: ..."; None: the lines no rank prefixed): a worker that failed on its
        peer's broken connection reads as a cascade from them."""
        if rank is None:
            return tuple(getattr(self.stderr_tail, "unprefixed", ()))
        of_rank = getattr(self.stderr_tail, "of_rank", None)
        return of_rank(rank) if of_rank is not None else ()

    def _on_exit(
        self,
        status: int,
        *,
        killed_by_scout: bool,
        final: dict[int, ProgressSnapshot] | None = None,
    ) -> int:
        self._to(WatchState.DONE)
        now = self.clock()
        self._observe(now)
        snaps = final or {r: self.snapshot(t, now, exited=True) for r, t in self.trackers.items()}
        signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1
        ended = getattr(self.stderr_tail, "wait_ended", None)
        if ended is not None and not ended(STDERR_DRAIN_S):
            log.info("watchdog.stderr_open", rank=self.ctx.rank, waited_s=STDERR_DRAIN_S)
        seen = (
            self.exception_before_signal
            if self.signalled
            else getattr(self.stderr_tail, "last_exception", None)
        )
        record = ExitRecord(
            rank=self.ctx.rank,
            node=self.ctx.node,
            pid=self.child.pid,
            exit_code=code,
            signal=signum,
            core_dumped=bool(os.WIFSIGNALED(status) and os.WCOREDUMP(status)),
            at=self.wall(),
            killed_by_scout=killed_by_scout,
            last_progress=snaps.get(self.ctx.rank),
            stderr_tail=tuple(self.stderr_tail),
            external_termination=bool(self.external_signal),
            exception=seen.line if seen is not None else "",
            exception_position=seen.position if seen is not None else -1,
            exception_at=seen.raised_at if seen is not None else "",
        )
        if self.torchrun:
            # the task's own rank is not a torch rank: each worker's record instead
            workers = self._worker_exits(status, killed_by_scout=killed_by_scout, snaps=snaps)
            if not workers:
                log.warning("watchdog.torchrun_exits_unknown", rank=self.ctx.rank, code=code)
            for w in workers:
                path = self.folder.rank_exit_path(self.ctx.restart, w.rank)
                if not self._write_evidence(path, w, what="exit_record"):
                    log.error("watchdog.exit_record_failed", rank=w.rank)
        elif not self._write_evidence(
            self.folder.rank_exit_path(self.ctx.restart, self.ctx.rank), record, what="exit_record"
        ):
            log.error("watchdog.exit_record_failed", rank=self.ctx.rank)
        if record.exception and not killed_by_scout:
            line = self._same_bug_line(record)
            if line:
                _say(line)
        self._publish(now, exited=True)
        self._sample_history(now, exited=True)
        for writer in self.histories.values():
            writer.close()
        log.info(
            "watchdog.child_exited",
            rank=self.ctx.rank,
            exit_code=code,
            signal=signum,
            killed_by_scout=killed_by_scout,
        )
        return code if code >= 0 else 128 + signum


def host_pid(ns_pid: int, ancestor: int, proc: str = "/proc") -> int | None:
    """The host's pid of the process that its own PID namespace calls `ns_pid`, among the
    descendants of `ancestor` (the NSpid line of /proc/PID/status: the host's pid first, the
    innermost namespace's last); None when there is none."""
    try:
        names = os.listdir(proc)
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/status", "rb") as fh:
                status = fh.read(8192).decode("ascii", "replace")
        except OSError:
            continue
        line = next((x for x in status.splitlines() if x.startswith("NSpid:")), "")
        fields = line.split()[1:]
        if len(fields) < 2 or fields[-1] != str(ns_pid):
            continue
        pid, seen = int(name), 0
        while pid > 1 and seen < 64:  # up the tree to the runtime, never past init
            pid, seen = _parent(pid, proc), seen + 1
            if pid == ancestor:
                return int(name)
    return None


# torchrun raises this whenever a worker failed: the launcher's exception, not the worker's
_LAUNCHER_EXCEPTION = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"


def _launchers(line: str) -> bool:
    """Is this exception line torchrun's own (its summary of a failed worker)?"""
    return line.startswith(_LAUNCHER_EXCEPTION)


def _parent(pid: int, proc: str = "/proc") -> int:
    """The parent pid of `pid` (0 when it is gone or unreadable)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read(4096)
        return int(data[data.rindex(b")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def same_bug(record: ExitRecord, before: ExitRecord | None, run_before: int) -> str:
    """The loud line for a rank that failed in its own software exactly as it did on the run
    before ("" otherwise, pure): the controller does not requeue the same software failure twice
    (remediation/plan.py `software_plan`), and the job's output says why its job ends here."""
    from scout_slurm.localise.cause import of_exit

    if before is None or not before.exception:
        return ""
    now, then = of_exit(record, record.exception), of_exit(before, before.exception)
    if now.cause is not Cause.SOFTWARE or not now.fault_site or now.fault_site != then.fault_site:
        return ""
    return (
        f"scout: rank {record.rank} failed with the same {now.fault_site} as on run {run_before}: "
        "a bug in the script, not a node's fault; scout drains nothing and does not requeue the "
        "same software failure again (the verdict: scout show JOBID)"
    )


def _say(line: str) -> None:
    """One plain line on the job's stderr (besides the structured log), so people see it in the
    job's output file whatever the log format."""
    import sys

    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
