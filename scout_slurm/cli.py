"""The `scout` command line: thin click commands over the library.

An error scout raises on purpose (ScoutError) is printed as one clear line on stderr and exits 1;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import click

from scout_slurm import __version__
from scout_slurm.errors import LabError, ScoutError
from scout_slurm.lab import DEFAULT_PORT_BASE, default_state_dir


class _ScoutGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ScoutError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_ScoutGroup)
@click.version_option(__version__, prog_name="scout", message="%(prog)s (scout-slurm) %(version)s")
def main() -> None:
    """scout: find the rank that failed first in a Slurm job, keep the evidence, act on it.

    Log lines (every Slurm call, each state change) are shown only from warnings up; set
    SCOUT_LOG_LEVEL=info to see them all."""
    import logging

    from scout_slurm.log import configure, level_from_env

    configure(level=level_from_env(logging.WARNING))


@main.group()
def lab() -> None:
    """A real Slurm cluster on this machine (slurmctld, several slurmd, private munge)."""


_state_dir = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=default_state_dir(),
    show_default=True,
    help="Folder holding the lab's config, logs, pid files and spool.",
)


_slurm_release = click.option(
    "--slurm",
    default="",
    metavar="RELEASE",
    help="Slurm release: 24.11 or 26.05 run from a Debian root built once into "
    "/var/cache/scout-slurm/roots "
    "(mmdebstrap, about 180 MB each); default: this machine's own Slurm.",
)


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option(
    "--port-base",
    type=click.IntRange(1024, 65000),
    default=DEFAULT_PORT_BASE,
    show_default=True,
    help="slurmctld listens here, node i on port-base + i.",
)
@click.option(
    "--netns",
    is_flag=True,
    help="One network namespace per node (own hostname n1.., address 10.213.0.10+i, bridge "
    "scoutbr0); "
    "needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN. Default: every node a `slurmd -N` on "
    "127.0.0.1.",
)
@_slurm_release
@_state_dir
def lab_up(nodes: int, port_base: int, netns: bool, slurm: str, state_dir: Path) -> None:
    """Start (or restart) the lab; prints the `export` lines a shell needs to use it."""
    from scout_slurm.lab.cluster import NETNS_CTL_ADDR, Lab, LabSpec

    cluster = Lab(
        LabSpec(
            state_dir=state_dir,
            nodes=nodes,
            port_base=port_base,
            python=sys.executable,
            netns=netns,
            slurm=slurm,
        )
    )
    cluster.up()
    where = (
        f"{NETNS_CTL_ADDR}:{port_base} (netns mode, bridge scoutbr0)"
        if netns
        else f"127.0.0.1:{port_base}"
    )
    click.echo(
        f"lab up: {nodes} nodes in {cluster.paths.root}, slurmctld on {where}, "
        f"{cluster.slurm_version()}",
        err=True,
    )
    for key, value in cluster.exports().items():
        click.echo(f"export {key}={shlex.quote(value)}")


@lab.command("down")
@_state_dir
def lab_down(state_dir: Path) -> None:
    """Stop every process of the lab in STATE_DIR (found by its pid files and open files)."""
    from scout_slurm.lab.cluster import Lab, LabSpec

    stopped = Lab(LabSpec(state_dir=state_dir)).down()
    click.echo(f"lab down: stopped {len(stopped)} process(es) of {Path(state_dir).resolve()}")


@lab.command("status")
@_state_dir
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def lab_status(state_dir: Path, as_json: bool) -> None:
    """Daemons and node states of the lab in STATE_DIR."""
    from scout_slurm.lab.cluster import Lab, LabSpec

    cluster = Lab(LabSpec(state_dir=state_dir))
    if not cluster.paths.lab_json.exists():
        raise LabError(
            f"no lab cluster in {cluster.paths.root}: start one with "
            f"`scout lab up --state-dir {cluster.paths.root}`"
        )
    status = cluster.status()
    if as_json:
        click.echo(json.dumps(status, indent=2, sort_keys=True))
        return
    click.echo(f"lab {status['state_dir']}  (SLURM_CONF={status['slurm_conf']})")
    for name, d in status["daemons"].items():
        click.echo(f"  {name:<14} pid {d['pid']}  {'running' if d['alive'] else 'stopped'}")
    for n in status["nodes"]:
        if "error" in n:
            click.echo(f"  nodes: cannot list them: {n['error'].splitlines()[0]}")
        else:
            click.echo(f"  {n['name']:<8} {n['state']:<16} {n['reason']}")


# -- reading incidents ---------------------------------------------------------------------


def _site(config_path: str | None):
    import os as _os

    from scout_slurm.config import load_config

    return load_config(_os.environ, path=config_path)


def _find_job_folder(root: Path, job_id: int, cluster: str | None):
    from scout_slurm.evidence.layout import JobFolder

    if cluster:
        folder = JobFolder(root, cluster, job_id)
        if not folder.path.is_dir():
            raise ScoutError(f"no evidence for job {job_id} of cluster {cluster} under {root}")
        return folder
    hits = (
        [
            JobFolder(root, c.name, job_id)
            for c in sorted(root.iterdir())
            if c.is_dir() and (c / str(job_id)).is_dir()
        ]
        if root.is_dir()
        else []
    )
    if not hits:
        raise ScoutError(
            f"no evidence for job {job_id} under {root}: was it run with scout-srun, "
            "and is [evidence] root the same here?"
        )
    if len(hits) > 1:
        raise ScoutError(
            f"job {job_id} exists for clusters {[h.cluster for h in hits]}: name one with --cluster"
        )
    return hits[0]


_config_opt = click.option(
    "--config", "config_path", default=None, help="Site config (default: $SCOUT_CONFIG)."
)


@main.command("show")
@click.argument("job_id", type=int)
@click.option("--restart", type=int, default=None, help="Which run of the job (default: the last).")
@click.option("--cluster", default=None)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the verdict record (with actions) as JSON."
)
@click.option(
    "--html",
    "as_html",
    is_flag=True,
    help="The incident page: one self-contained HTML file with the timeline, latency and hardware "
    "map.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --html: write the page to this file instead of stdout.",
)
@_config_opt
def show(
    job_id: int,
    restart: int | None,
    cluster: str | None,
    as_json: bool,
    as_html: bool,
    output: Path | None,
    config_path: str | None,
) -> None:
    """The verdict, a per-rank timeline and the actions taken for JOB_ID."""
    from scout_slurm.report.views import load_show, show_html, show_json, show_text

    if output is not None and not as_html:
        raise ScoutError("scout show: -o/--output goes with --html")
    folder = _find_job_folder(Path(_site(config_path).evidence.root), job_id, cluster)
    view = load_show(folder, restart)
    if as_json:
        click.echo(json.dumps(show_json(view), indent=2, sort_keys=True))
    elif not as_html:
        click.echo(show_text(view), nl=False)
    elif output is None:
        click.echo(show_html(view, folder), nl=False)
    else:
        try:
            output.write_text(show_html(view, folder), encoding="utf-8")
        except OSError as exc:
            raise ScoutError(
                f"scout show: cannot write {output}: {exc.strerror or exc}; choose another -o path"
            ) from None
        click.echo(f"wrote {output} (job {job_id}, run {view.run})", err=True)


@main.command("incidents")
@click.option("--node", default=None, help="Only incidents whose suspects ran on NODE.")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--pending",
    "only_pending",
    is_flag=True,
    help="Only incidents whose handling began and has not ended (a hook killed half-way).",
)
@click.option(
    "--gpu",
    "gpu_serial",
    default=None,
    metavar="SERIAL",
    help="Only the incidents that named the GPU with this board serial, on whichever node it was.",
)
@_config_opt
def incidents(
    node: str | None,
    limit: int,
    as_json: bool,
    only_pending: bool,
    gpu_serial: str | None,
    config_path: str | None,
) -> None:
    """Recent incidents: job, run, verdict, suspects, nodes drained; then any still pending."""
    from scout_slurm.incident.history import (
        list_incidents,
        list_pending,
        list_suspects,
        render_suspects,
    )

    cfg = _site(config_path)
    root = Path(cfg.evidence.root)
    if gpu_serial is not None:
        rows = list_suspects(root, gpu=gpu_serial)
        click.echo(
            json.dumps([r.as_dict() for r in rows], indent=2)
            if as_json
            else render_suspects(rows) or f"no incident named GPU serial {gpu_serial}"
        )
        return
    pending = list_pending(root)
    if only_pending:
        if as_json:
            click.echo(json.dumps([p.as_dict() for p in pending], indent=2))
        else:
            _echo_pending(pending)
        return
    rows = list_incidents(root, node=node, limit=limit)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo("no incidents")
    else:
        click.echo(
            f"{'cluster':<10} {'job':>7} {'run':>3}  {'verdict':<12} {'suspects':<28} drained"
        )
        for r in rows:
            sus = ", ".join(f"r{s[0]}@{s[1]}" for s in r.suspects) or "-"
            click.echo(
                f"{r.cluster:<10} {r.job_id:>7} {r.restart:>3}  {r.kind:<12} {sus:<28} "
                f"{', '.join(r.drained) or '-'}"
            )
    if pending:
        _echo_pending(pending)


@main.command("suspects")
@click.option("--json", "as_json", is_flag=True)
@_config_opt
def suspects(as_json: bool, config_path: str | None) -> None:
    """Every node and GPU serial an incident named: status (drained, watch), users, kinds, root
    checks and each incident's outcome. The watch list is the nodes in status "watch"."""
    from scout_slurm.incident.history import list_suspects, render_suspects
    from scout_slurm.slurm import ops

    cfg = _site(config_path)
    try:  # the nodes' state now: a node returned to service since its drain says so
        states = {
            n.name: n
            for n in ops.list_nodes(timeout=cfg.slurm.timeout_s, bin_dir=cfg.slurm.bin_dir)
        }
    except ScoutError as exc:
        click.echo(f"scout suspects: Slurm's node states not read ({exc})", err=True)
        states = None
    rows = list_suspects(Path(cfg.evidence.root), node_states=states)
    click.echo(
        json.dumps([r.as_dict() for r in rows], indent=2)
        if as_json
        else render_suspects(rows) or "no suspects"
    )


def _echo_pending(pending) -> None:
    import time as _time

    if not pending:
        click.echo("no pending incidents")
        return
    click.echo(
        "\npending (handling began and has not ended; the next controller run on the cluster "
        "completes it):"
    )
    for p in pending:
        click.echo(
            f"{p.cluster:<10} {p.job_id:>7} {p.restart:>3}  {p.status:<16} since "
            f"{_time.time() - p.since:.0f} s, begun by {p.holder}"
        )


@main.command("undrain")
@click.argument("node")
@click.option("--dry-run", is_flag=True, help="Say what would be done.")
@_config_opt
def undrain(node: str, dry_run: bool, config_path: str | None) -> None:
    """Return NODE to service, only if scout drained it (other drains are left alone)."""
    from scout_slurm.slurm import ops

    cfg = _site(config_path)
    info = ops.node_info(node, timeout=cfg.slurm.timeout_s, bin_dir=cfg.slurm.bin_dir)
    if not info.is_drained:
        click.echo(f"{node} is not drained (state {info.state_text}): nothing to do")
        return
    from scout_slurm.remediation.plan import is_scout_drain

    if not is_scout_drain(info.reason):
        raise ScoutError(
            f"{node} was drained by someone else (reason: {info.reason!r}); scout leaves it alone. "
            f"Use scontrol update nodename={node} state=resume if you mean it."
        )
    if dry_run:
        click.echo(f"would resume {node} (reason was: {info.reason})")
        return
    ops.resume_node(node, timeout=cfg.slurm.timeout_s, bin_dir=cfg.slurm.bin_dir)
    click.echo(f"resumed {node} (reason was: {info.reason})")


@main.command("demo")
@click.option(
    "--fault",
    type=click.Choice(["crash", "hang", "segfault", "sigstop"]),
    default="crash",
    show_default=True,
    help="What goes wrong on rank 2 at step 25 of the first run.",
)
@click.option("--nodes", type=click.IntRange(3, 16), default=4, show_default=True)
@click.option("--port-base", type=click.IntRange(1024, 65000), default=16800, show_default=True)
@click.option("--keep", is_flag=True, help="Leave the lab cluster running afterwards.")
@_slurm_release
@_state_dir
def demo(fault: str, nodes: int, port_base: int, keep: bool, slurm: str, state_dir: Path) -> None:
    """The main job end to end on a local cluster: fault, verdict, drain, requeue, resumed run."""
    from scout_slurm.lab.demo import run_demo

    code = run_demo(
        state_dir=state_dir,
        fault=fault,
        keep=keep,
        echo=click.echo,
        nodes=nodes,
        port_base=port_base,
        slurm=slurm,
    )
    sys.exit(code)


@main.command("acceptance")
@click.option(
    "-o",
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("acceptance-report"),
    show_default=True,
    help="Where acceptance.json, acceptance.md and acceptance.html go.",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Shorter jobs and no clean run under load (what the test suite runs).",
)
@click.option(
    "--site",
    is_flag=True,
    help="Run on the Slurm cluster SLURM_CONF points at instead of a local lab.",
)
@click.option("--partition", default="", help="site: sbatch --partition.")
@click.option("--account", default="", help="site: sbatch --account.")
@click.option("--time", "time_limit", default="", help="site: sbatch --time for each job.")
@click.option(
    "--nodes", type=click.IntRange(2, 64), default=2, show_default=True, help="Nodes per job."
)
@click.option("--ntasks-per-node", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option(
    "--evidence-root", default="", help="site: the evidence root (default: the site config's)."
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="site: checkpoints and job output, on storage every node sees (default: OUT_DIR/work).",
)
@click.option(
    "--stall-floor",
    type=float,
    default=4.0,
    show_default=True,
    help="Seconds before a stall is called.",
)
@click.option(
    "--job-timeout",
    type=float,
    default=240.0,
    show_default=True,
    help="Seconds to wait for each job.",
)
@click.option(
    "--lab-state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="lab: its state folder (default: a fresh temporary one, removed afterwards).",
)
@click.option(
    "--lab-port-base",
    type=click.IntRange(0, 65000),
    default=0,
    help="lab: first port (0: a free block).",
)
@click.option(
    "--one-at-a-time", is_flag=True, help="One job at a time (default: two side by side)."
)
@click.option(
    "--netns",
    is_flag=True,
    help="lab: one network namespace per node (root), so step 3d slows one node's link with tc.",
)
@click.option(
    "--train",
    "train_command",
    default="",
    metavar="COMMAND",
    help="Your training command instead of the built-in job, run by scout-srun in each job's "
    "batch shell (so $SLURM_JOB_ID keeps jobs' checkpoints apart). Faults are injected by "
    "scout, no edit to the script; each step says what it could not show with it.",
)
def acceptance(
    out_dir: Path,
    quick: bool,
    site: bool,
    partition: str,
    account: str,
    time_limit: str,
    nodes: int,
    ntasks_per_node: int,
    evidence_root: str,
    workdir: Path | None,
    stall_floor: float,
    job_timeout: float,
    lab_state_dir: Path | None,
    lab_port_base: int,
    one_at_a_time: bool,
    netns: bool,
    train_command: str,
) -> None:
    """The acceptance test: witnessed steps (training across nodes, the map, injected stall,
    slowdown and numerical fault, detection times, naming, checkpoints, bit-exact resume, all
    again under load), each PASS, FAIL or SKIPPED with figures. Exit 0 only if none failed.

    With --train, the steps run your own training command (train at least 20 steps; faults at
    steps 6 to 12): a step it cannot show (no checkpoints saved, SCOUT_RESUME_CHECKPOINT not
    read, training too short, no replicas to vote) is SKIPPED with the reason, never passed.

    \b
    Example:
      scout acceptance --quick --train 'python train.py --steps 30 --ckpt-dir ck-$SLURM_JOB_ID'
    """
    from scout_slurm.acceptance.run import AcceptanceOptions, check_train_command, run_acceptance

    try:
        train_command = check_train_command(train_command)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--train") from exc

    opts = AcceptanceOptions(
        out_dir=out_dir,
        quick=quick,
        site=site,
        lab_state_dir=lab_state_dir,
        lab_port_base=lab_port_base,
        nodes=nodes,
        tasks_per_node=ntasks_per_node,
        partition=partition,
        account=account,
        time_limit=time_limit,
        evidence_root=evidence_root,
        workdir=workdir,
        stall_floor_s=stall_floor,
        job_timeout_s=job_timeout,
        side_by_side=not one_at_a_time,
        netns=netns,
        train_command=train_command,
    )
    sys.exit(run_acceptance(opts, echo=click.echo))


@main.group()
def site() -> None:
    """What a site administrator installs: the hooks slurm.conf names, the site config."""


@site.command("install")
@click.option(
    "--prefix",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Root of the layout: PREFIX/etc/scout, PREFIX/libexec/scout, PREFIX/share/doc/scout.",
)
@click.option(
    "--slurm-conf",
    default="/etc/slurm/slurm.conf",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="slurm.conf as the controller Epilog must find it (controller hooks get no SLURM_CONF).",
)
def site_install(prefix: Path, slurm_conf: Path) -> None:
    """Lay out the hooks for slurm.conf, with this Python's hook scripts filled in.

    Writes PREFIX/etc/scout/scout.toml (from the example; an existing one is kept), the hook
    wrappers in PREFIX/libexec/scout, PREFIX/etc/scout/slurm.conf.snippet and
    PREFIX/share/doc/scout/THREAT-MODEL.md, then prints what to add to slurm.conf.

    Example: scout site install --prefix /   (then /etc/scout/scout.toml)
    """
    import sysconfig

    from scout_slurm.site import layout as site_layout

    scripts = Path(sysconfig.get_path("scripts"))
    planned = site_layout.site_layout(
        prefix, scripts_dir=scripts, python=Path(sys.executable), slurm_conf=slurm_conf
    )
    missing = site_layout.missing_scripts(planned, scripts)
    if missing:
        raise ScoutError(
            f"{', '.join(map(str, missing))}: not installed beside {sys.executable}; "
            "run `scout site install` from the Python scout-slurm is installed into "
            "(pip install scout-slurm)"
        )
    try:
        done = site_layout.write_layout(planned)
    except OSError as exc:
        raise ScoutError(
            f"scout site install: {exc}; run it as a user who may write under {planned.prefix} "
            "(root for /), or choose another --prefix"
        ) from None
    click.echo(site_layout.install_summary(planned, done), nl=False)


@site.command("check")
@_config_opt
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
def site_check(config_path: str | None, as_json: bool) -> None:
    """Check this host's scout install, changing nothing; exit 1 if any check FAILs.

    Run it as root on the controller and on a compute node: the site config's trust (owner,
    mode, folders above it), observe_only, Slurm's release and the slurm.conf parameters scout
    needs (PrologFlags=Alloc, PrologEpilogTimeout, SlurmUser), scout's Prolog, Epilog and
    EpilogSlurmctld among the programs slurm.conf names and executable by whom runs them, the
    evidence root's owners and modes, NVML and the kernel log. One line per check (ok, warn,
    FAIL, skip), with what to do under each that is not ok.

    Example: scout site check --config /etc/scout/scout.toml
    """
    import os

    from scout_slurm.site import check
    from scout_slurm.slurm import ops

    report = check.run_checks(
        config_path,
        os.environ,
        show_config=lambda cfg: ops.show_config(
            timeout=cfg.slurm.timeout_s, bin_dir=cfg.slurm.bin_dir
        ),
    )
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        click.echo(report.render(), nl=False)
    sys.exit(1 if report.failed else 0)


@main.command("map")
@click.argument("job_id", type=int, required=False)
@click.option("--rank", type=int, default=None, help="Only this rank.")
@click.option("--restart", type=int, default=None, help="Which run of the job (default: the last).")
@click.option("--node", "node_name", default=None, help="History: jobs and ranks that ran on NODE.")
@click.option(
    "--gpu", default=None, help="History: jobs and ranks that ran on the GPU with this UUID."
)
@click.option("--cluster", default=None)
@click.option("--json", "as_json", is_flag=True)
@_config_opt
def map_cmd(
    job_id: int | None,
    rank: int | None,
    restart: int | None,
    node_name: str | None,
    gpu: str | None,
    cluster: str | None,
    as_json: bool,
    config_path: str | None,
) -> None:
    """Rank to node, hostname, GPU UUID and serial, NIC for JOB_ID; or history by --node / --gpu."""
    import dataclasses

    from scout_slurm.report.map_loader import all_places, read_maps, read_places
    from scout_slurm.report.map_table import history_rows, rank_map_rows, render_rank_map_table

    cfg = _site(config_path)
    root = Path(cfg.evidence.root)
    if job_id is None:
        if not node_name and not gpu:
            raise ScoutError(
                "scout map: give a JOB_ID, or --node NAME / --gpu UUID for history across jobs"
            )
        entries, problems = all_places(root)
        rows = history_rows(entries, node=node_name, gpu=gpu)
        if as_json:
            click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
            return
        click.echo(f"{'cluster':<10} {'job':>7} {'run':>3} {'rank':>5}  {'node':<10} gpus")
        for r in rows:
            click.echo(
                f"{r.cluster:<10} {r.job_id:>7} {r.restart:>3} {r.rank:>5}  {r.node:<10} "
                f"{','.join(r.gpu_uuids) or '-'}"
            )
        if not rows:
            click.echo("no ranks recorded there")
        return
    folder = _find_job_folder(root, job_id, cluster)
    runs = folder.restarts()
    if not runs:
        raise ScoutError(f"job {job_id}: no run folders in {folder.path}")
    run = runs[-1] if restart is None else restart
    places, problems = read_places(folder, run)
    maps, map_problems = read_maps(folder, {p.node for p in places})
    rows = rank_map_rows(places, maps)
    if rank is not None:
        rows = [r for r in rows if r.rank == rank]
        if not rows:
            raise ScoutError(f"job {job_id} run {run}: no record of rank {rank}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "job_id": job_id,
                    "cluster": folder.cluster,
                    "restart": run,
                    "ranks": [dataclasses.asdict(r) for r in rows],
                    "problems": problems + map_problems,
                },
                indent=2,
            )
        )
        return
    click.echo(f"job {job_id} on cluster {folder.cluster}, run {run}")
    click.echo(render_rank_map_table(rows), nl=False)
    for p in problems + map_problems:
        click.echo(f"note: {p}", err=True)


@main.command("checkpoints")
@click.argument("job_id", type=int)
@click.option("--cluster", default=None)
@click.option("--json", "as_json", is_flag=True)
@_config_opt
def checkpoints(job_id: int, cluster: str | None, as_json: bool, config_path: str | None) -> None:
    """The checkpoints JOB_ID wrote: eligible, candidate or rejected, and why; and the one a
    rerun would resume from after the last run's verdict."""
    from scout_slurm.report.views import checkpoints_json, checkpoints_text, load_checkpoints

    cfg = _site(config_path)
    folder = _find_job_folder(Path(cfg.evidence.root), job_id, cluster)
    view = load_checkpoints(
        folder,
        time_budget_s=cfg.epilog.checkpoint_check_s,
        byte_budget=cfg.epilog.checkpoint_check_bytes,
    )
    if as_json:
        click.echo(json.dumps(checkpoints_json(view), indent=2))
    else:
        click.echo(checkpoints_text(view), nl=False)


if __name__ == "__main__":
    main()
