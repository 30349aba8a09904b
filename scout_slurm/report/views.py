"""Read models for the operator commands: what `scout show` and `scout checkpoints` print, loaded
from the evidence folder into typed views (the rim: this module reads), then rendered as text or
JSON (pure functions of the view). The CLI only finds the job's folder and prints."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from scout_slurm.errors import EvidenceError, ScoutError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.records import (
    Finding,
    FindingComponent,
    JobEvidence,
    ResumeOutcome,
    ScoutCost,
    Verdict,
    resume_outcome,
)
from scout_slurm.evidence.stacks import load_stacks
from scout_slurm.remediation.eligibility import Assessment
from scout_slurm.remediation.records import ActionsRecord
from scout_slurm.report.bundle_loader import load_flight_recorder
from scout_slurm.report.story import RunStory, render_story, requeued, running


@dataclass(frozen=True)
class ShowView:
    """One run of a job as `scout show` presents it."""

    job_id: int
    cluster: str
    run: int
    runs: tuple[int, ...]
    verdict: Verdict
    evidence: JobEvidence
    actions: ActionsRecord | None
    computed: bool  # no verdict on record: computed now from the evidence
    resume: tuple[Finding, ...]  # the resumed run's restored state against its checkpoint record
    actions_problem: str = (
        ""  # why the actions file could not be read ("" when it was, or is absent)
    )
    cost: tuple[ScoutCost, ...] = ()  # what scout's own work cost each rank (ranks/cost-R.json)
    cost_problems: tuple[str, ...] = ()
    # the job's runs in order (report/story.py), told before the run shown when none was asked
    story: tuple[RunStory, ...] = ()
    # the suspects' dumped stacks: (rank, the current thread's frames, or the dump's last lines)
    stacks: tuple[tuple[int, tuple[str, ...]], ...] = ()
    flight_recorder: tuple[str, ...] = ()  # torch's record of each rank's collectives
    running: bool = False  # no verdict yet and ranks still without an exit record


def load_show(folder: JobFolder, restart: int | None = None) -> ShowView:
    from scout_slurm.evidence.gather import (
        cycle_collector_paused,
        gather_evidence,
        with_full_records,
    )
    from scout_slurm.evidence.store import read_record
    from scout_slurm.localise.verdict import localise

    runs = folder.restarts()
    if not runs:
        raise ScoutError(f"job {folder.job_id}: no run folders in {folder.path}")
    run = runs[-1] if restart is None else restart
    with (
        cycle_collector_paused()
    ):  # a large job's records: no collector passes over them while reading
        ev = gather_evidence(folder, run)
    if not ev.places and not ev.exits and not ev.snapshots and not ev.findings:
        raise ScoutError(
            f"job {folder.job_id} run {run}: no scout records in {folder.run_dir(run)} (no "
            "rank wrote "
            "its place, progress or exit): the job did not run under scout-srun, or its "
            "SCOUT_CONFIG "
            "sent its evidence elsewhere; there is no verdict to show"
        )
    story = tuple(load_story(folder, runs))
    this = next(s for s in story if s.run == run) if run in runs else None
    vpath = folder.verdict_path(run)
    computed = not vpath.exists()
    verdict = (
        localise(ev, now=time.time()) if computed else read_record(vpath, Verdict, root=folder.root)
    )
    is_running = computed and this is not None and running(this)
    ev = with_full_records(ev, folder, [s.rank for s in verdict.suspects])
    apath = folder.actions_path(run)
    actions, actions_problem = None, ""
    if apath.exists():
        try:
            actions = read_record(apath, ActionsRecord, root=folder.root)
        except (
            EvidenceError
        ) as exc:  # the verdict and timeline are still worth showing; say why there are no actions
            actions_problem = str(exc)
    resume = tuple(
        sorted(
            (f for f in ev.findings if f.component == FindingComponent.RESUME.value),
            key=lambda f: f.rank,
        )
    )
    cost, cost_problems = load_cost(folder, run)
    return ShowView(
        job_id=folder.job_id,
        cluster=folder.cluster,
        run=run,
        runs=tuple(runs),
        verdict=verdict,
        evidence=ev,
        actions=actions,
        computed=computed,
        resume=resume,
        actions_problem=actions_problem,
        cost=cost,
        cost_problems=cost_problems,
        story=story if restart is None else (),
        stacks=tuple(load_stacks(folder, run, [s.rank for s in verdict.suspects])),
        flight_recorder=tuple(load_flight_recorder(folder, run, ev.world_size)),
        running=is_running,
    )


def load_story(folder: JobFolder, runs: list[int]) -> list[RunStory]:
    """Each run's recorded verdict and actions, where its ranks ran and how many exited."""
    from scout_slurm.evidence.safeio import list_names_below
    from scout_slurm.evidence.store import read_record

    out = []
    for run in runs:
        verdict = actions = None
        try:
            if folder.verdict_path(run).exists():
                verdict = read_record(folder.verdict_path(run), Verdict, root=folder.root)
            if folder.actions_path(run).exists():
                actions = read_record(folder.actions_path(run), ActionsRecord, root=folder.root)
        except EvidenceError:
            pass  # the run's own view says why; the story goes on without it
        try:
            names = list_names_below(folder.ranks_dir(run), folder.root)
            tasks = list_names_below(folder.run(run).tasks_dir, folder.root)
        except EvidenceError:
            names, tasks = [], []
        nodes = tuple(sorted(n[: -len(".json")] for n in tasks if n.endswith(".json")))
        world = sum(1 for n in names if n.startswith("rank-") and n.endswith(".json"))
        exited = sum(1 for n in names if n.startswith("exit-") and n.endswith(".json"))
        out.append(RunStory(run, verdict, actions, nodes, world, exited))
    return out


def load_cost(folder: JobFolder, run: int) -> tuple[tuple[ScoutCost, ...], tuple[str, ...]]:
    """The ranks' records of scout's own cost, and one line per file that could not be read."""
    from scout_slurm.evidence.layout import RANK_COSTS
    from scout_slurm.evidence.store import list_records

    ranks = folder.ranks_dir(run)
    if not ranks.is_dir():
        return (), ()
    try:
        found, problems = list_records(ranks, RANK_COSTS, ScoutCost, root=folder.root)
    except EvidenceError as exc:
        return (), (str(exc),)
    return tuple(found), tuple(problems)


def show_json(view: ShowView) -> dict:
    from scout_slurm.evidence.store import record_to_obj
    from scout_slurm.report.show import timing_findings

    obj = record_to_obj(view.verdict)
    obj["actions"] = record_to_obj(view.actions) if view.actions else None
    obj["actions_problem"] = view.actions_problem or None
    obj["runs"] = list(view.runs)
    obj["computed"] = view.computed
    obj["timing"] = [record_to_obj(f) for f in timing_findings(view.evidence)]
    obj["resume"] = [record_to_obj(f) for f in view.resume]
    obj["running"] = view.running
    obj["story"] = [
        {
            "run": s.run,
            "verdict": s.verdict.kind.value if s.verdict else None,
            "cause": s.verdict.cause.value if s.verdict else None,
            "nodes": list(s.nodes),
            "ranks": s.world,
            "exited": s.exited,
            "requeued": requeued(s.actions),
        }
        for s in view.story
    ]
    obj["stacks"] = {str(rank): list(frames) for rank, frames in view.stacks}
    obj["flight_recorder"] = list(view.flight_recorder)
    obj["cost"] = [
        dict(record_to_obj(c), per_step_ms=c.per_step_ms, share=c.share) for c in view.cost
    ]
    return obj


def show_text(view: ShowView) -> str:
    from scout_slurm.report.markdown import render_actions
    from scout_slurm.report.show import render_show

    if view.running:
        return show_running(view)
    told = render_story(view.job_id, list(view.story), view.run) + [""] if view.story else []
    out = "".join(line + "\n" for line in told) + render_show(
        view.job_id,
        view.cluster,
        view.run,
        view.verdict,
        view.evidence,
        render_actions(view.actions) if view.actions else None,
        computed=view.computed,
    )
    lines = [f"\nactions: not readable: {view.actions_problem}"] if view.actions_problem else []
    if view.resume:
        lines.append("\nresume check:")
        for f in view.resume:
            lines.append(f"  {f.summary}")
            if resume_outcome(f.summary) is ResumeOutcome.MISMATCH:
                lines += [f"      {d}" for d in f.details]
    from scout_slurm.report.show import render_cost

    if view.flight_recorder:
        lines += ["", "torch's Flight Recorder (where each rank was in its collectives):"]
        lines += [f"  {line}" for line in view.flight_recorder]
    for rank, frames in view.stacks:
        lines += ["", f"rank {rank}'s stack when scout dumped it:"] + [f"  {f}" for f in frames]
    lines += [""] + render_cost(list(view.cost), list(view.cost_problems))
    if len(view.runs) > 1:
        lines.append(f"\nruns of this job: {list(view.runs)} (see --restart N)")
    return out + "".join(line + "\n" for line in lines)


def show_running(view: ShowView) -> str:
    """A run still going: the story so far and where each rank is, no verdict."""
    from scout_slurm.report.show import render_timeline

    lines = render_story(view.job_id, list(view.story), view.run) if view.story else []
    lines += [
        "",
        f"job {view.job_id} run {view.run} is running: no verdict yet (the controller's Epilog "
        "writes it when the job ends)",
        "",
        *render_timeline(view.evidence),
    ]
    return "".join(line + "\n" for line in lines)


def show_html(view: ShowView, folder: JobFolder) -> str:
    from scout_slurm.report.bundle_loader import load_incident_bundle
    from scout_slurm.report.html import render_incident_html

    return render_incident_html(
        load_incident_bundle(
            folder,
            view.run,
            evidence=view.evidence,
            verdict=view.verdict,
            actions=view.actions,
            verdict_computed=view.computed,
        )
    )


@dataclass(frozen=True)
class CheckpointRow:
    """One noted checkpoint as `scout checkpoints --json` gives it."""

    path: str
    step: int
    run: int
    status: str
    reason: str
    sha256: str
    versions: int
    schema_version: int
    saver: str
    files: int
    world: int
    ranks_saved: list[int]
    agreement: str
    signatures: dict
    software: dict | None
    coverage: dict | None

    @classmethod
    def of(cls, a: Assessment) -> CheckpointRow:
        n = a.note
        return cls(
            path=n.path,
            step=n.step,
            run=n.restart,
            status=a.status.value,
            reason=a.reason,
            sha256=n.sha256,
            versions=n.versions,
            schema_version=n.schema_version,
            saver=n.saver,
            files=len(n.files),
            world=n.world,
            ranks_saved=list(n.ranks_saved),
            agreement=n.agreement,
            signatures={
                s.component: {"value": s.saved or s.majority, "agreed": s.agreed}
                for s in n.signatures
            },
            software=dataclasses.asdict(n.software) if n.software else None,
            coverage=dataclasses.asdict(n.coverage) if n.coverage else None,
        )


@dataclass(frozen=True)
class CheckpointsView:
    job_id: int
    assessments: tuple[Assessment, ...]
    recovery_point: Assessment | None
    rule: str  # why the recovery rule chose it (or chose none)


def load_checkpoints(
    folder: JobFolder, *, time_budget_s: float, byte_budget: int
) -> CheckpointsView:
    """The checkpoints a job noted, assessed against the files as they are now (read as the job's
    user, never as root) and the last run's verdict; and the one a rerun would resume from."""
    from scout_slurm.evidence.store import read_record
    from scout_slurm.hooks.ckptcheck import checks_now
    from scout_slurm.remediation.checkpoint_assessment import assess_job
    from scout_slurm.remediation.eligibility import recovery_point

    runs = folder.restarts()
    checks = checks_now(
        folder, runs[-1] if runs else 0, time_budget_s=time_budget_s, byte_budget=byte_budget
    )
    rows = assess_job(folder, checks=checks)
    first_suspect_step = -1
    if runs and folder.verdict_path(runs[-1]).exists():
        first_suspect_step = read_record(
            folder.verdict_path(runs[-1]), Verdict, root=folder.root
        ).first_suspect_step
    chosen, why = recovery_point(rows, first_suspect_step)
    return CheckpointsView(
        job_id=folder.job_id, assessments=tuple(rows), recovery_point=chosen, rule=why
    )


def checkpoints_json(view: CheckpointsView) -> dict:
    return {
        "job_id": view.job_id,
        "checkpoints": [dataclasses.asdict(CheckpointRow.of(a)) for a in view.assessments],
        "recovery_point": view.recovery_point.note.path if view.recovery_point else None,
        "rule": view.rule,
    }


def checkpoints_text(view: CheckpointsView) -> str:
    from scout_slurm.remediation.signatures import short

    if not view.assessments:
        return f"job {view.job_id}: no checkpoints noted\n"
    pad = " " * 22
    lines = [f"{'step':>6} {'run':>3}  {'status':<9} path / why / evidence"]
    for a in view.assessments:
        n = a.note
        lines.append(
            f"{n.step:>6} {n.restart:>3}  {a.status.value:<9} {n.path}\n{pad}why: {a.reason}"
        )
        if n.schema_version < 2:
            lines.append(
                f"{pad}(schema version {n.schema_version} record: no signatures or replicas' "
                "agreement)"
            )
            continue
        lines.append(
            f"{pad}saved by {n.saver or '?'} on rank{'s' if len(n.ranks_saved) != 1 else ''} "
            f"{','.join(map(str, n.ranks_saved)) or '?'} of {n.world}; {len(n.files)} file(s); "
            f"replicas: {n.agreement or '?'}"
        )
        if n.signatures:
            lines.append(f"{pad}signatures: {short(n.signatures)}")
        if n.software:
            sv = n.software
            lines.append(
                f"{pad}versions: python {sv.python}, torch {sv.torch}, cuda {sv.cuda or '-'}, "
                f"nccl {sv.nccl or '-'}, scout {sv.scout}"
            )
        if n.coverage:
            c = n.coverage
            lines.append(
                f"{pad}coverage since the previous record: {c.votes} vote(s), "
                f"{c.replay_rounds} replay "
                f"round(s): {c.verdicts}"
            )
    lines.append(f"recovery rule: {view.rule}")
    return "".join(line + "\n" for line in lines)
