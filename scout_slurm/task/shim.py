"""`scout-task`: the per-task shim that srun starts in place of the training command.

It sets the torch environment from Slurm's, records the rank's place, opens the progress record,
puts the bootstrap on PYTHONPATH, starts the command as its child and becomes its out-of-band
watchdog (see `watchdog.Watchdog`). Its exit status is the child's, or one of `exitcodes`.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import scout_slurm
from scout_slurm import jobconfig
from scout_slurm.config import CONFIG_ENV, SiteConfig, load_config
from scout_slurm.errors import ScoutError
from scout_slurm.evidence.digest import MAX_TASKS_PER_NODE
from scout_slurm.evidence.layout import TORCH_FR_DUMP_PREFIX, JobFolder
from scout_slurm.evidence.records import NodeTasks, RankPlace
from scout_slurm.evidence.store import read_record
from scout_slurm.evidence.writer import EvidenceWriter
from scout_slurm.jobconfig import Problem, problems_message, read_settings, site_defaults
from scout_slurm.jobenv import TaskContext, task_context
from scout_slurm.log import TaskLog, configure, get_logger, level_from_env
from scout_slurm.slurm.hostlist import expand_hostlist
from scout_slurm.task import apptainer, exitcodes
from scout_slurm.task import progress as progress_mod
from scout_slurm.task.stderrtail import StderrTail

log = get_logger("scout.task")
BOOTSTRAP_DIR = Path(scout_slurm.__file__).parent / "bootstrap" / "site"
PORT_BASE, PORT_SPAN = 10000, 16000
# how long the evidence root may take to answer a first look at start, and to take the task's
# last records (its exit record) at the end: past either, the task goes on without them
ROOT_PROBE_S = 10.0
EXIT_FLUSH_S = 5.0


def master_port(job_id: int, step_id: int) -> int:
    """A port from the job and step: distinct for concurrent jobs whose ids differ by less
    than 2000 and for up to 8 concurrent steps of one job (pure)."""
    return PORT_BASE + ((job_id % 2000) * 8 + (step_id % 8)) % PORT_SPAN


def reserved_port(environ: Mapping[str, str]) -> int | None:
    """The first of the ports Slurm reserved for this step (`srun --resv-ports` under
    `MpiParams=ports=...`: no other step on the node gets them), None when none was (pure)."""
    text = environ.get("SLURM_STEP_RESV_PORTS", "")
    first = text.split(",")[0].split("-")[0].strip()
    return int(first) if first.isdigit() and 0 < int(first) < 65536 else None


def _resolvable(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def own_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def torch_environment(
    ctx: TaskContext, environ: Mapping[str, str], *, master_addr: str
) -> dict[str, str]:
    """The variables torch.distributed reads, unless the caller set them already (pure)."""
    wanted = {
        "RANK": str(ctx.rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_RANK": str(ctx.local_rank),
        "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
        "MASTER_ADDR": master_addr,
        # scout-srun draws one at random for the step; Slurm's reserved ports where the site
        # gives them; else (scout-task started by another launcher) one from the job and step
        "MASTER_PORT": str(reserved_port(environ) or master_port(ctx.job_id, ctx.step_id)),
    }
    return {k: v for k, v in wanted.items() if not environ.get(k)}


def _wait_for_master(folder: JobFolder, ctx: TaskContext, timeout: float) -> str:
    """The address rank 0 published in its place record (for nodes whose names do not resolve)."""
    path = folder.rank_place_path(ctx.restart, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            try:
                place = read_record(path, RankPlace, root=folder.root)
                if place.master_addr:
                    return place.master_addr
            except ScoutError:
                pass
        time.sleep(0.1)
    raise ScoutError(
        f"rank 0 did not publish its address in {path} within {timeout:.0f} s; "
        "set MASTER_ADDR yourself or check the evidence folder is shared"
    )


def is_torchrun(command: Sequence[str]) -> bool:
    """Is the command a launcher that starts several ranks itself (torchrun)? (pure)"""
    words = [os.path.basename(w) for w in command[:4]]
    if words and words[0] == "torchrun":
        return True
    return (
        len(words) >= 3
        and words[0].startswith("python")
        and words[1] == "-m"
        and words[2] in ("torch.distributed.run", "torch.distributed.launch")
    )


def parse_args(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if "--" in argv:
        argv = argv[argv.index("--") + 1 :]
    if not argv:
        raise ScoutError("scout-task: no command given; usage: scout-task -- COMMAND [ARGS...]")
    return argv


def prepare_dirs(folder: JobFolder, restart: int) -> None:
    for d in (
        folder.ranks_dir(restart),
        folder.progress_dir(restart),
        folder.findings_dir(restart),
        folder.stacks_dir(restart),
        folder.checkpoints_dir,
    ):
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ScoutError(
                f"cannot create the evidence folder {d} ({exc.strerror}): the site's Prolog "
                "lays it "
                f"out; check {CONFIG_ENV} names the site's config"
            ) from None


def unprepared(folder: JobFolder, restart: int) -> str:
    """Why the site's hooks will not see this job's evidence, or "" when the site's Prolog laid out
    this job's folder under this root: a root-owned job folder holding `nodes/` and this run's
    folder
    (a job cannot make a folder root's). Reads metadata only."""
    import stat as stat_mod

    if not folder.root.is_dir():
        return f"the evidence root {folder.root} does not exist on this node"
    try:
        st = os.lstat(folder.path)
    except OSError:
        return (
            f"no Prolog laid out {folder.path}: scout's Prolog is not the site's Prolog on "
            "this cluster, "
            "or the site's hooks use another config and evidence root than this job"
        )
    if not stat_mod.S_ISDIR(st.st_mode) or st.st_uid != 0:
        return f"{folder.path} is not a root-owned folder: the site's Prolog did not make it"
    if not folder.run_dir(restart).is_dir() or not folder.nodes_dir.is_dir():
        return (
            f"the site's Prolog did not lay out {folder.run_dir(restart)} (is PrologFlags=Alloc "
            "set?)"
        )
    return ""


def _warn_unprepared(why: str, ctx: TaskContext, environ: Mapping[str, str], root: str) -> None:
    """Loud, once a node (local rank 0), in the job's own output: the job runs on, unwatched by
    the site.
    """
    if ctx.local_rank != 0:
        return
    from scout_slurm.config import CONFIG_ENV, DEFAULT_CONFIG_PATH

    config = (
        environ.get(CONFIG_ENV) or f"{DEFAULT_CONFIG_PATH} (the default; {CONFIG_ENV} is not set)"
    )
    print(
        f"scout: WARNING on {ctx.node}: the site's hooks will not see this job's evidence: {why}. "
        f"This job's config: {config}; its evidence root: {root}. The job runs, but a failure "
        "will not be "
        "localised, nor its node drained, nor the job requeued. Ask your site which "
        f"{CONFIG_ENV} to use.",
        file=sys.stderr,
        flush=True,
    )


def _every(k: int, name: str, problems: Sequence[Problem]) -> str:
    bad = [p for p in problems if p.name == name]
    if bad:
        return f"unreadable ({name}={bad[0].value!r})"
    return f"every {k} steps" if k > 0 else "off"


def banner(ctx: TaskContext, cfg: SiteConfig, environ: Mapping[str, str], folder: JobFolder) -> str:
    """The line scout prints in the job's output at start (rank 0): what is watched whatever the
    command is, and where the evidence goes (pure). At start scout cannot know whether the command
    will use torch.distributed, so it promises only the exit watch; what else is on is said by
    `init_banner`, once rank 0 enters init_process_group. A program that never does (data
    preparation, an evaluation script) shows this line alone."""
    return (
        f"scout: watching job {ctx.job_id} (run {ctx.restart}, {ctx.world_size} ranks): each "
        "task's exit; "
        "a task whose process never calls torch.distributed's init_process_group is watched "
        "for its exit "
        "only and never called stalled (stall watch, state votes, replay and timing votes "
        "start in a "
        "process that calls it: a second line says what is on when rank 0 does); "
        f"evidence in {folder.run_dir(ctx.restart)} (scout's own log: ranks/log-<rank>.jsonl)"
    )


FR_BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # new, old name
FR_DUMP_NAMES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
FR_BUFFER = 2000  # torch's own default where it records by default (2.13)


def flight_recorder_env(environ: Mapping[str, str], stacks_dir: Path) -> dict[str, str]:
    """What the shim adds so that torch's Flight Recorder keeps the collective ledger and torch's
    own dump (on NCCL's collective timeout) lands in the run's evidence, unless the job set it
    under either of torch's names (pure)."""
    out = {}
    if not any(n in environ for n in FR_BUFFER_NAMES):
        out[FR_BUFFER_NAMES[0]] = str(FR_BUFFER)
    if not any(n in environ for n in FR_DUMP_NAMES):
        out[FR_DUMP_NAMES[0]] = str(stacks_dir / TORCH_FR_DUMP_PREFIX)
    return out


def ledger_words(environ: Mapping[str, str]) -> str:
    """Which collective ledger the job has, for the banner (pure)."""
    size = next((environ[n] for n in FR_BUFFER_NAMES if n in environ), str(FR_BUFFER)).strip()
    if size in ("0", ""):
        return (
            "collective ledger: scout's own record only (the job set Flight Recorder's buffer to "
            "0: functional and compiled collectives are not seen)"
        )
    return (
        f"collective ledger: torch's Flight Recorder ({size} entries, read on a stall) beside "
        "scout's own record"
    )


def init_banner(ctx: TaskContext, cfg: SiteConfig, environ: Mapping[str, str]) -> str:
    """The line rank 0's watchdog prints when its process enters init_process_group: the stall rule
    and the checks that run from there (pure). The cadences are the job's JobConfig's
    (scout_slurm.jobconfig)."""
    job, problems = read_settings(environ, site_defaults(cfg), check_names=False)
    votes = _every(job.consensus_every, jobconfig.CONSENSUS_EVERY.name, problems)
    replay = _every(job.replay_every, jobconfig.REPLAY_EVERY.name, problems)
    timing = _every(job.timing.every, jobconfig.TIMING_EVERY.name, problems)
    w = cfg.watchdog
    return (
        f"scout: job {ctx.job_id}, rank 0 entered init_process_group: a rank is called "
        "stalled after "
        f"max({w.stall_floor_s:g} s, {w.stall_factor:g} x its step time) without progress "
        "(before its first "
        f"optimizer step: the start-up limit, {w.startup_grace_s:g} s; a rank not yet at "
        "init_process_group "
        f"only once a peer waits there); state votes {votes}; in-situ replay {replay}; timing "
        f"votes {timing}; {ledger_words(environ)}"
    )


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    command = parse_args(argv)
    ctx = task_context(environ)
    cfg = load_config(environ)
    folder = JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id)
    # every write into the root goes through this writer's helper process (evidence/writer.py)
    writer = EvidenceWriter(folder.root)
    if writer.probe(folder.root, ROOT_PROBE_S) is None:
        writer.close(0)
        return _run_unwatched(command, ctx, environ, cfg.evidence.root)
    try:
        return _run_watched(command, ctx, cfg, environ, folder, writer)
    finally:
        writer.close(EXIT_FLUSH_S)


def _run_watched(
    command: list[str],
    ctx: TaskContext,
    cfg: SiteConfig,
    environ: Mapping[str, str],
    folder: JobFolder,
    writer: EvidenceWriter,
) -> int:
    why = unprepared(folder, ctx.restart)
    if why:
        _warn_unprepared(why, ctx, environ, cfg.evidence.root)
    prepare_dirs(folder, ctx.restart)
    # from here on, scout's own log goes to the evidence folder: the job's output is the user's
    configure(
        TaskLog(folder.task_log_path(ctx.restart, ctx.rank), writer=writer),
        json=True,
        level=level_from_env(),
    )
    checks_on = settings_allow_start(ctx, cfg, environ)
    if checks_on is None:
        return exitcodes.WATCHDOG_FAILED
    if ctx.rank == 0 and not why and checks_on:
        print(banner(ctx, cfg, environ, folder), file=sys.stderr, flush=True)
    shm = (
        Path("/dev/shm")
        / f"scout-{ctx.cluster}-{ctx.job_id}-{ctx.restart}-{ctx.step_id}-{ctx.rank}"
    )
    shutil.rmtree(shm, ignore_errors=True)
    shm.mkdir(mode=0o700, parents=True)
    # `apptainer exec IMAGE python train.py`: the shim stays on the host, the training runs inside
    container = apptainer.parse_exec(command)
    launcher = is_torchrun(container.inner if container is not None else command)
    # without the bootstrap nothing would advance a progress record: with in-job checks off the
    # watchdog watches the child's exit only. With them on, the record is watched from the start,
    # but a rank that never enters init_process_group is on no clock (task/stallclock.py)
    watch_progress = not launcher and checks_on
    if watch_progress:
        # one task, one rank: watch it from the start (a hang before init_process_group too)
        progress_mod.create(shm / f"rank-{ctx.rank}.bin")

    nodes = expand_hostlist(ctx.step_nodelist) if ctx.step_nodelist else [ctx.node]
    if environ.get("MASTER_ADDR"):
        master = environ["MASTER_ADDR"]
    elif ctx.rank == 0 or _resolvable(nodes[0]):
        master = own_address() if ctx.rank == 0 else nodes[0]
    else:
        master = _wait_for_master(folder, ctx, timeout=cfg.watchdog.startup_grace_s)
    env = dict(environ)
    torch_env = torch_environment(ctx, environ, master_addr=master)
    if launcher:  # torchrun sets each worker's RANK/LOCAL_RANK/WORLD_SIZE itself
        torch_env = {k: v for k, v in torch_env.items() if k in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(torch_env)
    env.update(
        jobconfig.as_environment(
            {
                jobconfig.PROGRESS_DIR: shm,
                jobconfig.STACKS_FILE: folder.stacks_path(ctx.restart, ctx.rank),
                jobconfig.PACKAGE_DIR: Path(scout_slurm.__file__).parent,
                jobconfig.RUN_DIR: folder.run_dir(ctx.restart),
                jobconfig.CHECKPOINTS_DIR: folder.checkpoints_dir,
            }
        )
    )
    for name, text in site_defaults(cfg).items():
        env.setdefault(name, text)  # the job's own setting wins
    for name, text in flight_recorder_env(environ, folder.stacks_dir(ctx.restart)).items():
        env.setdefault(name, text)  # torch's ledger on, its own dumps into the evidence
    # in-job checks off (settings not valid, on_bad_setting = "disable"): no bootstrap; the watchdog
    # still runs
    bootstrap = str(BOOTSTRAP_DIR) if checks_on else ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (bootstrap, environ.get("PYTHONPATH", "")) if p)
    resume, offset = _resume_checkpoint(folder, ctx.restart, writer)
    if resume and not environ.get(jobconfig.RESUME_CHECKPOINT.name):
        env.update(
            jobconfig.as_environment(
                {jobconfig.RESUME_CHECKPOINT: resume, jobconfig.STEP_OFFSET: offset}
            )
        )

    if container is not None and checks_on:
        command = _into_container(container, command, ctx, env, environ, [folder.path, shm])

    place = RankPlace(
        job_id=ctx.job_id,
        restart=ctx.restart,
        rank=ctx.rank,
        local_rank=ctx.local_rank,
        world_size=ctx.world_size,
        node=ctx.node,
        hostname=socket.gethostname(),
        task_pid=os.getpid(),
        child_pid=0,
        gpu_uuids=(),
        cuda_visible_devices=ctx.cuda_visible_devices,
        nic="",
        master_addr=master if ctx.rank == 0 else "",
        master_port=int(env["MASTER_PORT"]),
        started_at=time.time(),
        step_offset=offset if resume else 0,
        launcher="torchrun" if launcher else "",
    )
    place = _join_hardware_map(folder, place)
    writer.write_record(folder.rank_place_path(ctx.restart, ctx.rank), place)
    if not launcher and ctx.local_rank == 0:
        _write_node_tasks(folder, ctx, environ, writer)

    from scout_slurm.task.watchdog import Watchdog

    try:
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    except OSError as exc:
        raise ScoutError(f"scout-task: cannot start {command[0]!r}: {exc}") from exc
    own_record = shm / f"rank-{ctx.rank}.bin" if watch_progress else None
    tail = StderrTail(40, position=lambda: _position(own_record), per_rank=launcher)
    pump = threading.Thread(target=_pump_stderr, args=(child, tail), daemon=True)
    pump.start()
    import dataclasses

    writer.write_record(
        folder.rank_place_path(ctx.restart, ctx.rank),
        dataclasses.replace(place, child_pid=child.pid),
    )
    init_line = init_banner(ctx, cfg, environ) if ctx.rank == 0 and not why and checks_on else ""
    watchdog = Watchdog(
        ctx=ctx,
        cfg=cfg.watchdog,
        folder=folder,
        child=child,
        shm_dir=shm,
        stderr_tail=tail,
        init_line=init_line,
        torchrun=launcher,
        writer=writer,
        pid_namespace=container is not None and container.pid_namespace,
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, watchdog.on_signal)
    try:
        code = watchdog.run()
    finally:
        pump.join(timeout=2)
        shutil.rmtree(shm, ignore_errors=True)
    return code


def _into_container(
    container: apptainer.ContainerExec,
    command: list[str],
    ctx: TaskContext,
    env: dict[str, str],
    environ: Mapping[str, str],
    binds_rw: Sequence[Path],
) -> list[str]:
    """The bootstrap into an Apptainer/Singularity container (task/apptainer.py): `env` gets the
    variables that carry it, the command gets the binds. What cannot be done is said once a node;
    the task then runs with the exit watch alone."""
    launch = apptainer.with_bootstrap(
        container,
        command,
        package_dir=str(Path(scout_slurm.__file__).parent),
        binds_rw=[str(p) for p in binds_rw],
        shim_env=env,
        environ=environ,
    )
    notes = [launch.problem] if launch.problem else []
    log.info(
        "shim.container",
        runtime=container.runtime,
        pid_namespace=container.pid_namespace,
        problem=launch.problem,
    )
    if notes and ctx.local_rank == 0:
        for note in notes:
            print(f"scout: WARNING on {ctx.node}: {note}", file=sys.stderr, flush=True)
    env.update(launch.env)
    return list(launch.command)


def settings_allow_start(
    ctx: TaskContext, cfg: SiteConfig, environ: Mapping[str, str]
) -> bool | None:
    """Validate the job's SCOUT_* settings (jobconfig's table) before the command starts. True: all
    valid; False: not valid, the job starts with scout's in-job checks off; None: not valid and the
    site's `[watchdog] on_bad_setting = "fail"`: the command must not start. Said loudly once (rank
    0)
    in the job's output, and in every rank's own log."""
    _, problems = read_settings(environ, site_defaults(cfg))
    # which settings the job itself gave (the rest: the site's defaults, then scout's)
    log.info(
        "shim.job_settings",
        set_by_job=sorted(n for n in environ if n.startswith(jobconfig.PREFIX)),
        site_defaults=site_defaults(cfg),
    )
    if not problems:
        return True
    fail = cfg.watchdog.on_bad_setting == "fail"
    log.warning(
        "shim.bad_settings",
        problems=[str(p) for p in problems],
        on_bad_setting=cfg.watchdog.on_bad_setting,
    )
    if ctx.rank == 0:
        print(problems_message(problems, disabled=not fail), file=sys.stderr, flush=True)
    return None if fail else False


def node_tasks(ctx: TaskContext, environ: Mapping[str, str]) -> NodeTasks | None:
    """The ranks this step started on this node, from SLURM_GTIDS (one rank a task); None when
    Slurm did not say or what it said does not hold this task's own rank (pure)."""
    text = environ.get("SLURM_GTIDS", "")
    try:
        ranks = tuple(sorted({int(t) for t in text.split(",")}))
    except ValueError:
        return None
    if (
        ctx.rank not in ranks
        or len(ranks) > MAX_TASKS_PER_NODE
        or ranks[0] < 0
        or ranks[-1] >= ctx.world_size
    ):
        return None
    return NodeTasks(job_id=ctx.job_id, restart=ctx.restart, node=ctx.node, ranks=ranks)


def _write_node_tasks(
    folder: JobFolder, ctx: TaskContext, environ: Mapping[str, str], writer: EvidenceWriter
) -> None:
    """So that this node's Epilog can digest its ranks' records for the controller
    (evidence/digest.py);
    without it the controller reads every rank's files itself."""
    tasks = node_tasks(ctx, environ)
    if tasks is None:
        log.info("shim.no_node_tasks", gtids=environ.get("SLURM_GTIDS", "")[:80])
        return
    path = folder.node_tasks_path(ctx.restart, ctx.node)
    writer.mkdir(path.parent)
    writer.write_record(path, tasks)


def _run_unwatched(
    command: list[str], ctx: TaskContext, environ: Mapping[str, str], root: str
) -> int:
    """The evidence root did not answer a first look: run the command as if scout were not there
    (torch's variables from Slurm's, no bootstrap, no records), said once, and end with its code.
    Nothing here touches the root, so the task starts and ends whatever the root does."""
    if ctx.rank == 0 or ctx.local_rank == 0:
        print(
            f"scout: WARNING on {ctx.node}: the evidence root {root} did not answer within "
            f"{ROOT_PROBE_S:g} s: this task runs unwatched (no evidence, no stall watch); "
            "training goes on",
            file=sys.stderr,
            flush=True,
        )
    nodes = expand_hostlist(ctx.step_nodelist) if ctx.step_nodelist else [ctx.node]
    master = environ.get("MASTER_ADDR") or (own_address() if ctx.rank == 0 else nodes[0])
    env = dict(environ)
    env.update(torch_environment(ctx, environ, master_addr=master))
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise ScoutError(f"scout-task: cannot start {command[0]!r}: {exc}") from exc

    def forward(signum: int, _frame) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    code = child.wait()
    return code if code >= 0 else 128 - code


def _pump_stderr(child: subprocess.Popen, tail: StderrTail) -> None:
    """Forward the child's stderr unchanged and keep its last lines and last exception (cascade
    errors and crashes are recognised there)."""
    assert child.stderr is not None
    out = sys.stderr.buffer
    try:
        for line in iter(child.stderr.readline, b""):
            try:
                out.write(line)
                out.flush()
            except OSError:
                pass
            tail.feed(line.decode("utf-8", "replace"))
    finally:
        tail.end()


def _position(record: Path | None) -> int:
    """The rank's progress position (collectives entered + completed), -1 when unknown."""
    view = progress_mod.read(record) if record is not None else None
    return view.coll_entered + view.coll_completed if view is not None else -1


def _resume_checkpoint(folder: JobFolder, restart: int, writer: EvidenceWriter) -> tuple[str, int]:
    """The checkpoint the controller chose for this run, and its step ("" when none). Read
    through the writer's helper, for at most ROOT_PROBE_S: a root that stops answering here
    costs the resume instruction (said), never the start."""
    from scout_slurm.evidence.codec import decode_record
    from scout_slurm.remediation.records import ResumeInstruction

    path = folder.resume_path(restart)
    data = writer.read(path, ROOT_PROBE_S, root=folder.root)
    if data is None:
        print(
            f"scout: WARNING: the evidence root did not answer within {ROOT_PROBE_S:g} s for "
            f"the resume instruction {path}: this run does not resume from a checkpoint scout "
            "chose",
            file=sys.stderr,
            flush=True,
        )
        return "", 0
    if not isinstance(data, bytes):
        return "", 0  # none written (the first run, or no recovery point)
    try:
        r = decode_record(data, ResumeInstruction, source=str(path))
        return r.checkpoint, max(0, r.step)
    except ScoutError as exc:
        log.warning("task.resume_unreadable", path=str(path), error=str(exc))
        print(
            f"scout: WARNING: the resume instruction {path} is unreadable ({exc}); this run "
            "does not "
            "resume from a checkpoint scout chose",
            file=sys.stderr,
            flush=True,
        )
        return "", 0


def _join_hardware_map(folder: JobFolder, place: RankPlace) -> RankPlace:
    """Resolve the GPUs this rank sees to UUIDs, and the NIC nearest them, from the Prolog's map."""
    try:
        from scout_slurm.hwmap.join import join_place
    except ImportError:
        return place
    try:
        return join_place(folder, place)
    except ScoutError as exc:
        log.warning("task.hwmap_unavailable", error=str(exc))
        return place


def main(argv: Sequence[str] | None = None) -> int:
    from scout_slurm.entry import answered

    if answered("scout-task", argv):
        return 0
    # until the evidence folder is known, only what the user must see reaches the job's stderr
    configure(level=level_from_env(logging.WARNING))
    try:
        return run(sys.argv[1:] if argv is None else argv, os.environ)
    except ScoutError as exc:
        print(f"scout-task: {exc}", file=sys.stderr)
        return exitcodes.WATCHDOG_FAILED


if __name__ == "__main__":
    sys.exit(main())
