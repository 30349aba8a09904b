"""`scout acceptance`, the rim: brings up the lab (or uses the site's Slurm), submits the jobs,
reads what they left, judges each step (acceptance/steps.py) and writes the report.

Every job goes through the one door to Slurm (`slurm.ops`); the load generators are child
processes started, stopped and reaped here by pid (`_LoadGenerators`). The lab it brings up has
its own state folder and ports and is always brought down.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scout_slurm.acceptance.steps import (
    CaseRun,
    CheckpointResult,
    CheckpointRow,
    IncidentFiles,
    LoadResult,
    MapResult,
    ResumeResult,
    Status,
    StepResult,
    Workload,
    fmt_s,
    is_right,
    judge_checkpoints,
    judge_injection,
    judge_map,
    judge_measurements,
    judge_naming,
    judge_resume,
    judge_training,
    judge_under_load,
    naming,
    overall,
    summary_table,
    workload_cannot,
)
from scout_slurm.errors import ScoutError
from scout_slurm.evidence.layout import RANK_PLACES, JobFolder, checkpoint_notes_glob
from scout_slurm.evidence.records import (
    CheckpointNote,
    Finding,
    FindingKind,
    RankPlace,
    StallDecision,
    Verdict,
    VoteCoverage,
    is_fault_injection,
)
from scout_slurm.evidence.store import list_records, read_record
from scout_slurm.inject.spec import KINDS
from scout_slurm.lab.cluster import (
    CLUSTER_NAME,
    Lab,
    LabSpec,
    free_port_base,
    shape_link,
    unshape_link,
)
from scout_slurm.log import configure
from scout_slurm.remediation.plan import is_scout_drain
from scout_slurm.remediation.records import ResumeInstruction
from scout_slurm.slurm import ops

TRAIN = Path(__file__).resolve().parent.parent / "lab" / "train_demo.py"
_DETECTING = {
    FindingKind.STALL_SUSPECT,
    FindingKind.HANG,
    FindingKind.DESYNC,
    FindingKind.CRASH,
    FindingKind.SDC,
    FindingKind.STRAGGLER,
}
_RESUMED = re.compile(r"^rank 0: resumed from (\S+) at step (\d+)$", re.M)
# scout's own finding on each rank of a rerun (bootstrap/ckptstate.py): what it restored
_RESTORED = re.compile(r"^resume verified: rank \d+ restored (\S+) \(step \d+\)")


@dataclass(frozen=True)
class AcceptanceOptions:
    out_dir: Path
    quick: bool = False  # fewer steps and no clean run under load (for tests)
    site: bool = False  # the Slurm cluster SLURM_CONF points at, not a local lab
    lab_state_dir: Path | None = None  # default: a fresh folder, removed afterwards
    lab_port_base: int = 0  # 0: a free block
    nodes: int = 2
    tasks_per_node: int = 2
    partition: str = ""
    account: str = ""
    time_limit: str = ""
    evidence_root: str = ""  # site: default from the site config
    workdir: Path | None = None  # checkpoints and job output; every node must see it (site)
    stall_floor_s: float = 4.0
    job_timeout_s: float = 240.0
    load_tcp_mib: float = 64.0
    load_disk_mib: float = 16.0
    python: str = sys.executable
    side_by_side: bool = True  # two jobs at a time (the lab has four nodes; a job takes two)
    netns: bool = False  # lab: one network namespace per node, so one node's link can be slowed
    # the buyer's training command (a shell command line, run by scout-srun in each job's batch
    # shell) instead of the built-in job; "": the built-in job
    train_command: str = ""
    schema_version: int = 1


@dataclass(frozen=True)
class _Where:
    env: dict[str, str]
    evidence_root: Path
    work: Path
    slow_link_skip: str
    cluster: str = ""  # "" on a site: found from the job's evidence folder
    own_master_port: bool = (
        False  # lab: other labs on this machine reuse job ids, and so scout's ports
    )
    lab_nodes: int = 0  # netns lab: how many nodes the slow-link job spans


@dataclass(frozen=True)
class _Pending:
    case: CaseRun
    job: int
    t0: float
    on_verdict: Callable[[int, JobFolder], None] | None
    awaited: bool = False  # await_verdict() ran: folder and err below are its answer
    folder: JobFolder | None = None
    err: str = ""


class Acceptance:
    """One acceptance run on one cluster: submits the jobs and fills the typed results."""

    def __init__(self, opts: AcceptanceOptions, where: _Where, echo: Callable[[str], None]) -> None:
        self.opts, self.where, self.echo = opts, where, echo
        self.tag = f"{int(time.time())}-{os.getpid()}"
        self.drained: list[str] = []
        self.bundles: list = []  # IncidentBundle of each faulty run, for acceptance.html
        text = "" if opts.train_command else TRAIN.read_text()
        self.has_sched = '"--sched"' in text
        self.has_rng = "get_rng_state" in text
        self.steps = 20 if opts.quick else 30

    # -- jobs --------------------------------------------------------------------------------

    def _script(self, *, inject: str, train: str, pre: str = "", consensus: int = 10) -> str:
        py = self.opts.python
        scout = f"--scout-stall-floor={self.opts.stall_floor_s} --scout-consensus-every={consensus}"
        if inject:
            scout += f" --scout-inject={inject}"
        if (
            self.where.own_master_port
        ):  # every node is this machine: a port free here is free for rank 0
            pre = f"export MASTER_PORT={_free_port()}\n{pre}"
        return f"""#!/bin/bash
export OMP_NUM_THREADS=1
export PATH={Path(py).parent}:$PATH
{pre}
echo "== run ${{SLURM_RESTART_COUNT:-0}} of job $SLURM_JOB_ID on nodes $SLURM_JOB_NODELIST"
scout-srun {scout} {self.opts.train_command or f"{py} {TRAIN} {train}"}
"""

    def _train_args(self, *, ckpt: Path | None, out: Path | None, steps: int | None = None) -> str:
        args = f"--steps {steps or self.steps} --momentum 0.9"
        if self.has_sched:
            args += " --sched"
        if ckpt is not None:
            args += f" --ckpt-dir {ckpt} --ckpt-every 5"
        if out is not None:
            args += f" --out {out}"
        return args

    def submit(
        self, name: str, script: str, *, requeue: bool, shape: tuple[int, int] | None = None
    ) -> int:
        nodes, per_node = shape or (self.opts.nodes, self.opts.tasks_per_node)
        args = [
            f"-N{nodes}",
            f"--ntasks-per-node={per_node}",
            "--open-mode=append",
            f"--output={self.where.work / 'job-%j.out'}",
            f"--job-name=scout-acceptance-{name.replace(' ', '-')}",
        ]
        if not requeue:
            args.append("--no-requeue")
        for flag, value in (
            ("--partition", self.opts.partition),
            ("--account", self.opts.account),
            ("--time", self.opts.time_limit),
        ):
            if value:
                args.append(f"{flag}={value}")
        return ops.submit_batch(script, args, timeout=30, env=self.where.env)

    def output(self, job: int) -> str:
        p = self.where.work / f"job-{job}.out"
        return p.read_text(errors="replace") if p.exists() else ""

    def folder(self, job: int) -> JobFolder | None:
        root = self.where.evidence_root
        if self.where.cluster:
            return JobFolder(root, self.where.cluster, job)
        hits = (
            [c.name for c in sorted(root.iterdir()) if (c / str(job)).is_dir()]
            if root.is_dir()
            else []
        )
        return JobFolder(root, hits[0], job) if len(hits) == 1 else None

    def wait_verdict(self, job: int, restart: int = 0) -> tuple[JobFolder | None, str]:
        """Until run `restart` of the job has its verdict; '' or what went wrong."""
        deadline = time.monotonic() + self.opts.job_timeout_s
        ended_at = 0.0
        while time.monotonic() < deadline:
            f = self.folder(job)
            if f is not None and f.verdict_path(restart).exists():
                return f, ""
            info = self._job_info(job)
            if info is not None and info.is_finished:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > 60:
                    return f, (
                        f"job {job} ended {info.state} but no verdict for run {restart} "
                        "appeared within 60 s "
                        "(is the controller Epilog installed? evidence root "
                        f"{self.where.evidence_root})"
                    )
            time.sleep(0.5)
        return self.folder(
            job
        ), f"no verdict for job {job} run {restart} within {self.opts.job_timeout_s:.0f} s"

    def wait_end(self, job: int) -> str:
        deadline = time.monotonic() + self.opts.job_timeout_s
        while time.monotonic() < deadline:
            info = self._job_info(job)
            if info is not None and info.is_finished:
                return info.state
            time.sleep(0.5)
        try:
            ops.cancel_job(job, timeout=20, env=self.where.env)
        except ScoutError as exc:
            self.echo(f"  note: job {job} could not be cancelled: {exc}")
        return "TIMEOUT (cancelled by scout acceptance)"

    def _job_info(self, job: int):
        """The job's state, or None when Slurm did not answer this time (the wait goes on)."""
        try:
            return ops.job_info(job, timeout=20, env=self.where.env)
        except ScoutError as exc:
            self.echo(f"  note: scontrol did not answer for job {job}: {exc}")
            return None

    def run_case(self, name: str, **kw) -> CaseRun:
        return self.finish_case(self.start_case(name, **kw))

    def start_case(
        self,
        name: str,
        *,
        inject: str,
        expected_kind: str,
        expected_rank: int | None,
        train: str,
        pre: str = "",
        requeue: bool = False,
        under_load: bool = False,
        on_verdict: Callable[[int, JobFolder], None] | None = None,
        fault_label: str = "",
        expected_on_node: str = "",
        injected_at: float = 0.0,
        shape: tuple[int, int] | None = None,
    ) -> _Pending:
        """Submit one case's job; finish_case() waits for it (two cases may run side by side on
        the lab's four nodes)."""
        case = CaseRun(
            name=name,
            fault=fault_label or inject,
            expected_kind=expected_kind,
            expected_rank=expected_rank,
            under_load=under_load,
            expected_on_node=expected_on_node,
            injected_at=injected_at,
        )
        t0 = time.monotonic()
        try:
            job = self.submit(
                name,
                self._script(inject=inject, train=train, pre=pre),
                requeue=requeue,
                shape=shape,
            )
        except ScoutError as exc:
            return _Pending(
                dataclasses.replace(case, error=f"sbatch failed: {exc}"), 0, t0, on_verdict
            )
        self.echo(f"  job {job} ({name}{': ' + case.fault if case.fault else ''}) submitted")
        return _Pending(dataclasses.replace(case, job_id=job), job, t0, on_verdict)

    def await_verdict(self, p: _Pending) -> _Pending:
        """Until the first run's verdict; then the case's callback (what must be seen before a
        rerun).
        """
        if not p.job or p.awaited:
            return p
        folder, err = self.wait_verdict(p.job)
        if p.on_verdict is not None and folder is not None and not err:
            p.on_verdict(p.job, folder)
        return dataclasses.replace(p, awaited=True, folder=folder, err=err)

    def finish_case(self, p: _Pending) -> CaseRun:
        p = self.await_verdict(p)
        case, job, folder, err = p.case, p.job, p.folder, p.err
        if not job:
            return case
        state = self.wait_end(job)
        case = dataclasses.replace(case, final_state=state)
        if folder is None:
            return dataclasses.replace(case, error=err or f"no evidence folder for job {job}")
        case = read_case(case, folder, 0)
        if err:
            case = dataclasses.replace(case, error=err)
        self._undrain(folder)
        if case.fault:
            self._keep_bundle(folder)
        right = is_right(case)
        self.echo(
            f"  job {job} ({case.name}) {state} after {time.monotonic() - p.t0:.0f} s: "
            f"{naming(case)}; "
            f"detect {fmt_s(case.detection_s)}, verdict {fmt_s(case.localisation_s)} "
            f"({'right' if right[0] else 'WRONG: ' + right[1]})"
        )
        return case

    def _keep_bundle(self, folder: JobFolder) -> None:
        """The incident of the faulty run, for the HTML page (read now: the lab's folder goes)."""
        try:
            from scout_slurm.report.bundle_loader import load_incident_bundle

            self.bundles.append(load_incident_bundle(folder, 0))
        except Exception as exc:  # noqa: BLE001 - the page is a view; the steps do not depend on it
            self.echo(f"  note: incident of job {folder.job_id} not drawn: {exc!r}")

    def _undrain(self, folder: JobFolder) -> None:
        """Nodes scout drained for a fault acceptance injected itself are healthy: return them."""
        try:
            for n in ops.list_nodes(timeout=20, env=self.where.env):
                if n.is_drained and is_scout_drain(n.reason, folder.job_id):
                    ops.resume_node(n.name, timeout=20, env=self.where.env)
                    self.drained.append(n.name)
        except ScoutError as exc:  # e.g. a site where this user may not resume nodes: say so, go on
            self.echo(
                f"  note: nodes drained for job {folder.job_id} not returned to service ({exc}); "
                f"an operator runs `scout undrain NODE`"
            )

    # -- the steps ---------------------------------------------------------------------------

    def query_map(self, job: int) -> MapResult:
        info = self._job_info(job)
        # a job Slurm no longer lists has ended too (a site's MinJobAge may have passed)
        ended = info is None or info.is_finished
        res = _scout(self.opts.python, self.where.env, "map", str(job), "--json")
        if res.returncode != 0:
            return MapResult(job, 0, ended, error=(res.stderr or res.stdout).strip()[-500:])
        try:
            obj = json.loads(res.stdout)
            rows = tuple(
                (int(r["rank"]), str(r["node"]), str(r["nic"]), tuple(r["gpu_uuids"]))
                for r in obj["ranks"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            return MapResult(job, 0, ended, error=f"unreadable JSON: {exc}")
        return MapResult(
            job,
            self.opts.nodes * self.opts.tasks_per_node,
            ended,
            rows,
            tuple(str(p) for p in obj.get("problems", ())),
        )

    def query_checkpoints(self, job: int, folder: JobFolder, fault_step: int) -> CheckpointResult:
        res = _scout(self.opts.python, self.where.env, "checkpoints", str(job), "--json")
        fss = -1
        try:
            fss = read_record(folder.verdict_path(0), Verdict, root=folder.root).first_suspect_step
        except ScoutError:
            pass
        if res.returncode != 0:
            return CheckpointResult(
                job, fault_step, fss, error=(res.stderr or res.stdout).strip()[-500:]
            )
        try:
            obj = json.loads(res.stdout)
            rows = tuple(
                CheckpointRow(int(c["run"]), int(c["step"]), str(c["status"]), str(c["reason"]))
                for c in obj["checkpoints"]
            )
            point = obj.get("recovery_point") or ""
            steps = [
                int(c["step"])
                for c in obj["checkpoints"]
                if c["path"] == point and int(c["run"]) == 0
            ]
        except (ValueError, KeyError, TypeError) as exc:
            return CheckpointResult(job, fault_step, fss, error=f"unreadable JSON: {exc}")
        rule = str(obj.get("rule", ""))
        try:  # what the controller chose for the rerun, with its reason: the rule as applied
            chosen = read_record(folder.resume_path(1), ResumeInstruction, root=folder.root)
            point, steps, rule = (
                chosen.checkpoint,
                [chosen.step],
                f"{chosen.reason} (applied by the controller)",
            )
        except (ScoutError, OSError):
            pass
        return CheckpointResult(job, fault_step, fss, rows, point, steps[0] if steps else -1, rule)

    def resume_result(
        self,
        case: CaseRun,
        folder: JobFolder,
        ref: Path,
        final: Path,
        clean_folder: JobFolder | None = None,
    ) -> ResumeResult:
        info = self._job_info(case.job_id)
        out = self.output(case.job_id)
        resumed = _RESUMED.findall(out)
        chosen = ""
        try:
            chosen = read_record(
                folder.resume_path(1), ResumeInstruction, root=folder.root
            ).checkpoint
        except (ScoutError, OSError):
            pass
        checks: tuple[str, ...] = ()
        shown = _scout(
            self.opts.python, self.where.env, "show", str(case.job_id), "--json", "--restart", "1"
        )
        if shown.returncode == 0:
            try:
                checks = tuple(
                    str(f.get("summary", "")) for f in json.loads(shown.stdout).get("resume") or ()
                )
            except ValueError:
                pass
        compared = (
            ["model", "optimizer"]
            + (["scheduler"] if self.has_sched else [])
            + (["RNG (torch, python, numpy)"] if self.has_rng else [])
        )
        restarts = info.restart_count if info is not None else len(folder.restarts()) - 1
        if self.opts.train_command:
            # a buyer's workload writes no digest of its own: what the rerun restored is scout's
            # record of it, and its end state the last checkpoint record both runs signed
            restored = [m.group(1) for s in checks if (m := _RESTORED.match(s))]
            final_digest, reference_digest, compared = "", "", ()
            if clean_folder is not None:
                final_digest, reference_digest, compared = last_common_state(
                    (folder, 1), (clean_folder, 0)
                )
            return ResumeResult(
                job_id=case.job_id,
                restarts=restarts,
                final_state=case.final_state,
                resumed_from=restored[0] if restored else "",
                recovery_point=chosen,
                final_digest=final_digest,
                reference_digest=reference_digest,
                compared=compared,
                resume_check=checks,
            )
        return ResumeResult(
            job_id=case.job_id,
            restarts=restarts,
            final_state=case.final_state,
            resumed_from=resumed[-1][0] if resumed else "",
            recovery_point=chosen,
            final_digest=_read_small(final),
            reference_digest=_read_small(ref),
            compared=tuple(compared),
            resume_check=checks,
        )


def check_train_command(command: str) -> str:
    """The buyer's --train command as it goes into the batch script: one shell command line that
    parses; raises ValueError saying what is wrong."""
    command = command.strip()
    if not command:
        return ""
    if "\n" in command or "\r" in command:
        raise ValueError("one command line, without line breaks")
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"{command!r} is not a shell command line: {exc}") from None
    if not argv:
        raise ValueError("the command is empty")
    return command


def checkpoint_states(folder: JobFolder, restart: int) -> dict[int, dict[str, str]]:
    """The state each checkpoint record of one run signed, by step: component -> the replicas'
    majority signature (or the saving rank's). Records without signatures are left out."""
    notes, _ = list_records(
        folder.checkpoints_dir,
        checkpoint_notes_glob(restart),
        CheckpointNote,
        root=folder.root,
    )
    out: dict[int, dict[str, str]] = {}
    for n in notes:
        sigs = {g.component: g.majority or g.saved for g in n.signatures}
        sigs = {c: v for c, v in sigs.items() if v and not c.startswith("rng_")}
        if sigs:
            out.setdefault(n.step, {}).update(sigs)
    return out


def last_common_state(
    run: tuple[JobFolder, int], reference: tuple[JobFolder, int]
) -> tuple[str, str, tuple[str, ...]]:
    """The last step both runs saved with signatures: (run's digest, reference's, components)."""
    mine, theirs = checkpoint_states(*run), checkpoint_states(*reference)
    common = sorted(set(mine) & set(theirs))
    if not common:
        return "", "", ()
    step = common[-1]
    comps = tuple(sorted(set(mine[step]) & set(theirs[step])))
    if not comps:
        return "", "", ()

    def digest(sigs: dict[str, str]) -> str:
        return f"step {step}: " + ", ".join(f"{c} {sigs[c][:16]}" for c in comps)

    return digest(mine[step]), digest(theirs[step]), (f"step {step}",) + comps


def read_workload(command: str, clean: JobFolder | None, numeric: JobFolder | None) -> Workload:
    """What the training offered: its steps and replicas (the clean run's vote coverage), and
    the checkpoints the numerical case's first run recorded."""
    steps, replicas, saved = -1, 0, 0
    if clean is not None:
        try:
            cov = read_record(clean.coverage_path(0), VoteCoverage, root=clean.root)
            steps, replicas = cov.steps, cov.replicas
        except (ScoutError, OSError):
            pass
    if numeric is not None:
        saved = len(checkpoint_records(numeric, 0))
    return Workload(command=command, steps=steps, replicas=replicas, checkpoints=saved)


def checkpoint_records(folder: JobFolder, restart: int) -> list[Path]:
    """The checkpoint records of one run, signed or not."""
    d = folder.checkpoints_dir
    return sorted(d.glob(checkpoint_notes_glob(restart))) if d.is_dir() else []


def read_case(case: CaseRun, folder: JobFolder, restart: int) -> CaseRun:
    """Fill a case from the job's evidence folder: places, injection, detection, verdict, files."""
    root = folder.root
    places, _ = list_records(folder.ranks_dir(restart), RANK_PLACES, RankPlace, root=root)
    findings, _ = list_records(folder.findings_dir(restart), "*.json", Finding, root=root)
    injected = [f.at for f in findings if is_fault_injection(f)]
    detections = [f.at for f in findings if f.kind in _DETECTING]
    sd = folder.stall_decision_path(restart)
    if sd.exists():
        try:
            d = read_record(sd, StallDecision, root=root)
            if d.culprits:
                detections.append(d.at)
        except ScoutError:
            pass
    verdict = None
    try:
        verdict = read_record(folder.verdict_path(restart), Verdict, root=root)
    except (ScoutError, OSError):
        pass
    named = tuple((s.rank, s.node) for s in verdict.suspects) if verdict else ()
    components = sorted(
        {
            f.component
            for f in findings
            if f.kind in _DETECTING and f.component and any(f.rank == r for r, _ in named)
        }
    )
    return dataclasses.replace(
        case,
        world_size=max((p.world_size for p in places), default=0),
        rank_nodes=tuple(sorted((p.rank, p.node) for p in places)),
        injected_at=min(injected, default=case.injected_at),
        detected_at=min(detections, default=0.0),
        verdict_at=verdict.created_at if verdict else 0.0,
        verdict_kind=verdict.kind.value if verdict else "",
        named=named,
        component=",".join(components),
        incident=incident_files(folder.path),
    )


def incident_files(path: Path, *, limit: int = 100_000) -> IncidentFiles:
    """Files and bytes under the job's evidence folder (no links followed), the three largest."""
    sizes: list[tuple[str, int]] = []
    for dirpath, _dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_symlink():
                continue
            sizes.append((str(p.relative_to(path)), st.st_size))
            if len(sizes) >= limit:
                break
    largest = tuple(sorted(sizes, key=lambda x: -x[1])[:3])
    return IncidentFiles(len(sizes), sum(s for _, s in sizes), largest)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_small(path: Path) -> str:
    try:
        return path.read_text()[:4096].strip()
    except OSError:
        return ""


def _scout(python: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The operator's own command, as a buyer would type it."""
    return subprocess.run(
        [python, "-m", "scout_slurm.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


class _LoadGenerators:
    """The TCP and disk load, as child processes tracked by pid; stopped (SIGTERM, then SIGKILL)
    and reaped in stop(), also when the run fails."""

    def __init__(
        self, python: str, stats_dir: Path, disk_dir: Path, tcp_mib: float, disk_mib: float
    ) -> None:
        self.stats_dir, self.disk_dir = stats_dir, disk_dir
        stats_dir.mkdir(parents=True, exist_ok=True)
        base = [python, "-m", "scout_slurm.acceptance.load"]
        self.procs = [
            subprocess.Popen(
                base + ["tcp", "--stats", str(stats_dir / "tcp.json"), "--rate-mib", str(tcp_mib)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            ),
            subprocess.Popen(
                base
                + [
                    "disk",
                    "--stats",
                    str(stats_dir / "disk.json"),
                    "--dir",
                    str(disk_dir),
                    "--rate-mib",
                    str(disk_mib),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            ),
        ]
        self.started = time.monotonic()

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.procs)

    def stop(self) -> LoadResult:
        seconds = time.monotonic() - self.started
        errors = []
        for p in self.procs:
            if p.poll() is not None:
                errors.append(
                    f"load generator pid {p.pid} had already ended (exit {p.returncode}): "
                    f"{(p.stderr.read() or b'').decode(errors='replace')[-300:]}"
                )
            else:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
            if p.stderr:
                p.stderr.close()
        stopped = all(p.poll() is not None for p in self.procs)

        def moved(name: str) -> int:
            try:
                return int(json.loads((self.stats_dir / name).read_text())["bytes"])
            except (OSError, ValueError, KeyError):
                return 0

        return LoadResult(
            seconds=seconds,
            tcp_bytes=moved("tcp.json"),
            disk_bytes=moved("disk.json"),
            disk_path=str(self.disk_dir),
            pids=self.pids,
            stopped=stopped,
            error="; ".join(errors),
        )


def run_acceptance(opts: AcceptanceOptions, echo: Callable[[str], None]) -> int:
    """The whole acceptance test; 0 only if every step that was not skipped passed."""
    started = time.time()
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    # every Slurm call is logged (argv, exit code, duration): into a file beside the report, so
    # that the terminal shows the steps
    calls = open(opts.out_dir / "slurm-calls.log", "a")
    configure(stream=calls, json=True)
    lab: Lab | None = None
    temp_state: Path | None = None
    try:
        if opts.site:
            where = _site_where(opts)
            echo(
                "scout acceptance on the site's Slurm "
                f"(SLURM_CONF={where.env.get('SLURM_CONF', '(default)')}), "
                f"evidence {where.evidence_root}, work {where.work}"
            )
        else:
            state = opts.lab_state_dir
            if state is None:
                state = temp_state = Path(tempfile.mkdtemp(prefix="scout-acceptance-lab-"))
            nodes = max(4, 2 * opts.nodes)  # two jobs side by side
            port = opts.lab_port_base or free_port_base(nodes + 2, 30000, 32000)
            lab = Lab(
                LabSpec(
                    state_dir=state,
                    nodes=nodes,
                    port_base=port,
                    python=opts.python,
                    netns=opts.netns,
                )
            )
            echo(
                f"starting a local {nodes}-node Slurm lab in {state} (ports "
                f"{port}..{port + nodes}) ..."
            )
            lab.up()
            lab.paths.work.mkdir(parents=True, exist_ok=True)
            where = _Where(
                env=lab.client_env(),
                evidence_root=lab.paths.evidence,
                work=lab.paths.work,
                cluster=CLUSTER_NAME,
                own_master_port=not opts.netns,
                lab_nodes=nodes,
                slow_link_skip=""
                if opts.netns
                else (
                    "the local lab runs every node as a `slurmd -N` on 127.0.0.1: there is no "
                    "per-node link "
                    "to shape (`scout acceptance --netns` can: one network namespace per node)"
                ),
            )
        acc = Acceptance(opts, where, echo)
        steps, cases = _run_steps(acc, echo)
    finally:
        if lab is not None:
            lab.down()
            echo("lab stopped")
        if temp_state is not None and not os.environ.get("SCOUT_KEEP_LAB"):
            shutil.rmtree(temp_state, ignore_errors=True)
        configure()
        calls.close()
    finished = time.time()
    passed = overall(steps)
    write_reports(opts, steps, cases, started, finished, passed, echo, bundles=tuple(acc.bundles))
    echo("")
    echo(summary_table(steps).rstrip())
    echo(
        f"\nACCEPTANCE {'PASSED' if passed else 'FAILED'} in {finished - started:.0f} s: "
        f"{sum(s.status is Status.PASS for s in steps)} passed, "
        f"{sum(s.status is Status.FAIL for s in steps)} failed, "
        f"{sum(s.status is Status.SKIPPED for s in steps)} skipped; report in {opts.out_dir}"
    )
    return 0 if passed else 1


def _site_where(opts: AcceptanceOptions) -> _Where:
    from scout_slurm.config import load_config

    root = opts.evidence_root or load_config(os.environ).evidence.root
    work = opts.workdir or (opts.out_dir / "work")
    work.mkdir(parents=True, exist_ok=True)
    return _Where(
        env=dict(os.environ),
        evidence_root=Path(root),
        work=work,
        slow_link_skip="scout acceptance does not shape links on a site's production network",
    )


def _run_steps(
    acc: Acceptance, echo: Callable[[str], None]
) -> tuple[list[StepResult], list[CaseRun]]:
    steps: list[StepResult] = []
    all_cases: list[CaseRun] = []
    work, tag, q = acc.where.work, acc.tag, acc.opts.quick

    def report(step: StepResult) -> None:
        steps.append(step)
        extra = f" ({step.detail})" if step.status is not Status.PASS else ""
        echo(f"[step {step.step}] {step.status.value}: {step.title}; {step.figures}{extra}")

    world = acc.opts.nodes * acc.opts.tasks_per_node
    pair = acc.opts.side_by_side

    # phase A: a clean run (steps 1, 2; the uninterrupted reference for step 7) beside the
    # numerical case (3c, 6, 7: a bit flipped on rank 0, checkpoints, requeue, resume)
    ref = work / f"acceptance-{tag}-reference.txt"
    fault_step = 12
    final = work / f"acceptance-{tag}-resumed.txt"
    ck_holder: list[CheckpointResult] = []

    def on_verdict(job: int, folder: JobFolder) -> None:
        # the listing as the controller saw it, before the rerun writes over the same file names
        ck_holder.append(acc.query_checkpoints(job, folder, fault_step))

    if acc.opts.train_command:
        echo(f"training with the buyer's command: {acc.opts.train_command}")
    echo("[step 1] start: a clean training job across the nodes (also the reference for step 7)")
    p_clean = acc.start_case(
        "clean",
        inject="",
        expected_kind="clean",
        expected_rank=None,
        train=acc._train_args(ckpt=work / f"acceptance-{tag}-ck-clean", out=ref),
    )
    if not pair:
        clean = acc.finish_case(p_clean)
    echo(
        "[step 3c] start: a reversible numerical perturbation (one bit of one weight on rank 0), "
        "with checkpoints, requeue and resume"
    )
    p_num = acc.start_case(
        "numerical",
        inject=f"bitflip,bit=3,rank=0,step={fault_step}",
        expected_kind="sdc",
        expected_rank=0,
        requeue=True,
        on_verdict=on_verdict,
        train=acc._train_args(ckpt=work / f"acceptance-{tag}-ck-numerical", out=final),
    )
    p_num = acc.await_verdict(p_num)
    if pair:
        clean = acc.finish_case(p_clean)
    all_cases.append(clean)
    report(judge_training(clean, min_nodes=2, expected_world=world))
    echo("[step 2] start: `scout map` of the clean job, after it ended")
    report(judge_map(acc.query_map(clean.job_id) if clean.job_id else None))
    numeric = acc.finish_case(p_num)
    all_cases.append(numeric)
    workload = read_workload(
        acc.opts.train_command,
        acc.folder(clean.job_id) if clean.job_id else None,
        acc.folder(numeric.job_id) if numeric.job_id else None,
    )
    if not workload.is_builtin:
        echo(
            f"  the workload: trained to step {workload.steps if workload.steps >= 0 else '?'}, "
            f"replica groups of {workload.replicas or '?'}, {workload.checkpoints} checkpoint "
            "record(s) in the numerical case's first run"
        )
    shown: dict[str, bool] = {}  # case name -> step 3 could show it with this workload

    def report_fault(step: str, title: str, case: CaseRun, cannot: str) -> StepResult:
        result = judge_injection(step, title, case, cannot=cannot)
        shown[case.name] = result.status is not Status.SKIPPED
        report(result)
        return result

    num_step = report_fault(
        "3c",
        "inject a reversible numerical perturbation",
        numeric,
        workload_cannot(workload, at_step=fault_step, needs_steps=fault_step + 1, votes=True),
    )

    # phase B: a process stall (3a) beside a bounded compute slowdown (3b, timing votes)
    stall_rank, slow_rank = 1 % world, world - 1
    echo("[step 3a] start: a process stall (sleep in the training loop)")
    p_stall = acc.start_case(
        "stall",
        inject=f"sleep,rank={stall_rank},step=8",
        expected_kind="hang",
        expected_rank=stall_rank,
        train=acc._train_args(ckpt=None, out=None),
    )
    if not pair:
        stall = acc.finish_case(p_stall)
    slow: CaseRun | None = None
    p_slow: _Pending | None = None
    echo("[step 3b] start: a bounded compute slowdown (a delay after every step on one rank)")
    if "delay" in KINDS:
        p_slow = acc.start_case(
            "slowdown",
            inject=f"delay,rank={slow_rank},step=6,seconds=0.25",
            expected_kind="straggler",
            expected_rank=slow_rank,
            train=acc._train_args(ckpt=None, out=None, steps=16),
            pre="export SCOUT_TIMING_EVERY=5",
        )
    if pair:
        stall = acc.finish_case(p_stall)
    all_cases.append(stall)
    stall_cannot = workload_cannot(workload, at_step=8)
    report_fault("3a", "inject a process stall", stall, stall_cannot)
    if p_slow is not None:
        slow = acc.finish_case(p_slow)
        all_cases.append(slow)
        report_fault(
            "3b",
            "inject a bounded compute slowdown",
            slow,
            workload_cannot(workload, at_step=6, needs_steps=16),
        )
    else:
        report(
            StepResult(
                "3b",
                "inject a bounded compute slowdown",
                Status.FAIL,
                detail="this version of scout has no `delay` fault kind: no slowdown can be "
                "injected",
            )
        )
    link: CaseRun | None = None
    echo("[step 3d] start: a slow link")
    if acc.where.slow_link_skip:
        report(
            StepResult("3d", "inject a slow link", Status.SKIPPED, detail=acc.where.slow_link_skip)
        )
    else:
        link = slow_link_case(acc)
        all_cases.append(link)
        report(judge_injection("3d", "inject a slow link", link))
    rerun_clean: CaseRun | None = None
    folder = acc.folder(numeric.job_id) if numeric.job_id else None
    if folder is not None and folder.verdict_path(1).exists():
        rerun_clean = read_case(
            CaseRun(
                name="numerical rerun",
                fault="",
                expected_kind="clean",
                expected_rank=None,
                job_id=numeric.job_id,
                final_state=numeric.final_state,
            ),
            folder,
            1,
        )
    ran = [c for c in (stall, slow, numeric, link) if c is not None]
    injected = [c for c in ran if shown.get(c.name, True)]
    not_shown = [c.name for c in ran if not shown.get(c.name, True)]
    cleans = [c for c in (clean, rerun_clean) if c is not None]
    report(judge_measurements(injected, cleans, not_shown=not_shown))
    report(judge_naming(injected, not_shown=not_shown))
    num_cannot = num_step.detail if num_step.status is Status.SKIPPED else ""
    ck = (
        ck_holder[0]
        if ck_holder
        else CheckpointResult(
            numeric.job_id,
            fault_step,
            -1,
            error=numeric.error or "no verdict: checkpoints not listed",
        )
    )
    ck_step = judge_checkpoints(ck, workload, cannot=num_cannot)
    # a workload that saved nothing before the fault leaves nothing to resume from
    saved_before = any(r.run == 0 and r.step < fault_step for r in ck.rows)
    report(ck_step)
    clean_folder = acc.folder(clean.job_id) if clean.job_id else None
    report(
        judge_resume(
            acc.resume_result(numeric, folder, ref, final, clean_folder)
            if folder is not None and not numeric.error
            else ResumeResult(
                numeric.job_id,
                0,
                numeric.final_state,
                "",
                "",
                "",
                "",
                error=numeric.error or "no evidence folder",
            ),
            workload,
            cannot=num_cannot
            or (
                ck_step.detail
                if ck_step.status is Status.SKIPPED and not (workload.is_builtin or saved_before)
                else ""
            ),
        )
    )

    # 8: a reduced set again under load
    echo(
        "[step 8] start: loopback TCP stream and a disk writer in the evidence file system, then "
        + ("a stall" if q else "a clean run and a stall")
        + " again"
    )
    shrink = (
        4 if q else 1
    )  # quick: a quarter of the rates, so that 2 cores still run the jobs in time
    gens = _LoadGenerators(
        acc.opts.python,
        work / f"acceptance-{tag}-load",
        acc.where.evidence_root,
        acc.opts.load_tcp_mib / shrink,
        acc.opts.load_disk_mib / shrink,
    )
    echo(f"  load generators running: pids {', '.join(map(str, gens.pids))}")
    loaded: list[CaseRun] = []
    try:
        pending = []
        if not q:
            pending.append(
                acc.start_case(
                    "clean under load",
                    inject="",
                    expected_kind="clean",
                    expected_rank=None,
                    train=acc._train_args(ckpt=None, out=None),
                    under_load=True,
                )
            )
            if not pair:
                loaded.append(acc.finish_case(pending.pop()))
        pending.append(
            acc.start_case(
                "stall under load",
                inject=f"sleep,rank={stall_rank},step=8",
                expected_kind="hang",
                expected_rank=stall_rank,
                train=acc._train_args(ckpt=None, out=None),
                under_load=True,
            )
        )
        loaded += [acc.finish_case(p) for p in pending]
    finally:
        load = gens.stop()
    echo(
        f"  load generators stopped: {load.tcp_bytes >> 20} MiB over TCP, "
        f"{load.disk_bytes >> 20} MiB to disk "
        f"in {load.seconds:.0f} s"
    )
    all_cases += loaded
    report(judge_under_load(load, loaded, cannot=stall_cannot))
    if rerun_clean is not None:
        all_cases.append(rerun_clean)
    return sorted(steps, key=lambda s: s.step), all_cases


def slow_link_case(acc: Acceptance) -> CaseRun:
    """netns lab: slow one node's own interface (tc inside its namespace), run a job with one rank
    on each node, and undo the shaping, also on failure. Timing votes' link probes should name
    that node as a communication straggler."""
    node = "n3"
    shaped, why = shape_link(node)
    if not shaped:
        return CaseRun(
            name="slow link",
            fault=f"slow link on {node}",
            expected_kind="straggler",
            expected_rank=None,
            expected_on_node=node,
            error=why,
        )
    try:
        p = acc.start_case(
            "slow link",
            inject="",
            fault_label=f"{shaped} on {node}'s interface",
            expected_kind="straggler",
            expected_rank=None,
            expected_on_node=node,
            injected_at=time.time(),
            shape=(acc.where.lab_nodes, 1),
            train=acc._train_args(ckpt=None, out=None, steps=11),
            pre="export SCOUT_TIMING_EVERY=5 SCOUT_TIMING_PROBE_BYTES=131072",
        )
        return acc.finish_case(p)
    finally:
        unshape_link(node)


def write_reports(
    opts: AcceptanceOptions,
    steps: list[StepResult],
    cases: list[CaseRun],
    started: float,
    finished: float,
    passed: bool,
    echo: Callable[[str], None],
    bundles: tuple = (),
) -> None:
    obj = {
        "schema_version": 1,
        "passed": passed,
        "started_at": started,
        "finished_at": finished,
        "options": {k: str(v) for k, v in dataclasses.asdict(opts).items()},
        "steps": [dataclasses.asdict(s) | {"status": s.status.value} for s in steps],
        "cases": [
            dataclasses.asdict(c)
            | {
                "detection_s": c.detection_s,
                "localisation_s": c.localisation_s,
                "named_as": naming(c),
                "right": is_right(c)[0],
            }
            for c in cases
        ],
    }
    (opts.out_dir / "acceptance.json").write_text(json.dumps(obj, indent=2))
    (opts.out_dir / "acceptance.md").write_text(
        render_markdown(steps, cases, started, finished, passed, opts.train_command)
    )
    try:
        html = render_html(steps, cases, started, finished, opts, bundles)
        (opts.out_dir / "acceptance.html").write_text(html)
    except Exception as exc:  # noqa: BLE001 - the page is a view; the JSON and Markdown are the record
        echo(f"note: acceptance.html not written: {exc!r}")


def render_markdown(
    steps: list[StepResult],
    cases: list[CaseRun],
    started: float,
    finished: float,
    passed: bool,
    train_command: str = "",
) -> str:
    t = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
    workload = (
        f"The buyer's training command (`--train`): `{train_command}`"
        if train_command
        else "The built-in training job."
    )
    lines = [
        f"# scout acceptance: {'PASSED' if passed else 'FAILED'}",
        "",
        f"Started {t}, took {finished - started:.0f} s. {workload}",
        "",
        summary_table(steps),
        "## Cases",
        "",
        "| case | job | fault | named | right | to detection | to verdict | incident kept |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in cases:
        kept = f"{c.incident.files} files, {c.incident.bytes} B" if c.incident else "-"
        lines.append(
            f"| {c.name} | {c.job_id} | {c.fault or '-'} | {naming(c)} | "
            f"{'yes' if is_right(c)[0] else 'NO'} "
            f"| {fmt_s(c.detection_s)} | {fmt_s(c.localisation_s)} | {kept} |"
        )
    lines += ["", "## Details", ""]
    lines += [f"- **{s.step}** {s.title}: {s.status.value}. {s.detail}" for s in steps]
    return "\n".join(lines) + "\n"


def render_html(
    steps: list[StepResult],
    cases: list[CaseRun],
    started: float,
    finished: float,
    opts: AcceptanceOptions,
    bundles: tuple = (),
) -> str:
    from scout_slurm.report.html import (
        AcceptanceCheck,
        AcceptanceReport,
        LatencyCase,
        render_acceptance_html,
    )

    checks = tuple(
        AcceptanceCheck(
            step=f"{s.step} {s.title}",
            passed=None if s.status is Status.SKIPPED else s.status is Status.PASS,
            detail=s.detail,
            measured=s.figures,
        )
        for s in steps
    )
    lat = tuple(
        LatencyCase(
            case=c.name,
            expected=(
                f"rank {c.expected_rank} on {c.expected_node}, {c.expected_kind}"
                if c.expected_rank is not None
                else "nobody"
            ),
            named=naming(c),
            correct=is_right(c)[0],
            detection_s=c.detection_s,
            localisation_s=c.localisation_s,
            job_id=c.job_id,
        )
        for c in cases
        if c.fault
    )
    return render_acceptance_html(
        AcceptanceReport(
            title="scout acceptance",
            cluster="local lab" if not opts.site else "site",
            started_at=started,
            finished_at=finished,
            checks=checks,
            cases=lat,
            incidents=bundles,
            notes=tuple(f"{c.name}: job {c.job_id}, {naming(c)}" for c in cases if not c.fault),
        )
    )
