"""Where each record lives: `<root>/<cluster>/<job id>/...` (pure path arithmetic).

`nodes/` is written by root hooks only; `results/` by the controller Epilog (SlurmUser) or the
batch host's Epilog (root); `run-<restart>/` and `checkpoints/` by the job, so the privileged
hooks treat them as untrusted input. `<root>/<cluster>/pending/` holds one marker per incident
whose handling has begun and not ended (see hooks/pending.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.errors import EvidenceError

_CLUSTER_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_NODE_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


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
        return self.path / f"run-{int(restart)}"

    def ranks_dir(self, restart: int) -> Path:
        return self.run_dir(restart) / "ranks"

    def progress_dir(self, restart: int) -> Path:
        return self.run_dir(restart) / "progress"

    def findings_dir(self, restart: int) -> Path:
        return self.run_dir(restart) / "findings"

    def stacks_dir(self, restart: int) -> Path:
        return self.run_dir(restart) / "stacks"

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / "checkpoints"

    @property
    def results_dir(self) -> Path:
        """The controller's outcome of each run: owned by SlurmUser, which may write nothing else here."""
        return self.path / "results"

    @property
    def pending_dir(self) -> Path:
        """Markers of incidents being handled, for the whole cluster (owned by SlurmUser)."""
        return self.cluster_dir / "pending"

    def pending_path(self, restart: int) -> Path:
        return self.pending_dir / f"{self.job_id}-{int(restart)}.json"

    def lock_path(self, restart: int) -> Path:
        """Held (flock) by the hook that handles run `restart`; the kernel frees it when that hook dies."""
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
        return self.ranks_dir(restart) / f"rank-{int(rank)}.json"

    def rank_cost_path(self, restart: int, rank: int) -> Path:
        """What scout's own work cost the rank (ScoutCost, written by the bootstrap)."""
        return self.ranks_dir(restart) / f"cost-{int(rank)}.json"

    def rank_exit_path(self, restart: int, rank: int) -> Path:
        return self.ranks_dir(restart) / f"exit-{int(rank)}.json"

    def coverage_path(self, restart: int) -> Path:
        """Which of scout's checks ran in the run (VoteCoverage, written by the lowest rank)."""
        return self.run_dir(restart) / "votes.json"

    def task_log_path(self, restart: int, rank: int) -> Path:
        """The task shim's and its watchdog's own log (JSON lines, bounded): not the job's output."""
        return self.ranks_dir(restart) / f"log-{int(rank)}.jsonl"

    def progress_path(self, restart: int, rank: int) -> Path:
        return self.progress_dir(restart) / f"rank-{int(rank)}.json"

    def history_path(self, restart: int, rank: int) -> Path:
        """The rank's bounded progress history (a ring file; see evidence/history.py)."""
        return self.progress_dir(restart) / f"history-{int(rank)}.bin"

    def stall_decision_path(self, restart: int) -> Path:
        return self.progress_dir(restart) / "stall-decision.json"

    def rendezvous_path(self, restart: int, step_id: int) -> Path:
        """A rank of job step `step_id` entered init_process_group (records.RendezvousMark)."""
        return self.progress_dir(restart) / f"rendezvous-step-{int(step_id)}.json"

    def first_collective_path(self, restart: int, step_id: int) -> Path:
        """A rank of job step `step_id` entered the job's first collective (records.RendezvousMark)."""
        return self.progress_dir(restart) / f"first-collective-step-{int(step_id)}.json"

    def node_tasks_path(self, restart: int, node: str) -> Path:
        """Written by the job (its local rank 0 on `node`): the ranks started there."""
        return self.run_dir(restart) / "tasks" / f"{check_node_name(node)}.json"

    def node_digest_path(self, restart: int, node: str) -> Path:
        """Written by the node Epilog (root): that node's ranks' records, abridged."""
        return self.node_dir(node) / f"ranks-{int(restart)}.json"

    def checkpoint_checks_path(self, restart: int, node: str) -> Path:
        """Written by the batch host's node Epilog (root): the job's checkpoint notes as checked
        by the job's own user (hooks/ckptcheck.py)."""
        return self.node_dir(node) / f"checkpoints-{int(restart)}.json"

    def stacks_path(self, restart: int, rank: int) -> Path:
        return self.stacks_dir(restart) / f"rank-{int(rank)}.txt"

    def restarts(self) -> list[int]:
        """Run indices present in the folder, ascending (reads the directory listing only)."""
        out = []
        if self.path.is_dir():
            for entry in self.path.iterdir():
                m = re.fullmatch(r"run-(\d{1,6})", entry.name)
                if m:
                    out.append(int(m.group(1)))
        return sorted(out)
