"""Where each record lives: `<root>/<cluster>/<job id>/...` (pure path arithmetic).

`nodes/` is written by root hooks only; `results/` by the controller Epilog (SlurmUser) or the
batch host's Epilog (root); `run-<restart>/` and `checkpoints/` by the job, so the privileged
hooks treat them as untrusted input. `<root>/<cluster>/pending/` holds one marker per incident
whose handling has begun and not ended (see hooks/pending.py).

Every path of the folder is built here: `JobFolder` for the job, `RunFolder` for one run (all the
in-job bootstrap knows, from SCOUT_RUN_DIR). tests/unit/test_evidence_paths.py fails on a path piece
written out anywhere else; which record lives in which file is listed in evidence/contract.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.errors import EvidenceError

TORCH_FR_DUMP_PREFIX = "torch-flight-recorder-rank-"  # torch appends the rank

_CLUSTER_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_NODE_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


# The name patterns of a folder's files, for listing them (store.list_records); `*` stands for the
# rank, or the run.
RANK_PLACES = "rank-*.json"  # in ranks/ (RunFolder.rank_place_path)
RANK_EXITS = "exit-*.json"  # in ranks/ (RunFolder.rank_exit_path)
RANK_COSTS = "cost-*.json"  # in ranks/ (RunFolder.rank_cost_path)
PROGRESS_SNAPSHOTS = "rank-*.json"  # in progress/ (RunFolder.progress_path)
VERDICTS = "verdict-*.json"  # in results/ (JobFolder.verdict_path)
DRAIN_DECISIONS = "drain-decisions-*.json"  # in results/ (JobFolder.drain_decisions_path)
HARDWARE_MAP_NAME = "hardware-map.json"  # in nodes/<node>/ (JobFolder.hardware_map_path)


def check_node_name(name: str) -> str:
    if not isinstance(name, str) or not _NODE_OK.match(name) or ".." in name:
        raise EvidenceError(f"invalid node name {name!r}: letters, digits, '.', '_', '-' only")
    return name


@dataclass(frozen=True)
class JobFolder:
    root: Path
    cluster: str
    job_id: int

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, str) or not _CLUSTER_OK.match(self.cluster):
            raise EvidenceError(f"invalid cluster name {self.cluster!r} for the evidence folder")
        if not isinstance(self.job_id, int) or isinstance(self.job_id, bool) or self.job_id <= 0:
            raise EvidenceError(f"invalid job id {self.job_id!r} for the evidence folder")
        object.__setattr__(self, "root", Path(self.root))

    @classmethod
    def of_run_dir(cls, run_dir: Path) -> tuple[JobFolder, int]:
        """The job folder and run number a run folder (`<root>/<cluster>/<job>/run-<N>`) is of."""
        run_dir = Path(run_dir)
        m = re.fullmatch(r"run-(\d{1,9})", run_dir.name)
        if m is None or not run_dir.parent.name.isdigit():
            raise EvidenceError(f"{run_dir} is not a run folder of a job's evidence folder")
        job = run_dir.parent
        return cls(job.parent.parent, job.parent.name, int(job.name)), int(m[1])

    @property
    def cluster_dir(self) -> Path:
        return self.root / self.cluster

    @property
    def path(self) -> Path:
        return self.cluster_dir / str(self.job_id)

    @property
    def nodes_dir(self) -> Path:
        return self.path / "nodes"

    def node_dir(self, node: str) -> Path:
        return self.nodes_dir / check_node_name(node)

    def run_dir(self, restart: int) -> Path:
        return self.run(restart).path

    def run(self, restart: int) -> RunFolder:
        """Run `restart`'s part of the folder, written by the job."""
        return RunFolder(self.path / f"run-{int(restart)}")

    def ranks_dir(self, restart: int) -> Path:
        return self.run(restart).ranks_dir

    def progress_dir(self, restart: int) -> Path:
        return self.run(restart).progress_dir

    def findings_dir(self, restart: int) -> Path:
        return self.run(restart).findings_dir

    def stacks_dir(self, restart: int) -> Path:
        return self.run(restart).stacks_dir

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def results_dir(self) -> Path:
        """The controller's outcome of each run: owned by SlurmUser, which may write nothing else
        here.
        """
        return self.path / "results"

    @property
    def pending_dir(self) -> Path:
        """Markers of incidents being handled, for the whole cluster (owned by SlurmUser)."""
        return self.cluster_dir / "pending"

    def pending_path(self, restart: int) -> Path:
        return self.pending_dir / f"{self.job_id}-{int(restart)}.json"

    def lock_path(self, restart: int) -> Path:
        """Held (flock) by the hook that handles run `restart`; the kernel frees it when that
        hook dies.
        """
        return self.results_dir / f"lock-{int(restart)}"

    def verdict_path(self, restart: int) -> Path:
        return self.results_dir / f"verdict-{int(restart)}.json"

    def actions_path(self, restart: int) -> Path:
        return self.results_dir / f"actions-{int(restart)}.json"

    def report_path(self, restart: int) -> Path:
        return self.results_dir / f"report-{int(restart)}.md"

    def report_html_path(self, restart: int) -> Path:
        """The incident page (report/html.py) next to the Markdown report."""
        return self.results_dir / f"report-{int(restart)}.html"

    def rerun_checkpoints_path(self, restart: int) -> Path:
        """Written by the controller hook for run `restart`: its recovery point and the rejected
        checkpoints still on storage (remediation.records.RerunCheckpoints)."""
        return self.results_dir / f"rerun-checkpoints-{int(restart)}.json"

    def resume_path(self, restart: int) -> Path:
        """Written by the controller hook for run `restart`: which checkpoint to load."""
        return self.results_dir / f"resume-{int(restart)}.json"

    def rank_place_path(self, restart: int, rank: int) -> Path:
        return self.run(restart).rank_place_path(rank)

    def rank_cost_path(self, restart: int, rank: int) -> Path:
        """What scout's own work cost the rank (ScoutCost, written by the bootstrap)."""
        return self.run(restart).rank_cost_path(rank)

    def rank_exit_path(self, restart: int, rank: int) -> Path:
        return self.run(restart).rank_exit_path(rank)

    def coverage_path(self, restart: int) -> Path:
        """Which of scout's checks ran in the run (VoteCoverage, written by the lowest rank)."""
        return self.run(restart).coverage_path

    def task_log_path(self, restart: int, rank: int) -> Path:
        """The task shim's and its watchdog's own log (JSON lines, bounded): not the job's
        output.
        """
        return self.run(restart).task_log_path(rank)

    def progress_path(self, restart: int, rank: int) -> Path:
        return self.run(restart).progress_path(rank)

    def history_path(self, restart: int, rank: int) -> Path:
        """The rank's bounded progress history (a ring file; see evidence/history.py)."""
        return self.run(restart).history_path(rank)

    def stall_decision_path(self, restart: int) -> Path:
        return self.run(restart).stall_decision_path

    def rendezvous_path(self, restart: int, step_id: int) -> Path:
        """A rank of job step `step_id` entered init_process_group (records.RendezvousMark)."""
        return self.run(restart).rendezvous_path(step_id)

    def first_collective_path(self, restart: int, step_id: int) -> Path:
        """A rank of job step `step_id` entered the job's first collective
        (records.RendezvousMark).
        """
        return self.run(restart).first_collective_path(step_id)

    def node_tasks_path(self, restart: int, node: str) -> Path:
        """Written by the job (its local rank 0 on `node`): the ranks started there."""
        return self.run(restart).node_tasks_path(node)

    def node_digest_path(self, restart: int, node: str) -> Path:
        """Written by the node Epilog (root): that node's ranks' records, abridged."""
        return self.node_dir(node) / node_digest_name(restart)

    def hardware_map_path(self, node: str) -> Path:
        """Written by the Prolog (root): the node's hardware map (hwmap.records.HardwareMap)."""
        return self.node_dir(node) / HARDWARE_MAP_NAME

    def node_epilog_path(self, node: str) -> Path:
        """Written last by the node Epilog (root): the controller waits for it on every node."""
        return self.node_dir(node) / "epilog.json"

    def rootcheck_path(self, restart: int, node: str) -> Path:
        """Written by the node Epilog (root) on suspicion: what root-side checks found."""
        return self.node_dir(node) / f"rootcheck-{int(restart)}.json"

    def ib_baseline_path(self, restart: int, node: str) -> Path:
        """Written by the Prolog (root): the node's InfiniBand counters when run `restart` began."""
        return self.node_dir(node) / f"ib-counters-{int(restart)}.json"

    def nodes_dir_parts(self) -> tuple[str, ...]:
        """`nodes_dir` as folder names below `root`, for a walk that opens one level at a time."""
        return self.nodes_dir.relative_to(self.root).parts

    def drain_decisions_path(self, restart: int) -> Path:
        """Written by the incident: the job's user and what became of each named node."""
        return self.results_dir / f"drain-decisions-{int(restart)}.json"

    def checkpoint_note_path(self, restart: int, step: int, rank: int) -> Path:
        return checkpoint_note_path(self.checkpoints_dir, restart, step, rank)

    def checkpoint_checks_path(self, restart: int, node: str) -> Path:
        """Written by the batch host's node Epilog (root): the job's checkpoint notes as checked
        by the job's own user (hooks/ckptcheck.py)."""
        return self.node_dir(node) / f"checkpoints-{int(restart)}.json"

    def stacks_path(self, restart: int, rank: int) -> Path:
        return self.run(restart).stacks_path(rank)

    def flight_recorder_path(self, restart: int, rank: int) -> Path:
        return self.run(restart).flight_recorder_path(rank)

    def restarts(self) -> list[int]:
        """Run indices present in the folder, ascending (reads the directory listing only)."""
        out = []
        if self.path.is_dir():
            for entry in self.path.iterdir():
                m = re.fullmatch(r"run-(\d{1,6})", entry.name)
                if m:
                    out.append(int(m.group(1)))
        return sorted(out)


@dataclass(frozen=True)
class RunFolder:
    """`<job>/run-<restart>/`: what the job writes during one run (untrusted input for the
    hooks).
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def ranks_dir(self) -> Path:
        return self.path / "ranks"

    @property
    def progress_dir(self) -> Path:
        return self.path / "progress"

    @property
    def findings_dir(self) -> Path:
        return self.path / "findings"

    @property
    def stacks_dir(self) -> Path:
        return self.path / "stacks"

    @property
    def tasks_dir(self) -> Path:
        return self.path / "tasks"

    @property
    def subdirs(self) -> tuple[Path, ...]:
        """The folders the Prolog makes for the run, in the order it makes them."""
        return (
            self.ranks_dir,
            self.progress_dir,
            self.findings_dir,
            self.stacks_dir,
            self.tasks_dir,
        )

    def finding_path(self, name: str) -> Path:
        """A finding (records.Finding) named `name`: what, whose, at which step, without `.json`."""
        return self.findings_dir / f"{name}.json"

    @staticmethod
    def rank_place_name(rank: int) -> str:
        return f"rank-{int(rank)}.json"

    @staticmethod
    def rank_exit_name(rank: int) -> str:
        return f"exit-{int(rank)}.json"

    @staticmethod
    def progress_name(rank: int) -> str:
        return f"rank-{int(rank)}.json"

    def rank_place_path(self, rank: int) -> Path:
        return self.ranks_dir / self.rank_place_name(rank)

    def rank_cost_path(self, rank: int) -> Path:
        """What scout's own work cost the rank (ScoutCost, written by the bootstrap)."""
        return self.ranks_dir / f"cost-{int(rank)}.json"

    def rank_exit_path(self, rank: int) -> Path:
        return self.ranks_dir / self.rank_exit_name(rank)

    @property
    def coverage_path(self) -> Path:
        """Which of scout's checks ran in the run (VoteCoverage, written by the lowest rank)."""
        return self.path / "votes.json"

    def task_log_path(self, rank: int) -> Path:
        """The task shim's and its watchdog's own log (JSON lines, bounded): not the job's
        output.
        """
        return self.ranks_dir / f"log-{int(rank)}.jsonl"

    def progress_path(self, rank: int) -> Path:
        return self.progress_dir / self.progress_name(rank)

    def history_path(self, rank: int) -> Path:
        """The rank's bounded progress history (a ring file; see evidence/history.py)."""
        return self.progress_dir / f"history-{int(rank)}.bin"

    @property
    def stall_decision_path(self) -> Path:
        return self.progress_dir / "stall-decision.json"

    def rendezvous_path(self, step_id: int) -> Path:
        """A rank of job step `step_id` entered init_process_group (records.RendezvousMark)."""
        return self.progress_dir / f"rendezvous-step-{int(step_id)}.json"

    def first_collective_path(self, step_id: int) -> Path:
        """A rank of job step `step_id` entered the job's first collective
        (records.RendezvousMark).
        """
        return self.progress_dir / f"first-collective-step-{int(step_id)}.json"

    def node_tasks_path(self, node: str) -> Path:
        """Written by the job (its local rank 0 on `node`): the ranks started there."""
        return self.tasks_dir / f"{check_node_name(node)}.json"

    def stacks_path(self, rank: int) -> Path:
        return self.stacks_dir / f"rank-{int(rank)}.txt"

    def flight_recorder_path(self, rank: int) -> Path:
        """torch's Flight Recorder of the rank, taken on the watchdog's request when its stacks
        were: torch's pickle with stack traces, or its JSON where torch has only that."""
        return self.stacks_dir / f"flight-recorder-rank-{int(rank)}.dump"

    def torch_flight_recorder_path(self, rank: int) -> Path:
        """The dump torch itself writes on NCCL's collective timeout, where the shim pointed it
        (TORCH_FR_DUMP_TEMP_FILE, task/shim.py: the prefix, then the rank)."""
        return self.stacks_dir / f"{TORCH_FR_DUMP_PREFIX}{int(rank)}"


def node_digest_name(restart: int) -> str:
    """The node Epilog's digest of run `restart` in nodes/<node>/ (JobFolder.node_digest_path)."""
    return f"ranks-{int(restart)}.json"


def checkpoint_notes_glob(restart: int) -> str:
    """The names of run `restart`'s checkpoint notes in checkpoints/ (checkpoint_note_path)."""
    return f"run-{int(restart)}-step-*-rank-*.json"


def checkpoint_note_path(checkpoints_dir: Path, restart: int, step: int, rank: int) -> Path:
    """A checkpoint note in checkpoints/ (JobFolder.checkpoints_dir, or SCOUT_CHECKPOINTS_DIR in
    the job): the rank's record of a checkpoint it saved at `step` of run `restart`."""
    return Path(checkpoints_dir) / f"run-{int(restart)}-step-{int(step)}-rank-{int(rank)}.json"
