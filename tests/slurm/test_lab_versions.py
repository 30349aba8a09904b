"""Issue 21: scout on the Slurm releases sites run. On each release of --slurm-releases (default
24.11 and 26.05, one lab each, run from a cached Debian root): the crash and hang loops drain,
requeue and resume; `scout map` of both runs after the job; a hostile drain reason read back
exactly; every
Slurm call through the door runs the lab's own binaries; `scout lab down` leaves nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import scoutjobs as sj
from conftest import leftovers

from scout_slurm.lab.cluster import Lab, LabSpec, free_port_base
from scout_slurm.lab.record import HOSTILE_REASON
from scout_slurm.lab.roots import cache_dir, mounts_under
from scout_slurm.slurm import ops
from scout_slurm.slurm.door import run_slurm

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_release]


def test_the_lab_runs_its_release_through_the_door(release_lab):
    env = release_lab.client_env()
    res = run_slurm("sinfo", ["--version"], timeout=20, env=env)
    print(f"\n{res.stdout.strip()}")
    assert res.stdout.split()[-1].startswith(release_lab.spec.slurm + ".")
    assert res.argv[1:3] == (str(release_lab.paths.rootfs), "/usr/bin/sinfo"), (
        res.argv
    )  # chroot ROOT sinfo
    # the daemons are that release's too (what slurmd registered with)
    node = run_slurm("scontrol", ["show", "node", "-o", "n1"], timeout=20, env=env).stdout
    assert f"Version={release_lab.spec.slurm}." in node


def test_hostile_drain_reason_is_read_back_exactly(release_lab, clean_release_drains):
    env = release_lab.client_env()
    ops.drain_node("n4", HOSTILE_REASON, timeout=20, env=env)
    try:
        assert ops.node_info("n4", timeout=20, env=env).reason == HOSTILE_REASON
        listed = {n.name: n for n in ops.list_nodes(timeout=20, env=env)}
        assert listed["n4"].is_drained and listed["n4"].reason == HOSTILE_REASON
    finally:
        ops.resume_node("n4", timeout=20, env=env)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_crash_loop_then_map(release_lab, clean_release_drains):
    """The crash loop, then `scout map` of both runs after the job ended (one job for both: CI
    time).
    """
    job, _ = sj.closed_loop(release_lab, "exit,rank=2,step=25,code=3", 2, "crash")
    maps = {}
    for restart in (0, 1):
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "scout_slurm.cli",
                "map",
                str(job),
                "--restart",
                str(restart),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=release_lab.client_env(),
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        ranks = {r["rank"]: (r["node"], r["local_rank"]) for r in json.loads(res.stdout)["ranks"]}
        places = sj.places(release_lab, job, restart)
        assert ranks == {rank: (p.node, rank % 2) for rank, p in places.items()} and sorted(
            ranks
        ) == [0, 1, 2, 3]
        maps[restart] = {node for node, _ in ranks.values()}
    drained = sj.places(release_lab, job, 0)[2].node
    assert drained in maps[0] and drained not in maps[1] and len(maps[1]) == 2
    # scout's Prolog and Epilog ran beside the lab's stand-in for a site's own (Prolog= and Epilog=
    # name a folder glob, as the snippet does) on every node of both runs
    nodes = maps[0] | maps[1]
    ran = sj.hook_nodes(release_lab, job)
    for hook in (
        "site-prolog",
        "site-epilog",
        "scout_slurm.hooks.prolog",
        "scout_slurm.hooks.epilog",
    ):
        assert ran.get(hook) == nodes, (hook, ran, nodes)


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hang_loop(release_lab, clean_release_drains):
    sj.closed_loop(release_lab, "sleep,rank=1,step=25", 1, "hang")


@pytest.mark.timeout(180)
def test_lab_down_leaves_no_process_mount_or_namespace(release_lab, tmp_path):
    """A second, small lab of the same release beside the session's: up, a job running in it,
    down.
    """
    small = Lab(
        LabSpec(
            state_dir=tmp_path / "lab",
            nodes=2,
            port_base=free_port_base(4),
            python=sys.executable,
            slurm=release_lab.spec.slurm,
            site_users=False,
        )
    )
    try:
        small.up()
        env = small.client_env()
        job = ops.submit_batch(
            "#!/bin/sh\nsleep 300\n",
            ["-N2", "-o", "/dev/null", f"--chdir={small.paths.work}"],
            timeout=20,
            env=env,
        )
        state = ""
        for _ in range(100):
            state = ops.job_info(job, timeout=20, env=env).state
            if state == "RUNNING":
                break
            time.sleep(0.2)
        assert state == "RUNNING"
        assert mounts_under(small.paths.rootfs)
    finally:
        small.down()
    assert leftovers(small) == {"processes": [], "mounts": [], "namespaces": []}
    # the other lab's view and the cached root are untouched by this one's mounts
    assert mounts_under(cache_dir() / release_lab.spec.slurm) == []
    assert mounts_under(release_lab.paths.rootfs)
    assert ops.node_info("n1", timeout=20, env=release_lab.client_env()).name == "n1"


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_netns_lab_of_the_release(release_lab, tmp_path):
    """--netns on the release: each node's own hostname and address (gloo resolves them inside the
    root through the lab's hosts file); down removes the namespaces, mounts and processes."""
    from conftest import up_or_skip

    small = Lab(
        LabSpec(
            state_dir=tmp_path / "netns",
            nodes=2,
            port_base=free_port_base(4),
            python=sys.executable,
            slurm=release_lab.spec.slurm,
            netns=True,
        )
    )
    try:
        up_or_skip(small)
        env = small.client_env()
        script = (
            f"#!/bin/bash\nsrun -l {sys.executable} -c "
            "'import socket, torch; print(socket.gethostname(), "
            "socket.gethostbyname(socket.gethostname()))'\n"
        )
        job = ops.submit_batch(
            script,
            [
                "-N2",
                "--ntasks-per-node=1",
                f"-o{small.paths.work}/out-%j",
                f"--chdir={small.paths.work}",
            ],
            timeout=20,
            env=env,
            user=small.job_user,
        )
        info = sj.wait_completed(small, job, timeout=150)
        out = sorted((small.paths.work / f"out-{job}").read_text().split("\n"))
        assert info.state == "COMPLETED", out
        assert [line for line in out if line] == ["0: n1 10.213.0.11", "1: n2 10.213.0.12"]
    finally:
        small.down()
    assert leftovers(small) == {"processes": [], "mounts": [], "namespaces": []}
