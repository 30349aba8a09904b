"""Judging the acceptance steps (pure): typed results of the jobs in, one StepResult per step out.

Nothing here reaches outside: the rim (`acceptance/run.py`) fills the records below from the
jobs and the evidence folder. A step whose evidence is missing fails and says which evidence;
a step the cluster cannot carry out is SKIPPED with the reason; never a pass without a figure.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from scout_slurm.evidence.records import ResumeOutcome, VerdictKind, resume_outcome


class Status(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIPPED = "SKIPPED"


@dataclass(frozen=True)
class StepResult:
    step: str  # "1", "3a", ...
    title: str
    status: Status
    figures: str = ""  # what was measured, one line
    detail: str = ""  # why it passed, failed or was skipped
    schema_version: int = 1


@dataclass(frozen=True)
class IncidentFiles:
    """What the evidence folder of one job kept: files and bytes, and the largest few by name."""

    files: int
    bytes: int
    largest: tuple[tuple[str, int], ...] = ()
    schema_version: int = 1


@dataclass(frozen=True)
class CaseRun:
    """One job of the acceptance test, as the rim saw it. `fault` "" is a clean run; expected_*
    say what a right verdict names. Times are wall clock (0: not recorded)."""

    name: str  # "clean", "stall", "slowdown", "numerical", "stall under load", ...
    fault: str  # the --scout-inject spec, "" for a clean run
    expected_kind: str  # a VerdictKind value
    expected_rank: int | None  # None: nobody should be named
    job_id: int = 0
    final_state: str = ""  # the job's Slurm state at the end
    world_size: int = 0
    rank_nodes: tuple[tuple[int, str], ...] = ()  # (rank, node) from the rank place records
    injected_at: float = 0.0  # the injection record of the bootstrap
    detected_at: float = 0.0  # the first stall decision or finding that named someone
    verdict_at: float = 0.0  # the verdict of the run with the fault
    verdict_kind: str = ""
    named: tuple[tuple[int, str], ...] = ()  # (rank, node) of the verdict's suspects
    component: str = ""  # SDC: weights / optimizer / compute
    group: tuple[int, ...] = ()  # a pair or group named instead of one rank (inconclusive replay)
    incident: IncidentFiles | None = None
    under_load: bool = False
    error: str = ""  # the rim could not run or read it: says what
    expected_on_node: str = (
        ""  # a node-level fault (a slow link): every rank placed there is expected
    )
    schema_version: int = 1

    @property
    def is_clean(self) -> bool:
        return not self.fault

    @property
    def expected_node(self) -> str:
        if self.expected_on_node:
            return self.expected_on_node
        return (
            dict(self.rank_nodes).get(self.expected_rank, "")
            if self.expected_rank is not None
            else ""
        )

    @property
    def expected_named(self) -> list[tuple[int, str]]:
        """The (rank, node) pairs a right verdict names."""
        if self.expected_on_node:
            return sorted((r, n) for r, n in self.rank_nodes if n == self.expected_on_node)
        return [(self.expected_rank, self.expected_node)] if self.expected_rank is not None else []

    @property
    def detection_s(self) -> float | None:
        if self.injected_at <= 0 or self.detected_at <= 0:
            return None
        return max(0.0, self.detected_at - self.injected_at)

    @property
    def localisation_s(self) -> float | None:
        if self.injected_at <= 0 or self.verdict_at <= 0:
            return None
        return max(0.0, self.verdict_at - self.injected_at)


@dataclass(frozen=True)
class MapResult:
    """`scout map JOB --json`, queried after the job ended."""

    job_id: int
    world_size: int
    job_finished: bool  # the map was queried after the job left the queue
    ranks: tuple[tuple[int, str, str, tuple[str, ...]], ...] = ()  # (rank, node, nic, gpu uuids)
    problems: tuple[str, ...] = ()
    error: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class CheckpointRow:
    run: int
    step: int
    status: str  # eligible / candidate / rejected
    reason: str
    schema_version: int = 1


@dataclass(frozen=True)
class CheckpointResult:
    """`scout checkpoints JOB --json` of the numerical case, and the step of the fault."""

    job_id: int
    fault_step: int
    first_suspect_step: int
    rows: tuple[CheckpointRow, ...] = ()
    recovery_point: str = ""
    recovery_step: int = -1
    rule: str = ""
    error: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class ResumeResult:
    """The rerun after the numerical case against an uninterrupted run of the same job."""

    job_id: int
    restarts: int
    final_state: str
    resumed_from: str  # the file the rerun said it resumed from ("" if none)
    recovery_point: str  # the file the recovery rule chose
    final_digest: str  # model, optimizer, scheduler and RNG digest of the rerun
    reference_digest: str  # the same of the uninterrupted run
    compared: tuple[str, ...] = ()  # what the digests cover
    resume_check: tuple[
        str, ...
    ] = ()  # scout's own check of the restored state (summaries), if any
    error: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class LoadResult:
    """What the background load generators did while the reduced set ran."""

    seconds: float
    tcp_bytes: int
    disk_bytes: int
    disk_path: str
    pids: tuple[int, ...] = ()
    stopped: bool = True  # every generator was stopped and reaped
    error: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class Workload:
    """The training the steps ran: the built-in job (`command` "") or the buyer's `--train`
    command, and what its runs showed it offers. A step judges a buyer's workload by these facts:
    what it cannot show with it is SKIPPED with the reason, never passed."""

    command: str = ""  # the buyer's training command; "": the built-in job
    steps: int = -1  # the last optimizer step the clean run completed (-1: not recorded)
    replicas: int = 0  # the largest replica group the state votes compared (1: none; 0: unknown)
    checkpoints: int = 0  # checkpoint records of the numerical case's first run
    schema_version: int = 1

    @property
    def is_builtin(self) -> bool:
        return not self.command


def workload_cannot(w: Workload, *, at_step: int, needs_steps: int = 0, votes: bool = False) -> str:
    """Why this workload cannot show a fault injected at `at_step` whose detection needs training
    to reach `needs_steps` ("" if nothing stands in the way): training that ends before that, or
    (numerical faults, found by the state votes) no replicas to compare, or two, where one
    against one names nobody."""
    need = max(at_step, needs_steps)
    if w.steps >= 0 and w.steps < need:
        return (
            f"the workload's training ended at step {w.steps}; this fault is injected at step "
            f"{at_step} and needs training to reach step {need} to be seen (train longer)"
        )
    if votes and w.replicas == 1:
        return (
            "the workload has no replicas to vote: every rank holds a state of its own (world "
            "size 1 per replica group), so a numerical fault has nothing to be compared with"
        )
    if votes and w.replicas == 2:
        return (
            "the workload's replica groups hold two ranks: one against one is no majority, so "
            "the state vote cannot name the rank (run >= 3 replicas)"
        )
    return ""


# -- formatting ----------------------------------------------------------------------------


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} s"


def fmt_bytes(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def naming(case: CaseRun) -> str:
    """What the verdict named, in the buyer's words: a rank (and its node), a node, a group, a
    component.
    """
    if case.error and not case.verdict_kind:
        return "nothing (no verdict)"
    parts = []
    if case.named:
        parts.append(", ".join(f"rank {r} on node {n}" for r, n in case.named))
    if case.group:
        parts.append("communication group of ranks " + ",".join(str(r) for r in case.group))
    if case.component:
        parts.append(f"component {case.component}")
    what = "; ".join(parts) or "nobody"
    return f"{case.verdict_kind or '?'}: {what}"


def is_right(case: CaseRun) -> tuple[bool, str]:
    """Whether the verdict named exactly what was injected (kind, rank, node), or nobody for a
    clean run.
    """
    if case.error:
        return False, case.error
    if not case.verdict_kind:
        return False, f"job {case.job_id}: no verdict was written"
    if case.is_clean:
        if case.named or case.group or case.verdict_kind != VerdictKind.CLEAN.value:
            return False, f"a clean run was called {naming(case)}"
        return True, "clean run named nobody"
    if case.verdict_kind != case.expected_kind:
        return False, f"expected {case.expected_kind}, verdict said {case.verdict_kind}"
    want = case.expected_named
    if not want or not case.expected_node:
        return False, (
            f"no rank was placed on node {case.expected_on_node}"
            if case.expected_on_node
            else f"no place record for rank {case.expected_rank}: cannot tell its node"
        )
    said = ", ".join(f"rank {r} on {n}" for r, n in want)
    if sorted(case.named) != want:
        return False, f"expected {said}, verdict named {naming(case)}"
    return True, f"{said}, {case.expected_kind}"


# -- the steps -----------------------------------------------------------------------------


def judge_training(
    clean: CaseRun | None, *, min_nodes: int = 2, expected_world: int = 0
) -> StepResult:
    title = f"training job across >= {min_nodes} nodes completes"
    if clean is None:
        return StepResult("1", title, Status.FAIL, detail="no clean training job was run")
    if clean.error:
        return StepResult("1", title, Status.FAIL, detail=clean.error)
    nodes = sorted({n for _, n in clean.rank_nodes})
    figures = (
        f"job {clean.job_id}: {clean.final_state or '?'}, {len(clean.rank_nodes)} ranks on "
        f"{len(nodes)} nodes ({','.join(nodes) or '-'})"
    )
    if clean.final_state != "COMPLETED":
        return StepResult(
            "1",
            title,
            Status.FAIL,
            figures,
            f"the job ended {clean.final_state or 'unknown'}, not COMPLETED",
        )
    if len(nodes) < min_nodes:
        return StepResult(
            "1",
            title,
            Status.FAIL,
            figures,
            f"ranks ran on {len(nodes)} node(s), fewer than {min_nodes}",
        )
    if expected_world and (
        clean.world_size != expected_world or len(clean.rank_nodes) != expected_world
    ):
        return StepResult(
            "1",
            title,
            Status.FAIL,
            figures,
            f"expected {expected_world} ranks, the job recorded {len(clean.rank_nodes)} "
            f"(world size {clean.world_size})",
        )
    return StepResult(
        "1", title, Status.PASS, figures, "every rank recorded its place; the job completed"
    )


def judge_map(m: MapResult | None) -> StepResult:
    title = "rank -> node -> GPU -> NIC map recorded, queried after the job ended"
    if m is None:
        return StepResult("2", title, Status.FAIL, detail="the map was not queried")
    if m.error:
        return StepResult(
            "2", title, Status.FAIL, detail=f"`scout map {m.job_id} --json`: {m.error}"
        )
    ranks = {r for r, *_ in m.ranks}
    gpus = sorted({g for *_, gs in m.ranks for g in gs})
    nics = sorted({nic for _, _, nic, _ in m.ranks if nic})
    figures = (
        f"job {m.job_id}: {len(ranks)} of {m.world_size} ranks, nodes "
        f"{','.join(sorted({n for _, n, _, _ in m.ranks}))}, NICs {','.join(nics) or '-'}, "
        f"GPUs {len(gpus) if gpus else 'none (CPU job)'}"
    )
    if not m.job_finished:
        return StepResult(
            "2", title, Status.FAIL, figures, "the job had not ended when the map was queried"
        )
    missing = sorted(set(range(m.world_size)) - ranks)
    if m.world_size <= 0 or missing:
        return StepResult(
            "2", title, Status.FAIL, figures, f"ranks missing from the map: {missing or 'all'}"
        )
    no_node = [r for r, n, _, _ in m.ranks if not n]
    no_nic = [r for r, _, nic, _ in m.ranks if not nic]
    if no_node or no_nic:
        return StepResult(
            "2",
            title,
            Status.FAIL,
            figures,
            f"ranks without a node: {no_node}; without a NIC: {no_nic}",
        )
    note = "; problems noted: " + "; ".join(m.problems[:3]) if m.problems else ""
    return StepResult("2", title, Status.PASS, figures, "every rank has its node and NIC" + note)


def judge_injection(
    step: str, title: str, case: CaseRun | None, *, skip_reason: str = "", cannot: str = ""
) -> StepResult:
    """One injected fault: it fired (the bootstrap recorded it) and a verdict followed. `cannot`:
    why the workload cannot show this fault (workload_cannot); it turns a fault that never fired,
    or a verdict that is not right, into SKIPPED with that reason."""
    if skip_reason:
        return StepResult(step, title, Status.SKIPPED, detail=skip_reason)
    if case is None:
        return StepResult(step, title, Status.FAIL, detail="this fault was not run")
    if case.error:
        return StepResult(step, title, Status.FAIL, detail=case.error)
    figures = f"job {case.job_id}: {case.fault}"
    if case.injected_at <= 0:
        if cannot:
            return StepResult(step, title, Status.SKIPPED, figures, cannot)
        return StepResult(
            step, title, Status.FAIL, figures, "no injection record: the fault never fired"
        )
    if not case.verdict_kind:
        return StepResult(
            step, title, Status.FAIL, figures, "the fault fired but no verdict was written"
        )
    if cannot and not is_right(case)[0]:
        return StepResult(
            step, title, Status.SKIPPED, figures, f"fired; verdict {naming(case)}; {cannot}"
        )
    return StepResult(step, title, Status.PASS, figures, f"fired; verdict {case.verdict_kind}")


def judge_measurements(
    injected: Sequence[CaseRun], clean: Sequence[CaseRun], *, not_shown: Sequence[str] = ()
) -> StepResult:
    """`injected`: the faults step 3 showed; `not_shown`: those the workload could not (step 3
    said why), named in the figures."""
    title = "time to detection and localisation, false positives, what the incident kept"
    if not injected and not_shown:
        return StepResult(
            "4",
            title,
            Status.SKIPPED,
            detail="no injected fault could be shown with this workload (step 3 says why): "
            + ", ".join(not_shown),
        )
    parts, problems = [], []
    for c in injected:
        kept = (
            f"{c.incident.files} files, {fmt_bytes(c.incident.bytes)}"
            if c.incident
            else "nothing read"
        )
        parts.append(
            f"{c.name}: detect {fmt_s(c.detection_s)}, verdict {fmt_s(c.localisation_s)}, "
            f"kept {kept}"
        )
        if c.detection_s is None:
            problems.append(f"{c.name}: no detection time (injection or detection record missing)")
        if c.localisation_s is None:
            problems.append(f"{c.name}: no localisation time (injection record or verdict missing)")
        if c.incident is None or c.incident.files == 0:
            problems.append(f"{c.name}: the incident record kept no files")
    false_pos = [c for c in clean if not is_right(c)[0]]
    parts.append(f"false positives: {len(false_pos)} of {len(clean)} clean runs")
    if not_shown:
        parts.append("not shown with this workload: " + ", ".join(not_shown))
    figures = "; ".join(parts)
    if not injected:
        problems.append("no injected case to measure")
    if not clean:
        problems.append("no clean run: false positives unmeasured")
    for c in false_pos:
        problems.append(f"{c.name} (job {c.job_id}): {is_right(c)[1]}")
    if problems:
        return StepResult("4", title, Status.FAIL, figures, "; ".join(problems))
    return StepResult(
        "4", title, Status.PASS, figures, "every case measured; clean runs named nobody"
    )


def judge_naming(injected: Sequence[CaseRun], *, not_shown: Sequence[str] = ()) -> StepResult:
    title = "each fault named as a rank, node, group or component, and right"
    if not injected and not_shown:
        return StepResult(
            "5",
            title,
            Status.SKIPPED,
            detail="no injected fault could be shown with this workload (step 3 says why): "
            + ", ".join(not_shown),
        )
    if not injected:
        return StepResult("5", title, Status.FAIL, detail="no injected case")
    lines, wrong = [], []
    for c in injected:
        ok, why = is_right(c)
        lines.append(f"{c.name}: {naming(c)} ({'right' if ok else 'WRONG'})")
        if not ok:
            wrong.append(f"{c.name}: {why}")
    if not_shown:
        lines.append("not shown with this workload: " + ", ".join(not_shown))
    status = Status.FAIL if wrong else Status.PASS
    return StepResult(
        "5", title, status, "; ".join(lines), "; ".join(wrong) or "every fault named right"
    )


def judge_checkpoints(
    ck: CheckpointResult | None, workload: Workload = Workload(), *, cannot: str = ""
) -> StepResult:
    """`cannot`: why the workload could not show the numerical fault these checkpoints are
    placed around ("": it did). A buyer's workload that saves nothing scout saw, or nothing
    before or after the fault, is SKIPPED with that reason; the built-in job always saves."""
    title = "checkpoints before and after the event; the rule that chose the recovery point"
    if cannot:
        return StepResult(
            "6",
            title,
            Status.SKIPPED,
            detail=f"the numerical fault could not be shown with this workload ({cannot}): no "
            "event to place checkpoints around",
        )
    if ck is None:
        return StepResult("6", title, Status.FAIL, detail="no checkpoint listing")
    first_run = [r for r in ck.rows if r.run == 0]
    if not workload.is_builtin and not first_run and not ck.error and not workload.checkpoints:
        return StepResult("6", title, Status.SKIPPED, detail=never_saved(ck.fault_step))
    if ck.error:
        return StepResult("6", title, Status.FAIL, detail=ck.error)
    before = [r for r in first_run if r.step < ck.fault_step]
    after = [r for r in first_run if r.step >= ck.fault_step]
    figures = (
        f"job {ck.job_id}: fault at step {ck.fault_step}, first suspect step "
        f"{ck.first_suspect_step}; "
        + ", ".join(f"step {r.step} {r.status}" for r in sorted(first_run, key=lambda r: r.step))
        + f"; recovery point step {ck.recovery_step if ck.recovery_step >= 0 else '?'}"
    )
    if not workload.is_builtin and (not before or not after):
        return StepResult(
            "6",
            title,
            Status.SKIPPED,
            figures,
            "the workload saved no checkpoint "
            + ("before" if not before else "after")
            + f" the fault at step {ck.fault_step} (it saves at steps "
            + ",".join(str(r.step) for r in sorted(first_run, key=lambda r: r.step))
            + "): "
            + ("nothing to recover to" if not before else "nothing for the rule to reject"),
        )
    problems = []
    if not before:
        problems.append("no checkpoint before the fault")
    if not after:
        problems.append("no checkpoint after the fault")
    bad = [r for r in after if r.step >= ck.first_suspect_step and r.status == "eligible"]
    if bad:
        problems.append(
            f"checkpoints after the first suspect step are eligible: {[r.step for r in bad]}"
        )
    if ck.first_suspect_step < 0:
        problems.append("the verdict gave no first suspect step")
    if not ck.rule:
        problems.append("no rule was shown")
    if ck.recovery_step < 0:
        problems.append("no recovery point was chosen")
    elif ck.first_suspect_step >= 0 and ck.recovery_step >= ck.first_suspect_step:
        problems.append(
            f"recovery point step {ck.recovery_step} is not before the first suspect step"
        )
    elif ck.recovery_step >= ck.fault_step:
        problems.append(
            f"recovery point step {ck.recovery_step} holds the fault (injected at step "
            f"{ck.fault_step})"
        )
    if problems:
        return StepResult("6", title, Status.FAIL, figures, "; ".join(problems))
    return StepResult("6", title, Status.PASS, figures, f"rule: {ck.rule}")


def never_saved(fault_step: int) -> str:
    return (
        "the workload saved no checkpoint scout saw (torch.save, torch.distributed.checkpoint or "
        f"scout_slurm.checkpoint.note) in its first run, which the fault hit at step {fault_step}"
    )


NOT_LOADED = "did not load the resume checkpoint"  # bootstrap/ckptstate.py, the rerun's finding


def judge_resume(
    r: ResumeResult | None, workload: Workload = Workload(), *, cannot: str = ""
) -> StepResult:
    """The built-in job: its final state digest against an uninterrupted run's. A buyer's
    workload: the rerun loaded the checkpoint scout chose (SCOUT_RESUME_CHECKPOINT) and scout's
    own check of the restored state verified it; a workload that ignores the variable is SKIPPED
    and says so. `cannot`: why the workload gave no checkpoint to resume from (step 6)."""
    if not workload.is_builtin:
        return _judge_resume_workload(r, cannot)
    title = (
        "resume; model, optimizer, scheduler and RNG state equal the expected record (bit for bit)"
    )
    if (early := _resume_not_run(r, cannot, title)) is not None:
        return early
    figures = (
        f"job {r.job_id}: {r.restarts} restart(s), {r.final_state}; resumed from "
        f"{r.resumed_from or '-'}; "
        f"compared {', '.join(r.compared) or '-'}"
    )
    problems = _rerun_problems(r)
    if not r.resumed_from:
        problems.append("the rerun did not say which checkpoint it resumed from")
    elif r.recovery_point and r.resumed_from != r.recovery_point:
        problems.append(f"resumed from {r.resumed_from}, the rule chose {r.recovery_point}")
    if not r.final_digest or not r.reference_digest:
        problems.append("a final state digest is missing (rerun or uninterrupted reference)")
    elif r.final_digest != r.reference_digest:
        problems.append("the resumed run's final state differs from the uninterrupted run's")
    mismatch = [s for s in r.resume_check if resume_outcome(s) is ResumeOutcome.MISMATCH]
    if mismatch:
        problems.append("scout's restored-state check: " + "; ".join(mismatch))
    verified = [s for s in r.resume_check if resume_outcome(s) is ResumeOutcome.VERIFIED]
    check = (
        f"; scout's own restored-state check: {len(verified)} of {len(r.resume_check)} rank "
        "records say "
        f"resume verified ({r.resume_check[0]})"
        if r.resume_check
        else "; scout's own restored-state check: none recorded"
    )
    if problems:
        return StepResult("7", title, Status.FAIL, figures, "; ".join(problems) + check)
    return StepResult(
        "7",
        title,
        Status.PASS,
        figures,
        "the final state digest equals the uninterrupted run's" + check,
    )


def _differing(digest: str, reference: str) -> list[str]:
    """The components two `step S: component signature, ...` digests disagree on."""

    def parts(d: str) -> dict[str, str]:
        body = d.split(": ", 1)[-1]
        return dict(p.split(" ", 1) for p in body.split(", ") if " " in p)

    if digest == reference:
        return []
    mine, theirs = parts(digest), parts(reference)
    return sorted(c for c in mine.keys() | theirs.keys() if mine.get(c) != theirs.get(c)) or [
        "the step"
    ]


def _resume_not_run(r: ResumeResult | None, cannot: str, title: str) -> StepResult | None:
    """Step 7 when there was nothing to resume from, no rerun or a failed one; else None."""
    if cannot:
        return StepResult("7", title, Status.SKIPPED, detail=f"nothing to resume from: {cannot}")
    if r is None:
        return StepResult("7", title, Status.FAIL, detail="no resumed run")
    if r.error:
        return StepResult("7", title, Status.FAIL, detail=r.error)
    return None


def _rerun_problems(r: ResumeResult) -> list[str]:
    """What is wrong with the requeued run itself (its end, whether it was requeued at all)."""
    problems = []
    if r.final_state != "COMPLETED":
        problems.append(f"the resumed run ended {r.final_state or 'unknown'}")
    if r.restarts < 1:
        problems.append("the job was not requeued")
    return problems


def _judge_resume_workload(r: ResumeResult | None, cannot: str) -> StepResult:
    title = "resume from scout's checkpoint; the restored state equals its record (bit for bit)"
    if (early := _resume_not_run(r, cannot, title)) is not None:
        return early
    verified = [s for s in r.resume_check if resume_outcome(s) is ResumeOutcome.VERIFIED]
    mismatch = [s for s in r.resume_check if resume_outcome(s) is ResumeOutcome.MISMATCH]
    ignored = [s for s in r.resume_check if NOT_LOADED in s]
    figures = (
        f"job {r.job_id}: {r.restarts} restart(s), {r.final_state}; scout chose "
        f"{r.recovery_point or '-'}; the rerun restored {r.resumed_from or '-'}; "
        f"{len(verified)} of {len(r.resume_check)} rank records say resume verified"
    )
    problems = _rerun_problems(r)
    if r.restarts >= 1 and not r.recovery_point:
        problems.append("scout gave the rerun no checkpoint (no resume instruction)")
    if mismatch:
        problems.append("scout's restored-state check: " + "; ".join(mismatch))
    if problems:
        return StepResult("7", title, Status.FAIL, figures, "; ".join(problems))
    if ignored and not verified:
        return StepResult(
            "7",
            title,
            Status.SKIPPED,
            figures,
            f"the workload ignores SCOUT_RESUME_CHECKPOINT: the rerun did not load "
            f"{r.recovery_point} ({ignored[0]}); a script that loads it when set resumes where "
            "scout chose (docs/USERS.md)",
        )
    if not verified:
        return StepResult(
            "7",
            title,
            Status.FAIL,
            figures,
            "no rank of the rerun recorded a verified restored state"
            + (f": {r.resume_check[0]}" if r.resume_check else ""),
        )
    if r.resumed_from != r.recovery_point:
        return StepResult(
            "7",
            title,
            Status.FAIL,
            figures,
            f"the rerun restored {r.resumed_from}, scout chose {r.recovery_point}",
        )
    # the workload's own determinism decides whether its end state matches an uninterrupted
    # run's (a script that restores no data position or RNG differs): a figure, not a condition
    final = "the end state was not compared with an uninterrupted run's"
    if r.final_digest and r.reference_digest:
        differ = _differing(r.final_digest, r.reference_digest)
        final = (
            f"the rerun's last checkpoint record {'DIFFERS from' if differ else 'equals'} the "
            f"clean run's at the same step ({', '.join(r.compared) or '-'})"
            + (
                f" in {', '.join(differ)}: the workload's own resume is not bit-exact (e.g. a "
                "data loader that restarts its epoch)"
                if differ
                else ""
            )
        )
    elif r.compared:
        final += f" ({r.compared[0]})"
    return StepResult(
        "7",
        title,
        Status.PASS,
        figures,
        f"scout's restored-state check: {verified[0]}; {final}",
    )


def judge_under_load(
    load: LoadResult | None, cases: Sequence[CaseRun], *, cannot: str = ""
) -> StepResult:
    """`cannot`: why the workload cannot show the fault repeated under load (as step 3a)."""
    title = "repeated (reduced set) under network and storage load"
    if load is None:
        return StepResult("8", title, Status.FAIL, detail="no load was started")
    rate = (
        (lambda n: f"{n / load.seconds / (1 << 20):.0f} MiB/s")
        if load.seconds > 0
        else (lambda n: "-")
    )
    figures = (
        f"loopback TCP {fmt_bytes(load.tcp_bytes)} ({rate(load.tcp_bytes)}), disk "
        f"{fmt_bytes(load.disk_bytes)} ({rate(load.disk_bytes)}) in {load.seconds:.0f} s; "
        + "; ".join(
            f"{c.name}: {naming(c)}, detect {fmt_s(c.detection_s)}, verdict "
            f"{fmt_s(c.localisation_s)}"
            for c in cases
        )
    )
    unshown = [c for c in cases if c.fault and (c.injected_at <= 0 or not is_right(c)[0])]
    if cannot and unshown and not any(c.error for c in unshown):
        return StepResult("8", title, Status.SKIPPED, figures, f"{unshown[0].name}: {cannot}")
    problems = []
    if load.error:
        problems.append(load.error)
    if load.tcp_bytes <= 0:
        problems.append("the TCP generator moved no data")
    if load.disk_bytes <= 0:
        problems.append("the disk writer wrote nothing")
    if not load.stopped:
        problems.append(f"load generators were not all stopped: pids {list(load.pids)}")
    if not cases:
        problems.append("no case ran under load")
    for c in cases:
        ok, why = is_right(c)
        if not ok:
            problems.append(f"{c.name}: {why}")
    if problems:
        return StepResult("8", title, Status.FAIL, figures, "; ".join(problems))
    return StepResult("8", title, Status.PASS, figures, "every case under load named right")


def overall(steps: Sequence[StepResult]) -> bool:
    """Passed: at least one step ran and every step that was not skipped passed."""
    return any(s.status is Status.PASS for s in steps) and all(
        s.status is not Status.FAIL for s in steps
    )


def summary_table(steps: Sequence[StepResult]) -> str:
    """The closing table, plain text for the terminal (Markdown pipes)."""
    rows = ["| step | result | figures |", "|---|---|---|"]
    for s in steps:
        result = (
            s.status.value
            if s.status is Status.PASS
            else f"{s.status.value} ({s.detail.replace('|', '/')})"
        )
        rows.append(f"| {s.step} {s.title} | {result} | {s.figures.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
