"""The localiser (pure): the evidence of one run of a job in, a verdict out.

Order of reasoning: an agreed stall decision; then exits, where a rank that failed because a
peer died (gloo/NCCL errors, timeouts, killed by scout or by Slurm) is a cascade and is not
blamed; the first primary failure by progress order wins, wall time breaks ties within a node
only. When most ranks share the failure there is no majority: inconclusive.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from scout_slurm.evidence.cascade import CASCADE_PATTERNS, mentions_peer_failure  # noqa: F401 (re-exported)
from scout_slurm.evidence.flightrec import behind_in_ledger
from scout_slurm.evidence.records import (
    ChildState,
    ExitRecord,
    Finding,
    FindingComponent,
    FindingKind,
    JobEvidence,
    ProgressSnapshot,
    Suspect,
    Verdict,
    VerdictKind,
    is_no_majority,
)
from scout_slurm.localise import cause
from scout_slurm.localise.stall import find_desync, position
from scout_slurm.task import exitcodes

STRAGGLER_ENDED = (
    91  # scout_slurm.task.exitcodes: a confirmed straggler ended under the "exit" policy
)
CRASH_SIGNALS = {
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    31: "SIGSYS",
}


# --- the decision as a table ---------------------------------------------------------------------
# `localise` consults these rules in this order; the first whose evidence is present decides the
# kind and the confidence. docs/HOW-IT-WORKS.md's verdict section is rendered from this table
# (`render_rules_markdown`; tests/unit/test_verdict_rules.py keeps the two equal).


class Rule(str, enum.Enum):
    SDC_VOTE = "sdc-vote"
    STALL_LEDGER = "stall-ledger"
    STALL_NO_CULPRIT = "stall-no-culprit"
    STALL_CRASHED = "stall-crashed"
    STALL_STOPPED = "stall-stopped"
    STALL_BEHIND = "stall-behind"
    STALL_WIDE = "stall-wide"
    DESYNC = "desync"
    STRAGGLER = "straggler"
    FAILED_AT_EXIT = "failed-at-exit"
    NO_MAJORITY = "no-majority"
    UNWATCHED_CLEAN = "unwatched-clean"
    UNWATCHED_FAILED = "unwatched-failed"
    CLEAN = "clean"
    UNCHECKED = "unchecked"
    MISSING_EXIT = "missing-exit"
    FAILED_NO_RANK = "failed-no-rank"
    CASCADE_MISSING = "cascade-missing"
    ALL_CASCADE = "all-cascade"
    SHARED_FAILURE = "shared-failure"
    CRASH_SOLE = "crash-sole"
    CRASH_FIRST = "crash-first"
    CRASH_TIED = "crash-tied"
    TAINTED = "tainted"


@dataclass(frozen=True)
class VerdictRule:
    evidence: str  # what must be present, in words
    kind: VerdictKind | None  # None: keeps the kind an earlier rule gave (a factor)
    confidence: float  # the verdict's (a suspect's, for the per-culprit stall rules)
    why: str
    factor: bool = False  # the confidence multiplies the one the earlier rules gave


RULES: dict[Rule, VerdictRule] = {
    Rule.SDC_VOTE: VerdictRule(
        "an `sdc` finding (state vote or in-situ replay)",
        VerdictKind.SDC,
        0.9,
        "a strict majority of equivalent replicas disagreed with the named rank(s); checked "
        "first, as it happens",
    ),
    Rule.STALL_LEDGER: VerdictRule(
        "a stall decision naming no rank; torch's Flight Recorder dumps of every rank show a "
        "strict minority that never enqueued the collective all the others wait inside",
        VerdictKind.HANG,
        0.85,
        "scout's own record cannot see functional collectives or those inside compiled graphs; "
        "torch's ledger does",
    ),
    Rule.STALL_NO_CULPRIT: VerdictRule(
        "a stall decision naming no rank",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "the job stalled but no rank was behind the others",
    ),
    Rule.STALL_CRASHED: VerdictRule(
        "a stall decision; the culprit's exit or stderr says it crashed (not for a desync)",
        VerdictKind.CRASH,
        0.95,
        "it ended on its own, or raised and sat idle, or had left training: a crash, however "
        "its peers waited",
    ),
    Rule.STALL_STOPPED: VerdictRule(
        "a stall decision; the culprit's process was stopped (T) or in disk sleep (D)",
        VerdictKind.HANG,
        0.95,
        "the process state itself says it was not running",
    ),
    Rule.STALL_BEHIND: VerdictRule(
        "a stall decision naming the culprit(s)",
        VerdictKind.HANG,
        0.9,
        "the watchdogs agreed the rank stopped making progress first (or its collectives left "
        "the majority's)",
    ),
    Rule.STALL_WIDE: VerdictRule(
        "a stall decision naming more than a quarter of the ranks",
        None,
        0.8,
        "the more ranks are behind, the less one of them is the cause",
        factor=True,
    ),
    Rule.DESYNC: VerdictRule(
        "every rank's collective ring; a minority ran a different collective",
        VerdictKind.HANG,
        0.9,
        "a desync (gloo may then abort a peer): before blaming whoever died first",
    ),
    Rule.STRAGGLER: VerdictRule(
        "a confirmed `straggler` finding, and no rank failed (or only at exit, or ended for it)",
        VerdictKind.STRAGGLER,
        0.9,
        "timing votes confirmed the rank was slower; a slow rank does not fail a job",
    ),
    Rule.FAILED_AT_EXIT: VerdictRule(
        "every failed rank failed after leaving distributed training; the others exited cleanly",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "a failure at exit (a communicator torn down at shutdown) says nothing about a node",
    ),
    Rule.NO_MAJORITY: VerdictRule(
        "no rank failed; a vote of replicas found no strict majority",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "replicas disagreed with no majority (e.g. two HSDP replicas): nobody is named, the "
        "run is not clean",
    ),
    Rule.UNWATCHED_CLEAN: VerdictRule(
        "no scout records for the run; the job exited 0",
        VerdictKind.UNCHECKED,
        0.0,
        "not started under scout-srun: an unwatched run, not a clean one",
    ),
    Rule.UNWATCHED_FAILED: VerdictRule(
        "no scout records for the run; the job failed",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "scout saw none of its ranks",
    ),
    Rule.CLEAN: VerdictRule(
        "every rank exited cleanly; a state vote or replay ran",
        VerdictKind.CLEAN,
        1.0,
        "nothing found by the checks that ran (the verdict lists them)",
    ),
    Rule.UNCHECKED: VerdictRule(
        "every rank exited cleanly; no state vote or replay ran (timing alone does not count)",
        VerdictKind.UNCHECKED,
        1.0,
        "nothing was found because nothing was looked at: `unchecked`, never `clean`",
    ),
    Rule.MISSING_EXIT: VerdictRule(
        "the job failed, no rank failed, a minority of ranks left no exit record",
        VerdictKind.INFRA,
        0.7,
        "the task, its shim or its node vanished",
    ),
    Rule.FAILED_NO_RANK: VerdictRule(
        "the job failed with no rank failing (or most ranks left no record)",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "nothing names a rank",
    ),
    Rule.CASCADE_MISSING: VerdictRule(
        "every failed rank failed because of a peer; a minority left no exit record",
        VerdictKind.INFRA,
        0.7,
        "the peer they lost is the one that left nothing",
    ),
    Rule.ALL_CASCADE: VerdictRule(
        "every failed rank failed because of a peer",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "none failed on its own",
    ),
    Rule.SHARED_FAILURE: VerdictRule(
        "more than half of the ranks failed on their own",
        VerdictKind.INCONCLUSIVE,
        0.0,
        "a failure shared by most replicas (code, data or configuration), not one rank's: "
        "nothing is drained",
    ),
    Rule.CRASH_SOLE: VerdictRule(
        "one rank failed on its own (the others were cascades or clean)",
        VerdictKind.CRASH,
        0.95,
        "its exit, signal or exception; peers that died of it are not blamed",
    ),
    Rule.CRASH_FIRST: VerdictRule(
        "a minority failed on their own; one was first by progress (wall time breaks ties "
        "within a node)",
        VerdictKind.CRASH,
        0.85,
        "progress order, not wall clocks, decides who was first",
    ),
    Rule.CRASH_TIED: VerdictRule(
        "a minority failed on their own; several on different nodes tied for first",
        VerdictKind.CRASH,
        0.6,
        "each is named: clocks across nodes cannot order them",
    ),
    Rule.TAINTED: VerdictRule(
        "a rank loaded a checkpoint scout had rejected (a `tainted` finding); no rank named "
        "by the rules above",
        VerdictKind.TAINTED,
        1.0,
        "the run trained from a state scout could not vouch for: not clean, whatever its "
        "checks found after",
    ),
}


def render_rules_markdown() -> str:
    """The table above as docs/HOW-IT-WORKS.md shows it (between its verdict-rules markers)."""
    out = [
        "| order | rule | evidence | verdict | confidence | why |",
        "|---:|---|---|---|---:|---|",
    ]
    for i, (rid, r) in enumerate(RULES.items(), 1):
        kind = f"`{r.kind.value}`" if r.kind is not None else "(as above)"
        conf = f"x {r.confidence:.2f}" if r.factor else f"{r.confidence:.2f}"
        out.append(f"| {i} | `{rid.value}` | {r.evidence} | {kind} | {conf} | {r.why} |")
    return "\n".join(out) + "\n"


class _Consulted(list):
    """The rules one call of `localise` consulted, in order (for `explain` and the rule tests)."""

    def __call__(self, rule: Rule) -> VerdictRule:
        self.append(rule)
        return RULES[rule]


def is_cascade(e: ExitRecord) -> bool:
    """Did this rank fail because a peer failed (not on its own)?"""
    if e.killed_by_scout or e.external_termination:
        return True
    if e.signal in (15, 1, 2):  # SIGTERM/SIGHUP/SIGINT: asked to stop by someone
        return True
    return mentions_peer_failure(e.stderr_tail)


def is_abnormal(e: ExitRecord) -> bool:
    return e.signal != 0 or e.exit_code != 0


def failed_after_finishing(ev: JobEvidence, abnormal: Mapping[int, ExitRecord]) -> list[str]:
    """One line per failed rank when every failure came after its rank had finished the job's
    distributed work, and [] otherwise. That is: every rank left an exit record; every failed rank
    failed on its own (no cascade), its record was deactivated after it had run collectives
    (destroy_process_group() or interpreter exit) while no collective was open, and it had got at
    least as far as a rank that exited cleanly; and some rank did exit cleanly. A rank that dies in
    the middle of training leaves its peers waiting or failing, so they do not all exit cleanly."""
    if not abnormal or any(r not in ev.exits for r in range(ev.world_size)):
        return []
    clean = [
        position(p)
        for r, e in ev.exits.items()
        if 0 <= r < ev.world_size and r not in abnormal and (p := ev.last_progress(r)) is not None
    ]
    if not clean:
        return []
    floor = min(clean)
    lines = []
    for r, e in sorted(abnormal.items()):
        p = ev.last_progress(r)
        if (
            is_cascade(e)
            or p is None
            or p.bootstrap_active
            or p.coll_completed <= 0
            or p.in_collective
            or position(p) < floor
        ):
            return []
        lines.append(
            f"rank {r} on {e.node} {describe_exit(e)} after it had left distributed training "
            f"({p.coll_completed} collectives done, optimizer step {p.opt_steps}, its "
            "progress record "
            "closed by destroy_process_group() or at interpreter exit)"
        )
        lines += [f"  {ln}" for ln in e.stderr_tail[-2:]]
    return lines


def describe_exit(e: ExitRecord) -> str:
    if e.signal:
        name = CRASH_SIGNALS.get(e.signal, f"signal {e.signal}")
        return f"killed by {name}{' (core dumped)' if e.core_dumped else ''}"
    return f"exited with code {e.exit_code}"


# --- crash evidence: the kind from the strongest evidence a rank left ---------------------------
# A child exits with these codes only when scout's bootstrap ended it (the shim's own 86, 87 and 89
# are never a child's): its numbers, its restored state or its speed was judged, it did not crash.
SCOUT_ENDINGS = {
    exitcodes.SDC_CULPRIT: exitcodes.ALL[exitcodes.SDC_CULPRIT],
    exitcodes.RESUME_MISMATCH: exitcodes.ALL[exitcodes.RESUME_MISMATCH],
    exitcodes.STRAGGLER_ENDED: exitcodes.ALL[exitcodes.STRAGGLER_ENDED],
}


def own_exception(e: ExitRecord, last: ProgressSnapshot | None) -> str:
    """The exception that stopped the rank, or "": the last one its stderr showed, printed before
    anyone signalled it, not a peer's failure, and with no progress after it (its position then is
    its last one). A traceback printed and survived earlier does not count."""
    if not e.exception or e.exception_position < 0 or mentions_peer_failure((e.exception,)):
        return ""
    if last is not None and e.exception_position < position(last):
        return ""
    return e.exception


def crash_evidence(e: ExitRecord | None, last: ProgressSnapshot | None) -> list[str]:
    """Why a rank the watchdogs named counts as crashed, not hung ([] when nothing says so): it
    ended on its own with a signal or a non-zero code, or it raised and then sat idle, alive (a
    non-daemon thread holds the interpreter), until scout ended it."""
    if e is None:
        return []
    exc = own_exception(e, last)
    if is_abnormal(e) and not is_cascade(e) and e.exit_code not in SCOUT_ENDINGS:
        return [f"rank {e.rank} {describe_exit(e)}", *([f"exception: {exc}"] if exc else [])]
    if exc:
        end = "scout ended it" if e.killed_by_scout else f"it {describe_exit(e)}"
        return [
            f"rank {e.rank} raised {exc}",
            f"exception: {exc}",
            "its process stayed alive without progress after the exception until " + end,
        ]
    if (
        e.killed_by_scout
        and last is not None
        and not last.bootstrap_active
        and last.coll_completed > 0
        and not last.in_collective
    ):
        # it left training (sys.exit, an exception handled by exiting) and was still tearing down
        return [
            f"rank {e.rank} left training while its peers waited: its progress record was closed "
            f"(destroy_process_group() or interpreter exit) after {last.coll_completed} "
            "collectives",
            "its process was still ending when scout ended it",
        ]
    return []


def _step(ev: JobEvidence, rank: int) -> int:
    """The training step the rank was in, counted from the start of training (a resumed run's
    progress counts from the checkpoint's step)."""
    p = ev.last_progress(rank)
    offset = ev.places[rank].step_offset if rank in ev.places else 0
    step = p.opt_steps + 1 + offset if p is not None else -1
    # both numbers come from the job's files: a sum outside 64 bits would make the verdict
    # unwritable
    return step if 0 <= step < 2**63 else -1


def _verdict(
    ev: JobEvidence,
    kind: VerdictKind,
    suspects: list[Suspect],
    confidence: float,
    reasoning: list[str],
    *,
    now: float,
    first_at: float = 0.0,
    first_step: int = -1,
) -> Verdict:
    steps = (
        [first_step]
        if first_step >= 0
        else [_step(ev, s.rank) for s in suspects if _step(ev, s.rank) >= 0]
    )
    tainted = sorted({f.rank for f in ev.findings if f.kind is FindingKind.TAINTED})
    if tainted and kind is not VerdictKind.TAINTED:
        reasoning = [
            *reasoning,
            f"ranks {tainted} had loaded a checkpoint scout rejected (tainted)",
        ]
    found = cause.judge(
        kind,
        [(ev.exits[s.rank], _cause_exception(ev, s.rank)) for s in suspects if s.rank in ev.exits],
    )
    return Verdict(
        job_id=ev.job_id,
        restart=ev.restart,
        kind=kind,
        suspects=tuple(suspects),
        confidence=round(confidence, 3),
        reasoning=tuple(reasoning),
        first_failure_at=first_at,
        first_suspect_step=min(steps) if steps else -1,
        world_size=ev.world_size,
        created_at=now,
        coverage=ev.coverage,
        cause=found.cause,
        cause_evidence=found.evidence,
        fault_site=found.fault_site,
    )


def _cause_exception(ev: JobEvidence, rank: int) -> str:
    """The exception a cause may be read from: the rank's own (`own_exception`), or, for a rank
    that failed on its own before any progress was counted (a bug at start-up), its last one."""
    e = ev.exits[rank]
    own = own_exception(e, ev.last_progress(rank))
    if own:
        return own
    if (
        e.exception
        and is_abnormal(e)
        and not is_cascade(e)
        and not mentions_peer_failure((e.exception,))
    ):
        return e.exception
    return ""


def _clean_or_unchecked(
    ev: JobEvidence, reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict:
    """Every rank exited cleanly: `clean` says nothing was found by the checks that ran, and lists
    them; with none (votes off, a run shorter than K without its end-of-training vote) it is
    `unchecked`, never `clean` (also when only timing votes ran: they do not look at the state);
    a run that loaded a checkpoint scout rejected is `tainted`."""
    cov = ev.coverage
    if cov is not None and cov.checks_ran:
        hit = rule(Rule.CLEAN)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning + ["nothing found by the checks that ran:", *cov.lines()],
            now=now,
        )
    why = (
        "no record of scout's checks in this run"
        if cov is None
        else "no state vote or replay ran in this run (timing votes alone do not check the "
        "model's state): " + "; ".join(cov.lines())
    )
    hit = rule(Rule.UNCHECKED)
    return _verdict(
        ev,
        hit.kind,
        [],
        hit.confidence,
        reasoning + [why, "the state of the model was not checked: `unchecked`, not `clean`"],
        now=now,
    )


def _straggler_verdict(
    ev: JobEvidence, hits: list[Finding], reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict:
    ranks = sorted({f.rank for f in hits})
    rs = rule(Rule.STRAGGLER)
    suspects = [
        Suspect(
            r,
            ev.node_of(r),
            rs.kind,
            rs.confidence,
            tuple(dict.fromkeys(f.summary for f in hits if f.rank == r))[:5],
        )
        for r in ranks
    ]
    parts = sorted({f.component or FindingComponent.COMPUTE.value for f in hits})
    return _verdict(
        ev,
        rs.kind,
        suspects,
        rs.confidence,
        reasoning
        + [f"confirmed {' and '.join(parts)} straggler(s): rank(s) {', '.join(map(str, ranks))}"],
        now=now,
        first_at=min(f.at for f in hits),
    )


def localise(ev: JobEvidence, *, now: float) -> Verdict:
    """The verdict for one run's evidence (the rules it follows: `RULES`, in their order)."""
    return explain(ev, now=now)[0]


def explain(ev: JobEvidence, *, now: float) -> tuple[Verdict, tuple[Rule, ...]]:
    """The verdict and the rules of `RULES` that decided it, in the order they were consulted."""
    rule = _Consulted()
    verdict = _decide(ev, rule, now=now)
    return verdict, tuple(rule)


def _decide(ev: JobEvidence, rule: _Consulted, *, now: float) -> Verdict:
    """The evidence in order of strength: numerical findings, an agreed stall, a desync, then
    exits.
    """
    reasoning = list(ev.problems[:20])
    # confirmed stragglers (timing votes): a slow rank does not fail a job, so they decide the
    # verdict
    # only when nothing else went wrong (or when they were ended for it, policy "exit"); else they
    # are
    # said in the reasoning of whatever did go wrong
    stragglers = [
        f for f in ev.findings if f.kind == FindingKind.STRAGGLER and 0 <= f.rank < ev.world_size
    ]
    reasoning += [f.summary for f in stragglers[:10]]
    # a check that failed inside scout was switched off (bootstrap.guard): what it did not see is
    # said
    reasoning += [
        f"scout's check not run: {f.summary}"
        for f in ev.findings
        if f.kind == FindingKind.CHECK_OFF
    ][:10]
    found = (
        _from_sdc_findings(ev, reasoning, rule, now=now)
        or _from_stall_decision(ev, reasoning, rule, now=now)
        or _from_desync(ev, reasoning, rule, now=now)
        or _from_exits(ev, stragglers, reasoning, rule, now=now)
    )
    return _tainted(ev, found, rule, now=now) or found


def _tainted(ev: JobEvidence, found: Verdict, rule: _Consulted, *, now: float) -> Verdict | None:
    """A run that trained from a checkpoint scout had rejected and named nobody (clean, unchecked,
    or inconclusive: e.g. every rank's loss went non-finite from the corrupt state) is `tainted`,
    with what it found after; a rank that failed on its own keeps its verdict."""
    tainted = [f for f in ev.findings if f.kind is FindingKind.TAINTED]
    quiet = (VerdictKind.CLEAN, VerdictKind.UNCHECKED, VerdictKind.INCONCLUSIVE)
    if not tainted or found.suspects or found.kind not in quiet:
        return None
    hit = rule(Rule.TAINTED)
    first = min(tainted, key=lambda f: f.rank)
    return _verdict(
        ev,
        hit.kind,
        [],
        hit.confidence,
        [
            f"ranks {sorted({f.rank for f in tainted})} loaded a checkpoint scout had rejected",
            first.summary,
            *(f"then: {r}" for r in found.reasoning[:10]),
        ],
        now=now,
    )


def _from_sdc_findings(
    ev: JobEvidence, reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict | None:
    """1. numerical findings, written by the consensus checks as they happen."""
    hits = [f for f in ev.findings if f.kind == FindingKind.SDC and 0 <= f.rank < ev.world_size]
    if not hits:
        return None
    r_sdc = rule(Rule.SDC_VOTE)
    ranks = sorted({f.rank for f in hits})
    suspects = [
        Suspect(
            r,
            ev.node_of(r),
            r_sdc.kind,
            r_sdc.confidence,
            tuple(f.summary for f in hits if f.rank == r)[:5],
        )
        for r in ranks
    ]
    # the vote says since when the state may be wrong; else the suspect's own progress decides
    onset = [f.since_step for f in hits if f.since_step >= 0]
    return _verdict(
        ev,
        r_sdc.kind,
        suspects,
        r_sdc.confidence,
        reasoning + [f.summary for f in hits[:10]],
        now=now,
        first_at=min(f.at for f in hits),
        first_step=min(onset, default=-1),
    )


def _from_stall_decision(
    ev: JobEvidence, reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict | None:
    """2. a stall the watchdogs agreed on."""
    d = ev.decision
    if d is None:
        return None
    culprits = list(
        dict.fromkeys(r for r in d.culprits if 0 <= r < ev.world_size)
    )  # the file is the job's: no duplicates
    if not culprits:
        behind, why = behind_in_ledger(dict(ev.ledger), ev.world_size)
        if behind:
            hit = rule(Rule.STALL_LEDGER)
            suspects = [
                Suspect(r, ev.node_of(r), hit.kind, hit.confidence, (*why, *d.reasoning))
                for r in behind
            ]
            return _verdict(
                ev,
                hit.kind,
                suspects,
                hit.confidence,
                reasoning
                + [f"rank(s) {', '.join(map(str, behind))} stopped making progress first"]
                + list(why)
                + list(d.reasoning),
                now=now,
                first_at=d.at,
            )
        hit = rule(Rule.STALL_NO_CULPRIT)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning + ["the job stalled but no rank was behind the others:"] + list(d.reasoning),
            now=now,
            first_at=d.at,
        )
    suspects = []
    crashed: dict[int, list[str]] = {}
    for r in culprits:
        snap = ev.last_progress(r)
        # a culprit whose exit or stderr says it crashed is a crash, however its peers waited
        crash = crash_evidence(ev.exits.get(r), snap) if d.kind != FindingKind.DESYNC else []
        if crash:
            crashed[r] = crash
            rc = rule(Rule.STALL_CRASHED)
            suspects.append(
                Suspect(r, ev.node_of(r), rc.kind, rc.confidence, tuple(crash + list(d.reasoning)))
            )
            continue
        lines = list(d.reasoning)
        if snap is not None and snap.child_state in (ChildState.STOPPED, ChildState.DISK_SLEEP):
            rh = rule(Rule.STALL_STOPPED)
            lines.append(f"rank {r}'s process was {snap.child_state.value}")
        else:
            rh = rule(Rule.STALL_BEHIND)
        if d.kind == FindingKind.DESYNC:
            lines.append("its sequence of collectives differs from the majority's (desync)")
        suspects.append(Suspect(r, ev.node_of(r), rh.kind, rh.confidence, tuple(lines)))
    share = len(culprits) / max(ev.world_size, 1)
    conf = min(s.confidence for s in suspects) * (
        1.0 if share <= 0.25 else rule(Rule.STALL_WIDE).confidence
    )
    what = "desync" if d.kind == FindingKind.DESYNC else "stopped making progress first"
    if d.phase == "startup" and d.kind != FindingKind.DESYNC:
        what = (
            "hung at start-up (startup hang: before the first training step, past the start-up "
            "limit)"
        )
    said = [f"rank(s) {', '.join(map(str, culprits))} {what}"]
    if crashed:  # the kind is crash only when every culprit crashed; a hung one keeps it a hang
        said += [f"{lines[0]} (crash, not a hang)" for lines in crashed.values()]
    kind = (
        RULES[Rule.STALL_CRASHED].kind
        if len(crashed) == len(culprits)
        else RULES[Rule.STALL_BEHIND].kind
    )
    ended = [
        ev.exits[r].at for r in crashed if is_abnormal(ev.exits[r]) and not is_cascade(ev.exits[r])
    ]
    return _verdict(
        ev,
        kind,
        suspects,
        conf,
        reasoning + said + list(d.reasoning),
        now=now,
        first_at=min([d.at, *ended]),
    )


def _from_desync(
    ev: JobEvidence, reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict | None:
    """3. a desync: one rank's sequence of collectives left the majority's (gloo may then abort a
    peer, so this comes before blaming whoever died first)."""
    rings = {r: p.recent for r in range(ev.world_size) if (p := ev.last_progress(r)) is not None}
    if len(rings) != ev.world_size:
        return None
    desync, why = find_desync(rings)
    if not desync or len(desync) * 2 >= ev.world_size:
        return None
    rd = rule(Rule.DESYNC)
    suspects = [
        Suspect(
            r,
            ev.node_of(r),
            rd.kind,
            rd.confidence,
            (why, "its sequence of collectives differs from the majority's (desync)"),
        )
        for r in desync
    ]
    failed_at = [e.at for e in ev.exits.values() if is_abnormal(e)]
    return _verdict(
        ev,
        rd.kind,
        suspects,
        rd.confidence,
        reasoning
        + [
            f"desync: rank(s) {', '.join(map(str, desync))} ran a different collective "
            "than the others",
            why,
        ],
        now=now,
        first_at=min(failed_at, default=0.0),
    )


def _from_exits(
    ev: JobEvidence,
    stragglers: list[Finding],
    reasoning: list[str],
    rule: _Consulted,
    *,
    now: float,
) -> Verdict:
    """4. exits: who failed on their own (not as a cascade of a peer's failure), and who first."""
    abnormal = {r: e for r, e in ev.exits.items() if 0 <= r < ev.world_size and is_abnormal(e)}
    primaries = {r: e for r, e in abnormal.items() if not is_cascade(e)}
    cascades = sorted(set(abnormal) - set(primaries))
    after = failed_after_finishing(ev, abnormal)
    if after and stragglers:
        return _straggler_verdict(ev, stragglers, reasoning + after, rule, now=now)
    if after:
        hit = rule(Rule.FAILED_AT_EXIT)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning
            + after
            + [
                "every rank finished the job's collectives and the others exited cleanly: a "
                "failure at exit "
                "(for example a communicator torn down at interpreter shutdown) says nothing "
                "about a node; "
                "nobody is drained and the job, whose training had finished, is not requeued"
            ],
            now=now,
            first_at=min(e.at for e in abnormal.values()),
        )
    if stragglers and (
        not abnormal
        or (primaries and all(e.exit_code == STRAGGLER_ENDED for e in primaries.values()))
    ):
        return _straggler_verdict(ev, stragglers, reasoning, rule, now=now)
    if not abnormal:
        return _no_rank_failed(ev, reasoning, rule, now=now)
    if not primaries:
        missing = [r for r in range(ev.world_size) if r not in ev.exits]
        if missing and len(missing) * 2 < ev.world_size:
            ri = rule(Rule.CASCADE_MISSING)
            suspects = [
                Suspect(
                    r,
                    ev.node_of(r),
                    ri.kind,
                    ri.confidence,
                    ("no exit record while every other rank failed because of a peer",),
                )
                for r in missing
            ]
            return _verdict(
                ev,
                ri.kind,
                suspects,
                ri.confidence,
                reasoning
                + [f"ranks {cascades} failed because of a peer; rank(s) {missing} left no record"],
                now=now,
            )
        hit = rule(Rule.ALL_CASCADE)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning
            + [f"every failed rank ({cascades}) reports a peer failure; none failed on its own"],
            now=now,
        )
    if len(primaries) * 2 > ev.world_size:
        counted = Counter(describe_exit(e) for e in primaries.values())
        # most common first, then by name: the same words whichever order the records were read in
        kinds = dict(sorted(counted.items(), key=lambda kv: (-kv[1], kv[0])))
        hit = rule(Rule.SHARED_FAILURE)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning
            + [
                f"{len(primaries)} of {ev.world_size} ranks failed on their own ({kinds}): a "
                "failure shared "
                "by most replicas (code, data or configuration), not one rank's"
            ],
            now=now,
        )
    return _first_crash(ev, primaries, cascades, reasoning, rule, now=now)


def _no_rank_failed(
    ev: JobEvidence, reasoning: list[str], rule: _Consulted, *, now: float
) -> Verdict:
    """No rank exited abnormally: clean (or unchecked), no majority, unwatched, or ranks that
    vanished.
    """
    missing = [r for r in range(ev.world_size) if r not in ev.exits]
    # replicas that disagreed with no strict majority (e.g. two HSDP replicas): nobody is named, but
    # the run is not clean either
    unsure = [f for f in ev.findings if is_no_majority(f)]
    if ev.job_exit_code in (0, -1) and not missing and unsure:
        hit = rule(Rule.NO_MAJORITY)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning + [f.summary for f in unsure[:10]],
            now=now,
            first_at=min(f.at for f in unsure),
        )
    if not ev.places and not ev.exits and not ev.snapshots:
        # nothing of scout's in this run: not a clean run, an unwatched one
        no_records = "no scout records for this run (not started under scout-srun?)"
        if ev.job_exit_code == 0:
            hit = rule(Rule.UNWATCHED_CLEAN)
            return _verdict(ev, hit.kind, [], hit.confidence, reasoning + [no_records], now=now)
        hit = rule(Rule.UNWATCHED_FAILED)
        return _verdict(
            ev,
            hit.kind,
            [],
            hit.confidence,
            reasoning
            + [
                no_records,
                f"the job failed (raw status {ev.job_exit_code}) and scout saw none of its ranks",
            ],
            now=now,
        )
    if ev.job_exit_code in (0, -1) and not missing:
        return _clean_or_unchecked(ev, reasoning + ["every rank exited cleanly"], rule, now=now)
    if missing and len(missing) * 2 < ev.world_size:
        ri = rule(Rule.MISSING_EXIT)
        suspects = [
            Suspect(
                r,
                ev.node_of(r),
                ri.kind,
                ri.confidence,
                ("no exit record: the task, its shim or its node vanished",),
            )
            for r in missing
        ]
        return _verdict(
            ev,
            ri.kind,
            suspects,
            ri.confidence,
            reasoning + [f"rank(s) {missing} left no exit record while the job failed"],
            now=now,
        )
    hit = rule(Rule.FAILED_NO_RANK)
    return _verdict(
        ev,
        hit.kind,
        [],
        hit.confidence,
        reasoning + [f"the job failed (raw status {ev.job_exit_code}) with no rank failing"],
        now=now,
    )


def _first_crash(
    ev: JobEvidence,
    primaries: dict[int, ExitRecord],
    cascades: list[int],
    reasoning: list[str],
    rule: _Consulted,
    *,
    now: float,
) -> Verdict:
    """A minority of ranks failed on their own: the one(s) least advanced, wall clocks deciding
    only among ranks of one node."""

    def order(r: int) -> tuple[int, str, float]:
        p = ev.last_progress(r)
        return (position(p) if p is not None else 0, primaries[r].node, primaries[r].at)

    ranked = sorted(primaries, key=order)
    first_pos = order(ranked[0])[0]
    tied = [r for r in ranked if order(r)[0] == first_pos]
    # wall clocks decide only within a node: keep the earliest of each node among the tied
    per_node: dict[str, int] = {}
    for r in tied:
        node = primaries[r].node
        if node not in per_node or primaries[r].at < primaries[per_node[node]].at:
            per_node[node] = r
    first = sorted(per_node.values())
    rc = rule(
        Rule.CRASH_SOLE
        if len(primaries) == 1
        else Rule.CRASH_FIRST
        if len(first) == 1
        else Rule.CRASH_TIED
    )
    confidence = rc.confidence
    suspects = []
    for r in first:
        e = primaries[r]
        p = ev.last_progress(r)
        lines = [f"rank {r} {describe_exit(e)}"]
        if e.exception:  # the traceback's last line, not whatever stderr said last (a warning)
            lines.append(f"exception: {e.exception}")
        if p is not None:
            lines.append(
                f"at progress {position(p)} ({p.coll_completed} collectives done, optimizer "
                f"step {p.opt_steps})"
            )
        lines += [ln for ln in e.stderr_tail[-3:]]
        suspects.append(Suspect(r, e.node, rc.kind, confidence, tuple(lines)))
    others = [r for r in ranked if r not in first]
    lines = [
        f"rank {r} on {primaries[r].node} {describe_exit(primaries[r])} on its own"
        + (f" ({primaries[r].exception})" if primaries[r].exception else "")
        for r in first
    ]
    if others:
        lines.append(f"also failed on their own, later in progress: ranks {others}")
    if cascades:
        lines.append(f"ranks {cascades} failed because a peer died (cascade; not blamed)")
    return _verdict(
        ev,
        rc.kind,
        suspects,
        confidence,
        reasoning + lines,
        now=now,
        first_at=min(primaries[r].at for r in first),
    )
