"""Typed, versioned evidence records (frozen dataclasses, written as JSON by `store`).

Every record has a `KIND` tag and a `schema_version`; `store.read_record` refuses a file whose
kind or version it does not know. No Dict[str, Any] crosses a module boundary. Who writes each
record, and into which file, is listed in evidence/contract.py.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar


class ChildState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"  # R or S, advancing or not
    STOPPED = "stopped"  # T: SIGSTOP
    DISK_SLEEP = "disk_sleep"  # D: uninterruptible sleep
    EXITED = "exited"


class FindingKind(str, enum.Enum):
    STALL_SUSPECT = "stall_suspect"  # this rank stopped advancing
    HANG = "hang"  # agreed: this rank is behind the others
    DESYNC = "desync"  # this rank's collective sequence differs from the majority
    CRASH = "crash"  # the process exited abnormally
    SDC = "sdc"  # numbers differ from the replicas' majority
    STRAGGLER = "straggler"
    INFO = "info"
    # Kinds for what an INFO finding said in words (the bootstrap writes these; readers also accept
    # the words of older records: `is_fault_injection`, `is_no_majority`).
    NO_MAJORITY = "no_majority"  # replicas disagreed with no strict majority: nobody is named
    FAULT_INJECTED = (
        "fault_injected"  # the bootstrap injected a test fault (lab, acceptance, benchmarks)
    )
    # one of scout's checks failed inside scout and was switched off (bootstrap.guard)
    CHECK_OFF = "check_off"
    # the run loaded a checkpoint scout had rejected (corrupt, changed, saved after the first
    # suspect step): whatever it computes from there is suspect (bootstrap/ckptstate.py)
    TAINTED = "tainted"


class FindingComponent(str, enum.Enum):
    """What a finding is about (`Finding.component`, kept a string on disk: "" when none)."""

    WEIGHTS = "weights"
    OPTIMIZER = "optimizer"
    COMPUTE = "compute"  # in-situ replay, a non-finite loss, a compute straggler
    COMMUNICATION = "communication"  # a communication straggler
    TIMING = "timing"  # a timing vote's own note
    RESUME = "resume"  # the restored state against its checkpoint record


class ResumeOutcome(str, enum.Enum):
    """What a resume finding says of the restored state."""

    VERIFIED = "verified"
    MISMATCH = "mismatch"
    OTHER = "other"  # not checked, or not loaded: said in its summary


# The words older writers put in INFO findings, read in this one place only.
INJECTED_SUMMARY = "fault injected"  # bootstrap/patches.py: f"fault injected: {fault.kind}"
NO_MAJORITY_WORD = "inconclusive"  # bootstrap/consensus.py, replay.py: "...: inconclusive: ..."
RESUME_MISMATCH_WORD = "MISMATCH"  # bootstrap/ckptstate.py: "RESUME MISMATCH: rank ..."
RESUME_VERIFIED_WORDS = "resume verified"  # bootstrap/ckptstate.py: "resume verified: rank ..."


def resume_outcome(summary: str) -> ResumeOutcome:
    """The outcome a resume finding's summary states (the finding carries no field for it yet)."""
    if RESUME_MISMATCH_WORD in summary:
        return ResumeOutcome.MISMATCH
    if RESUME_VERIFIED_WORDS in summary:
        return ResumeOutcome.VERIFIED
    return ResumeOutcome.OTHER


class VoteOutcome(str, enum.Enum):
    """What one vote among ranks decided (state and replay votes, the non-finite vote, timing
    spreads).
    """

    AGREE = "agree"  # every replica gave the same value
    SDC = "sdc"  # a strict minority of replicas differs: named
    NAMED = "named"  # a strict minority stands out (non-finite onset, timing spread): named
    NONE = "none"  # nothing to decide (no rank non-finite)
    CLEAN = "clean"  # no rank stands out (timing)
    INCONCLUSIVE = "inconclusive"  # a difference with no strict majority: nobody is named


class VerdictKind(str, enum.Enum):
    CLEAN = "clean"
    HANG = "hang"
    CRASH = "crash"
    STRAGGLER = "straggler"
    SDC = "sdc"
    INFRA = "infra"
    INCONCLUSIVE = "inconclusive"
    # every rank exited cleanly but no check of the state or timing ran (votes off, or fewer steps
    # than K and no end-of-training vote): nothing was found because nothing was looked at
    UNCHECKED = "unchecked"
    # the run trained from a checkpoint scout had rejected: not clean, whatever it found after
    TAINTED = "tainted"


class Cause(str, enum.Enum):
    """What a failure came from, by the strongest evidence (localise/cause.py decides it): the
    actions differ (a software failure never drains, excludes or watches a node)."""

    SOFTWARE = "software"  # the job's own exception, a known user-side error, its own OOM
    HARDWARE = "hardware"  # root evidence on the node, wrong numbers, device-lost errors, SIGBUS
    INFRASTRUCTURE = "infrastructure"  # file system or network errors
    UNKNOWN = "unknown"  # nothing decides: today's rule applies


class Agreement(str, enum.Enum):
    """What `CheckpointNote.agreement` says of the replicas' state signatures at the save."""

    AGREED = "agreed"
    DISAGREED = "disagreed"
    NOT_EXCHANGED = "not exchanged"
    UNKNOWN = ""  # a version 1 record, or a text this scout does not know


@dataclass(frozen=True)
class CollectiveEntry:
    seq: int  # scout's own count of collectives this rank entered (1-based)
    op: str  # all_reduce, broadcast, ddp_bucket_all_reduce, ...
    nbytes: int
    group_size: int
    entered_ns: int  # CLOCK_MONOTONIC on the rank's node
    left_ns: int  # 0 while still inside


@dataclass(frozen=True)
class RankPlace:
    KIND: ClassVar[str] = "rank-place"
    job_id: int
    restart: int
    rank: int
    local_rank: int
    world_size: int
    node: str
    hostname: str
    task_pid: int
    child_pid: int
    gpu_uuids: tuple[str, ...]
    cuda_visible_devices: str
    nic: str
    master_addr: str
    master_port: int
    started_at: float
    step_offset: int = 0  # the step this run resumed from: progress counts from here
    launcher: str = ""  # "torchrun" when the task starts several ranks itself
    # v2: the UUID torch reports for the GPU the rank's parameters are on (the bootstrap, at its
    # first optimizer step; "" on CPU or before), and where gpu_uuids came from: "device" (that
    # UUID found in the node's map), "index" (CUDA_VISIBLE_DEVICES and LOCAL_RANK), "" (not joined)
    device_uuid: str = ""
    gpu_from: str = ""
    schema_version: int = 2
    OLDEST_SCHEMA_VERSION: ClassVar[int] = 1  # v1 has neither: read as not recorded


@dataclass(frozen=True)
class ProgressSnapshot:
    """What a watchdog publishes about its rank, read by every other watchdog and the localiser."""

    KIND: ClassVar[str] = "progress"
    rank: int
    node: str
    pid: int
    published_at: float  # wall clock of the publishing node
    child_state: ChildState
    coll_entered: int
    coll_completed: int
    in_collective: bool
    current_op: str
    opt_steps: int
    pg_seq: int  # torch's own counter on the default group, -1 if unknown
    idle_s: float  # seconds since the record last advanced (monotonic, local)
    step_time_s: float  # observed typical time between advances, 0 if unknown
    recent: tuple[CollectiveEntry, ...] = ()
    bootstrap_active: bool = True
    publish_seq: int = 0  # increases with every publication: liveness without clocks
    threshold_s: float = 0.0  # the stall threshold this watchdog applies now
    schema_version: int = 1
    # the process called init_process_group (waits at its rendezvous, or is past it); a snapshot
    # without the field comes from a watchdog that ordered ranks by progress alone: read as True
    entered_init: bool = True


@dataclass(frozen=True)
class RendezvousMark:
    """Written once per job step (exclusive create) by the watchdog that first sees its rank enter
    init_process_group (rendezvous-step-S.json), or the job's first collective
    (first-collective-step-S.json): from then on a rank of that step not there is on the start-up
    clock (task/stallclock.py). Its presence is what counts; the fields say who and when."""

    KIND: ClassVar[str] = "rendezvous"
    rank: int
    node: str
    step_id: int
    at: float  # wall clock of the writing node
    schema_version: int = 1


@dataclass(frozen=True)
class ExitRecord:
    KIND: ClassVar[str] = "exit"
    rank: int
    node: str
    pid: int
    exit_code: int  # -1 when killed by a signal
    signal: int  # 0 when it exited normally
    core_dumped: bool
    at: float  # wall clock
    killed_by_scout: bool  # the watchdog ended it after a stall decision
    last_progress: ProgressSnapshot | None
    stderr_tail: tuple[str, ...] = ()
    external_termination: bool = (
        False  # the shim itself was signalled (scancel, srun, node shutdown)
    )
    # the final "Type: message" line of the last Python traceback in the child's stderr, printed
    # before scout or anyone signalled it ("" when none), and the rank's progress position
    # (collectives entered + completed) when it was printed, -1 unknown: whole even in a digest
    exception: str = ""
    exception_position: int = -1
    # the innermost frame of that traceback, 'path:line in function' ("" when none): where it was
    # raised, so that a cause can tell the job's own code from a library's (version 2)
    exception_at: str = ""
    schema_version: int = 2


@dataclass(frozen=True)
class NodeTasks:
    """The ranks a job step started on one node, `run-N/tasks/<node>.json`: written by the task of
    local rank 0 from SLURM_GTIDS, so that the node Epilog knows which records are its node's
    without listing the whole job's. The job's file: the Epilog checks every rank against its
    place record."""

    KIND: ClassVar[str] = "node-tasks"
    job_id: int
    restart: int
    node: str
    ranks: tuple[int, ...]
    schema_version: int = 1


@dataclass(frozen=True)
class DigestedRank:
    """One rank's records as its node's Epilog read them, abridged for the controller: the exit
    record's stderr tail keeps its last 3 lines and the last line naming a peer's failure, and the
    final snapshot's collectives are in the digest's `rings` (index `ring`), without their times."""

    rank: int
    place: RankPlace
    exit: ExitRecord | None
    progress: (
        ProgressSnapshot | None
    )  # the published snapshot, only when the exit record carries none
    ring: int = -1


@dataclass(frozen=True)
class NodeDigest:
    """`nodes/<node>/ranks-<restart>.json`, written by the node Epilog (root): what the controller
    reads instead of three files a rank. Ranks whose records did not check out are left out, and
    the controller reads their files itself."""

    KIND: ClassVar[str] = "node-digest"
    job_id: int
    restart: int
    node: str
    rings: tuple[tuple[CollectiveEntry, ...], ...]
    ranks: tuple[DigestedRank, ...]
    written_at: float
    schema_version: int = 1


@dataclass(frozen=True)
class Finding:
    KIND: ClassVar[str] = "finding"
    rank: int
    node: str
    kind: FindingKind
    at: float
    summary: str
    details: tuple[str, ...] = ()
    step: int = -1
    since_step: int = -1  # the earliest step the problem may have begun (SDC: last clean vote + 1)
    component: str = ""  # SDC: what was found wrong: "weights", "optimizer" or "compute" (replay)
    schema_version: int = 1


def is_fault_injection(f: Finding) -> bool:
    """The bootstrap's note that it injected a test fault (its time is the fault's)."""
    return f.kind == FindingKind.FAULT_INJECTED or (
        f.kind == FindingKind.INFO and f.summary.startswith(INJECTED_SUMMARY)
    )


def is_no_majority(f: Finding) -> bool:
    """A vote of replicas (state, replay, timing) that found no strict majority: nobody is named."""
    return f.kind == FindingKind.NO_MAJORITY or (
        f.kind == FindingKind.INFO and bool(f.component) and NO_MAJORITY_WORD in f.summary
    )


@dataclass(frozen=True)
class StallDecision:
    """Written once (exclusive create) by the first watchdog that decides; the others adopt it."""

    KIND: ClassVar[str] = "stall-decision"
    decided_by: int
    at: float
    culprits: tuple[int, ...]
    kind: FindingKind
    reasoning: tuple[str, ...]
    schema_version: int = 1
    phase: str = "training"  # "startup": no rank had advanced training yet (a startup hang)


@dataclass(frozen=True)
class Suspect:
    rank: int
    node: str
    kind: VerdictKind
    confidence: float
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True)
class VoteCoverage:
    """Written by the lowest rank after every round of scout's checks in a run (runs/N/votes.json):
    which checks ran and how far they saw the run sound. Verdicts and checkpoint records quote
    it."""

    KIND: ClassVar[str] = "vote-coverage"
    restart: int
    votes: int  # state votes among replicas (the end-of-training one included)
    last_clean_step: int  # the last step at which every replica's state agreed (-1: none)
    last_vote_step: int
    replay_rounds: int | None = None  # in-situ replay rounds run so far (None: replay off)
    replay_failed_rounds: int = 0  # of those, rounds where some rank could not recompute (no vote)
    timing_rounds: int = 0  # timing votes (stragglers)
    votes_every: int = 0  # K of each check as the run had it (0: off)
    replay_every: int = 0
    timing_every: int = 0
    steps: int = -1  # the last optimizer step this run completed (counted from training's start)
    final_vote: str = ""  # the end-of-training vote: "" not reached, else what it did
    replicas: int = (
        0  # the largest replica group the votes compared (1: none to compare; 0: unknown)
    )
    update_rounds: int | None = None  # optimizer update replays so far (None: off or not needed)
    at_rest_windows: int | None = (
        None  # at-rest witness windows so far (None: off, or a record from before it)
    )
    at_rest_stopped: str = ""  # why the witness stopped during the run ("": it ran on)
    # scout's checks the guard switched off on the lowest rank ("check: why": a failure of scout's
    # own
    # code, or an exchange with the other ranks that failed)
    checks_off: tuple[str, ...] = ()
    # layers the in-situ replay does not check, "layer: why" (its recomputation cannot be exact,
    # or it did not reproduce before it ever agreed: bootstrap.determinism, bootstrap.replay)
    replay_not_checked: tuple[str, ...] = ()
    schema_version: int = 3
    OLDEST_SCHEMA_VERSION: ClassVar[int] = 1

    @property
    def checks_ran(self) -> bool:
        """A check of what the ranks computed ran: a state vote among replicas, a replay round
        with a vote, an optimizer update replay. Timing votes alone do not count: they say how
        fast the ranks were, not whether their state is right (a 40-step bitflip with only a
        timing round was once called `clean`)."""
        return (
            (self.votes > 0 and self.replicas != 1)
            or bool(self.replay_rounds and self.replay_rounds > self.replay_failed_rounds)
            or bool(self.update_rounds)
        )

    def lines(self) -> tuple[str, ...]:
        """What ran, in words (one line per kind of check)."""

        def every(k: int) -> str:
            return f"every {k} steps" if k > 0 else "off"

        votes = (
            f"state votes ({every(self.votes_every)}): {self.votes}"
            + (f", the last at step {self.last_vote_step}" if self.votes else "")
            + (
                f", every replica agreed up to step {self.last_clean_step}"
                if self.last_clean_step >= 0
                else (", no vote with replicas agreeing" if self.votes else "")
            )
        )
        if self.votes and self.replicas == 1:
            votes += (
                " (no replicas to compare: every rank holds a state of its own, so nothing was "
                "compared)"
            )
        out = [votes]
        if self.final_vote:
            out.append(f"end-of-training vote: {self.final_vote}")
        if self.replay_rounds is None:
            out.append("in-situ replay: off")
        else:
            out.append(
                f"in-situ replay ({every(self.replay_every)}): {self.replay_rounds} rounds"
                + (
                    f", {self.replay_failed_rounds} without a vote (a rank could not recompute)"
                    if self.replay_failed_rounds
                    else ""
                )
            )
            out += [f"in-situ replay: not checked: {why}" for why in self.replay_not_checked]
        if self.update_rounds is not None:
            out.append(
                f"optimizer update replay ({every(self.votes_every)}): {self.update_rounds} rounds"
            )
        if self.at_rest_windows is not None:
            windows = f"{self.at_rest_windows} window{'' if self.at_rest_windows == 1 else 's'}"
            out.append(
                f"at-rest witness ({every(self.votes_every)}): {windows}"
                + (f", then stopped: {self.at_rest_stopped}" if self.at_rest_stopped else "")
            )
        out.append(f"timing votes ({every(self.timing_every)}): {self.timing_rounds} rounds")
        out += [
            f"stopped during the run (scout's guard switched it off): {off}"
            for off in self.checks_off
        ]
        if self.steps >= 0:
            out.append(f"optimizer steps in this run: up to step {self.steps}")
        return tuple(out)


@dataclass(frozen=True)
class ScoutCost:
    """What scout's own work inside the training process cost one rank (runs/N/ranks/cost-R.json),
    measured there (bootstrap/selfcost.py) and rewritten every 100 steps and at the end: CPU of the
    optimizer hooks (votes, replay, timing, checkpoint records, the coverage record) and of scout's
    collective wrappers and progress record."""

    KIND: ClassVar[str] = "scout-cost"
    rank: int
    restart: int
    steps: int  # optimizer steps measured: those after the first (its set-up is not a step's cost)
    hooks_cpu_ns: int  # CPU of the calling thread inside scout's optimizer hooks over those steps
    wrapper_ns: (
        int  # the same inside scout's collective wrappers (sampled; the collectives excluded)
    )
    wrapper_calls: int  # collectives recorded over those steps
    step_wall_ns: int  # wall time of those steps (from the end of the first to the end of the last)
    # times scout's Python ran on gloo's threads (over the whole run; each takes the GIL there)
    comm_thread_calls: int = 0
    schema_version: int = 1

    @property
    def per_step_ms(self) -> float:
        return (self.hooks_cpu_ns + self.wrapper_ns) / max(1, self.steps) / 1e6

    @property
    def share(self) -> float | None:
        """Scout's time over the steps' wall time (None: no step measured yet)."""
        if self.step_wall_ns <= 0 or self.steps < 1:
            return None
        return (self.hooks_cpu_ns + self.wrapper_ns) / self.step_wall_ns


@dataclass(frozen=True)
class Verdict:
    KIND: ClassVar[str] = "verdict"
    job_id: int
    restart: int
    kind: VerdictKind
    suspects: tuple[Suspect, ...]
    confidence: float
    reasoning: tuple[str, ...]
    first_failure_at: float  # wall clock, 0 when unknown
    first_suspect_step: int  # -1 when unknown
    world_size: int
    created_at: float
    # which of scout's checks ran in the run (None: no record of any, e.g. an older job or votes
    # off)
    coverage: VoteCoverage | None = None
    # what the failure came from and the evidence that decided it (version 2)
    cause: Cause = Cause.UNKNOWN
    cause_evidence: str = ""
    # the job's own fault, where a rerun failing the same way proves a bug: "ValueError at
    # train.py:73 in step" ("" when there is none)
    fault_site: str = ""
    schema_version: int = 2

    @property
    def suspect_nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.node for s in self.suspects))


# -- checkpoints: noted by the job (checkpoints/), checked by the batch host's Epilog (nodes/) --


@dataclass(frozen=True)
class CheckpointFile:
    """One file of a checkpoint as re-read from storage after fsync (a DCP checkpoint is a folder
    of several)."""

    name: str  # relative to the checkpoint's path; "" for a single-file checkpoint
    size_bytes: int
    sha256: str
    schema_version: int = 1


@dataclass(frozen=True)
class StateSignature:
    """One component of the training state (model, optimizer, scheduler, rng_cpu, rng_cuda,
    rng_python, rng_numpy, data) as signed on each rank and exchanged on scout's side group."""

    component: str
    saved: str  # hex signature on the saving rank at the moment of the save ("": none)
    per_rank: tuple[str, ...]  # hex per rank at the exchange ("": that rank has none)
    majority: str  # the strict majority among the replicas ("": none)
    agreed: bool  # every replica group held one value
    schema_version: int = 1


@dataclass(frozen=True)
class SoftwareVersions:
    python: str
    torch: str
    cuda: str | None
    nccl: str | None
    scout: str
    schema_version: int = 1


@dataclass(frozen=True)
class CoverageSince:
    """State votes and in-situ replay rounds since the previous checkpoint record of this run."""

    votes: int
    replay_rounds: int
    last_clean_step: int  # -1: no clean vote yet
    last_vote_step: int
    verdicts: str  # in words: "clean", "not clean ...", "no votes", "replay not recorded"
    schema_version: int = 1


@dataclass(frozen=True)
class CheckpointNote:
    """A checkpoint the training process wrote (seen through torch.save,
    torch.distributed.checkpoint
    or the explicit call), and the eligibility evidence recorded with it. Version 1 records (path,
    digest and versions only) are still read: the later fields then keep their defaults."""

    KIND: ClassVar[str] = "checkpoint-note"
    path: str
    step: int
    rank: int
    restart: int
    saved_at: float
    size_bytes: int
    sha256: str = ""  # of the file as re-read from storage after fsync (DCP: of the file list)
    versions: str = ""  # python, torch, scout at save time
    saver: str = ""  # "torch.save", "dcp.save", "note" (the explicit call)
    files: tuple[CheckpointFile, ...] = ()
    world: int = 0
    ranks_saved: tuple[int, ...] = ()
    signatures: tuple[StateSignature, ...] = ()
    agreement: str = ""  # "agreed", "disagreed: ...", "not exchanged: ..." ("" in version 1)
    exchanged_at_save: bool = (
        False  # DCP: every rank signed inside the save; torch.save: at the next step
    )
    data_position: str = ""  # what "data" signs, in words
    software: SoftwareVersions | None = None
    coverage: CoverageSince | None = None
    saved_as: str = (
        ""  # the name it was written under, when renamed since (the atomic save); "": not renamed
    )
    schema_version: int = 2

    @property
    def agreement_kind(self) -> Agreement:
        """The outcome `agreement` opens with (the rest of the text says where replicas
        differed).
        """
        for kind in (Agreement.DISAGREED, Agreement.AGREED, Agreement.NOT_EXCHANGED):
            if self.agreement.startswith(kind.value):
                return kind
        return Agreement.UNKNOWN


@dataclass(frozen=True)
class CheckpointCheck:
    """One checkpoint note as the batch host's Epilog checked it, as the job's own user."""

    note_file: str  # its file name in checkpoints/
    note_digest: str  # sha256 of the note as read: a note rewritten since matches no result
    path: str  # what the note names (shortened for people; results match by the digest)
    step: int
    problem: str  # not verified: why; verified: "" or how far (by size and presence only)
    verified: bool
    schema_version: int = 1


@dataclass(frozen=True)
class CheckpointChecks:
    """Written by the batch host's node Epilog (root) into nodes/<node>/checkpoints-<restart>.json:
    what checking the job's checkpoint notes as the job's user found. The controller reads this
    instead of opening any path a job named."""

    KIND: ClassVar[str] = "checkpoint-checks"
    job_id: int
    restart: int
    node: str
    checked_as_uid: int
    results: tuple[CheckpointCheck, ...]
    schema_version: int = 1


# -- what the localiser reads: one run's records, gathered (evidence/gather.py) --


@dataclass(frozen=True)
class JobEvidence:
    """One run's records as gathered from the job folder (evidence/gather.py): the localiser's
    input.
    """

    job_id: int
    restart: int
    world_size: int
    places: Mapping[int, RankPlace] = field(default_factory=dict)
    exits: Mapping[int, ExitRecord] = field(default_factory=dict)
    # published snapshots; gather_evidence leaves out ranks whose exit record carries a later one
    snapshots: Mapping[int, ProgressSnapshot] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    decision: StallDecision | None = None
    job_exit_code: int = -1  # raw wait status from Slurm; -1 unknown
    problems: tuple[str, ...] = ()
    # ranks read from node digests (evidence/digest.py): stderr tails abridged, ring entries
    # without times; gather.with_full_records reads the whole records of the ones that matter
    abridged: frozenset[int] = frozenset()
    coverage: VoteCoverage | None = None  # which of scout's checks ran (the lowest rank's record)
    # torch's Flight Recorder dumps of a stall, rank -> its place in each process group
    # (evidence/flightrec.py LedgerPosition); read only when the watchdogs decided a stall
    ledger: Mapping[int, tuple] = field(default_factory=dict)

    def node_of(self, rank: int) -> str:
        if rank in self.places:
            return self.places[rank].node
        if rank in self.exits:
            return self.exits[rank].node
        if rank in self.snapshots:
            return self.snapshots[rank].node
        return "?"

    def last_progress(self, rank: int) -> ProgressSnapshot | None:
        e = self.exits.get(rank)
        if e is not None and e.last_progress is not None:
            return e.last_progress
        return self.snapshots.get(rank)
