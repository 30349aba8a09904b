"""The evidence contract in one place: every versioned record type, grouped by who writes it, with
the file it lives in (built by evidence/layout.py) and the schema versions this scout writes and
reads. docs/HOW-IT-WORKS.md's evidence-records table is rendered from here (`render_markdown`).

Records are named as "module:Class" below scout_slurm and loaded only when asked (`RecordType.cls`),
so that this module, like the rest of evidence/, imports nothing from the layers above it.
tests/unit/test_evidence_contract.py fails when a dataclass with a `schema_version` is added
anywhere in scout_slurm without an entry here, or an entry names a class that is not there.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from dataclasses import dataclass


class Writer(str, enum.Enum):
    JOB = "the job"
    NODE_HOOKS = "the node hooks"
    INCIDENT = "the incident"
    TOOLS = "scout's tools, outside the evidence folder"


WHO = {
    Writer.JOB: (
        "The task shim, its watchdog and the bootstrap in the training process, as the job's user: "
        "untrusted input for the privileged hooks, read without following links, size-bounded."
    ),
    Writer.NODE_HOOKS: (
        "The Prolog and the node Epilog, as root, into nodes/<node>/: the controller reads only "
        "files root owns there."
    ),
    Writer.INCIDENT: (
        "The controller Epilog (SlurmUser), or the batch host's node Epilog where the controller "
        "cannot read the folder, into results/ and the cluster's pending/."
    ),
    Writer.TOOLS: (
        "Values with a schema version of their own that no hook reads from the evidence folder: "
        "`scout acceptance`'s report, settings read from the environment, in-memory views."
    ),
}


@dataclass(frozen=True)
class RecordType:
    name: str  # "module:Class", the module below scout_slurm
    writer: Writer
    by: str  # which part writes it
    file: str  # where it lives, from the job folder (`<job>/`), or "in <Record>" for a part of one
    built_by: str = ""  # the method of evidence/layout.py that builds that path

    @property
    def module(self) -> str:
        return "scout_slurm." + self.name.split(":")[0]

    @property
    def class_name(self) -> str:
        return self.name.split(":")[1]

    def cls(self) -> type:
        return getattr(importlib.import_module(self.module), self.class_name)

    def schema_version(self) -> int:
        return next(f.default for f in dataclasses.fields(self.cls()) if f.name == "schema_version")

    def oldest_readable(self) -> int:
        return getattr(self.cls(), "OLDEST_SCHEMA_VERSION", 1)


_J, _N, _I, _T = Writer.JOB, Writer.NODE_HOOKS, Writer.INCIDENT, Writer.TOOLS
_BOOT, _WD, _SHIM = "bootstrap", "watchdog", "task shim"

RECORDS: tuple[RecordType, ...] = (
    # -- the job: run-<N>/ and checkpoints/ --
    RecordType(
        "evidence.records:RankPlace",
        _J,
        _SHIM,
        "run-N/ranks/rank-R.json",
        "RunFolder.rank_place_path",
    ),
    RecordType(
        "evidence.records:ExitRecord",
        _J,
        _WD,
        "run-N/ranks/exit-R.json",
        "RunFolder.rank_exit_path",
    ),
    RecordType(
        "evidence.records:ScoutCost",
        _J,
        _BOOT,
        "run-N/ranks/cost-R.json",
        "RunFolder.rank_cost_path",
    ),
    RecordType(
        "evidence.records:ProgressSnapshot",
        _J,
        _WD,
        "run-N/progress/rank-R.json",
        "RunFolder.progress_path",
    ),
    RecordType(
        "evidence.history:ProgressSample",
        _J,
        _WD,
        "run-N/progress/history-R.bin",
        "RunFolder.history_path",
    ),
    RecordType(
        "evidence.records:RendezvousMark",
        _J,
        _WD,
        "run-N/progress/rendezvous-step-S.json",
        "RunFolder.rendezvous_path, RunFolder.first_collective_path",
    ),
    RecordType(
        "evidence.records:StallDecision",
        _J,
        _WD,
        "run-N/progress/stall-decision.json",
        "RunFolder.stall_decision_path",
    ),
    RecordType(
        "evidence.records:NodeTasks",
        _J,
        f"{_SHIM} (local rank 0 of each node)",
        "run-N/tasks/<node>.json",
        "RunFolder.node_tasks_path",
    ),
    RecordType(
        "evidence.records:Finding",
        _J,
        f"{_BOOT}, {_WD}",
        "run-N/findings/<name>.json",
        "RunFolder.finding_path",
    ),
    RecordType(
        "evidence.records:VoteCoverage",
        _J,
        f"{_BOOT} (lowest rank)",
        "run-N/votes.json",
        "RunFolder.coverage_path",
    ),
    RecordType(
        "evidence.records:CheckpointNote",
        _J,
        _BOOT,
        "checkpoints/run-N-step-S-rank-R.json",
        "checkpoint_note_path",
    ),
    RecordType("evidence.records:CheckpointFile", _J, _BOOT, "in CheckpointNote"),
    RecordType("evidence.records:StateSignature", _J, _BOOT, "in CheckpointNote"),
    RecordType("evidence.records:SoftwareVersions", _J, _BOOT, "in CheckpointNote"),
    RecordType("evidence.records:CoverageSince", _J, _BOOT, "in CheckpointNote"),
    # -- the node hooks: nodes/<node>/ --
    RecordType(
        "hwmap.records:HardwareMap",
        _N,
        "Prolog",
        "nodes/<node>/hardware-map.json",
        "JobFolder.hardware_map_path",
    ),
    RecordType(
        "hooks.rootcheck:IbBaseline",
        _N,
        "Prolog",
        "nodes/<node>/ib-counters-N.json",
        "JobFolder.ib_baseline_path",
    ),
    RecordType(
        "hooks.nodeevidence:NodeEvidence",
        _N,
        "node Epilog (written last)",
        "nodes/<node>/epilog.json",
        "JobFolder.node_epilog_path",
    ),
    RecordType(
        "evidence.records:NodeDigest",
        _N,
        "node Epilog",
        "nodes/<node>/ranks-N.json",
        "JobFolder.node_digest_path",
    ),
    RecordType(
        "hooks.rootcheck:RootChecks",
        _N,
        "node Epilog, on suspicion",
        "nodes/<node>/rootcheck-N.json",
        "JobFolder.rootcheck_path",
    ),
    RecordType(
        "evidence.records:CheckpointChecks",
        _N,
        "batch host's node Epilog",
        "nodes/<node>/checkpoints-N.json",
        "JobFolder.checkpoint_checks_path",
    ),
    RecordType(
        "evidence.records:CheckpointCheck", _N, "batch host's node Epilog", "in CheckpointChecks"
    ),
    # -- the incident: results/ and <cluster>/pending/ --
    RecordType(
        "evidence.records:Verdict",
        _I,
        "localiser",
        "results/verdict-N.json",
        "JobFolder.verdict_path",
    ),
    RecordType(
        "remediation.records:ActionsRecord",
        _I,
        "plan, then apply",
        "results/actions-N.json",
        "JobFolder.actions_path",
    ),
    RecordType(
        "remediation.records:ResumeInstruction",
        _I,
        "apply (read by run N's task shim)",
        "results/resume-N.json",
        "JobFolder.resume_path",
    ),
    RecordType(
        "remediation.records:RerunCheckpoints",
        _I,
        "run (read by run N's checkpoint watch)",
        "results/rerun-checkpoints-N.json",
        "JobFolder.rerun_checkpoints_path",
    ),
    RecordType("remediation.records:RejectedCheckpoint", _I, "run", "in RerunCheckpoints"),
    RecordType(
        "remediation.plan:DrainDecisions",
        _I,
        "plan",
        "results/drain-decisions-N.json",
        "JobFolder.drain_decisions_path",
    ),
    RecordType(
        "incident.pending:PendingIncident",
        _I,
        "controller, while it handles run N",
        "../pending/<job>-N.json",
        "JobFolder.pending_path",
    ),
    # -- outside the evidence folder --
    RecordType(
        "acceptance.run:AcceptanceOptions", _T, "scout acceptance", "acceptance.json in --out"
    ),
    RecordType("acceptance.steps:StepResult", _T, "scout acceptance", "acceptance.json in --out"),
    RecordType("acceptance.steps:CaseRun", _T, "scout acceptance", "acceptance.json in --out"),
    RecordType("acceptance.steps:IncidentFiles", _T, "scout acceptance", "in CaseRun"),
    RecordType("acceptance.steps:MapResult", _T, "scout acceptance", "in memory: the map step"),
    RecordType("acceptance.steps:CheckpointRow", _T, "scout acceptance", "in CheckpointResult"),
    RecordType(
        "acceptance.steps:CheckpointResult",
        _T,
        "scout acceptance",
        "in memory: the checkpoint step",
    ),
    RecordType(
        "acceptance.steps:ResumeResult", _T, "scout acceptance", "in memory: the resume step"
    ),
    RecordType(
        "acceptance.steps:LoadResult", _T, "scout acceptance", "in memory: the under-load step"
    ),
    RecordType(
        "acceptance.steps:Workload", _T, "scout acceptance", "in memory: what --train offered"
    ),
    RecordType(
        "report.html:AcceptanceReport", _T, "scout acceptance", "in memory: acceptance.html"
    ),
    RecordType("report.html:AcceptanceCheck", _T, "scout acceptance", "in AcceptanceReport"),
    RecordType("report.html:LatencyCase", _T, "scout acceptance", "in AcceptanceReport"),
    RecordType("report.bundle:IncidentBundle", _T, "reports", "in memory: read from the folder"),
    RecordType("report.bundle:IncidentMoments", _T, "reports", "in memory: from IncidentBundle"),
    RecordType("localise.straggler:TimingRules", _T, "bootstrap", "in memory: from SCOUT_TIMING_*"),
    RecordType("bootstrap.replicas:GroupVote", _T, "bootstrap", "in memory: one vote's outcome"),
    RecordType("bootstrap.replicas:ReplayPlan", _T, "bootstrap", "in memory: one replay round"),
)


def by_writer(writer: Writer) -> tuple[RecordType, ...]:
    return tuple(r for r in RECORDS if r.writer is writer)


def render_markdown() -> str:
    """docs/HOW-IT-WORKS.md's evidence-records table (tests/unit/test_evidence_contract.py keeps
    it equal)."""
    out = []
    for writer in Writer:
        out += [f"**Written by {writer.value}.** {WHO[writer]}", ""]
        out += ["| record | module | by | file | path from | version | reads from |"]
        out += ["|---|---|---|---|---|---|---|"]
        for r in by_writer(writer):
            built = ", ".join(f"`{m}`" for m in r.built_by.split(", ")) if r.built_by else ""
            file = r.file if r.file.startswith("in ") else f"`{r.file}`"
            out.append(
                f"| `{r.class_name}` | `{r.name.split(':')[0]}` | {r.by} | {file} | {built} "
                f"| {r.schema_version()} | {r.oldest_readable()} |"
            )
        out.append("")
    return "\n".join(out)
