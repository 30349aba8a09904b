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

from scout_slurm.errors import LabError, ScoutError
from scout_slurm.lab.cluster import DEFAULT_STATE_DIR, Lab, LabSpec


class _ScoutGroup(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ScoutError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_ScoutGroup)
def main() -> None:
    """scout: find the rank that failed first in a Slurm job, keep the evidence, act on it."""


@main.group()
def lab() -> None:
    """A real Slurm cluster on this machine (slurmctld, several slurmd, private munge)."""


_state_dir = click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path),
                          default=DEFAULT_STATE_DIR, show_default=True,
                          help="Folder holding the lab's config, logs, pid files and spool.")


@lab.command("up")
@click.option("--nodes", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--port-base", type=click.IntRange(1024, 65000), default=LabSpec.port_base, show_default=True,
              help="slurmctld listens here, node i on port-base + i.")
@_state_dir
def lab_up(nodes: int, port_base: int, state_dir: Path) -> None:
    """Start (or restart) the lab; prints the `export` lines a shell needs to use it."""
    cluster = Lab(LabSpec(state_dir=state_dir, nodes=nodes, port_base=port_base, python=sys.executable))
    cluster.up()
    click.echo(f"lab up: {nodes} nodes in {cluster.paths.root}, slurmctld on 127.0.0.1:{port_base}", err=True)
    click.echo(f"export SCOUT_CONFIG={shlex.quote(str(cluster.paths.scout_conf))}")
    click.echo(f"export SLURM_CONF={shlex.quote(str(cluster.paths.slurm_conf))}")


@lab.command("down")
@_state_dir
def lab_down(state_dir: Path) -> None:
    """Stop every process of the lab in STATE_DIR (found by its pid files and open files)."""
    stopped = Lab(LabSpec(state_dir=state_dir)).down()
    click.echo(f"lab down: stopped {len(stopped)} process(es) of {Path(state_dir).resolve()}")


@lab.command("status")
@_state_dir
@click.option("--json", "as_json", is_flag=True, help="Print the status as one JSON object.")
def lab_status(state_dir: Path, as_json: bool) -> None:
    """Daemons and node states of the lab in STATE_DIR."""
    cluster = Lab(LabSpec(state_dir=state_dir))
    if not cluster.paths.lab_json.exists():
        raise LabError(f"no lab cluster in {cluster.paths.root}: start one with "
                       f"`scout lab up --state-dir {cluster.paths.root}`")
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
