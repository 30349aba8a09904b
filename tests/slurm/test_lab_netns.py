"""The lab in netns mode: one network namespace, hostname and address per node, on a private bridge.

Each test starts its OWN lab (not the session `lab` fixture: that one runs in the default
`slurmd -N` mode), in /tmp/scout-lab-netns-<pid> with its own free ports, and always stops it.
Skipped only where this machine refuses network namespaces (`ip netns add`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import scoutjobs as sj
from conftest import free_port_base, up_or_skip

from scout_slurm.errors import LabError
from scout_slurm.lab.cluster import NETNS_BRIDGE, NETNS_RANGE, NETNS_ROUTE_METRIC, Lab, LabSpec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _state_dir() -> Path:
    return Path(f"/tmp/scout-lab-netns-{os.getpid()}")


def _ip(*args: str) -> str:
    return subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=True, timeout=15
    ).stdout


def _scout_namespaces() -> list[str]:
    return [
        line.split()[0]
        for line in _ip("netns", "list").splitlines()
        if line.strip() and line.split()[0].startswith("scout-")
    ]


def _lab_links() -> list[str]:
    names = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link").splitlines()]
    return [n for n in names if n.startswith("sv-") or n == NETNS_BRIDGE]


def _unreachable_route_present() -> bool:
    routes = json.loads(
        _ip("-j", "-4", "route", "show", "table", "main", "type", "unreachable") or "[]"
    )
    return any(
        r.get("dst") == NETNS_RANGE and int(r.get("metric", 0)) == NETNS_ROUTE_METRIC
        for r in routes
    )


def _mounts_mentioning(path: Path) -> list[str]:
    """Any process whose mount table still holds something of the state folder (the hosts bind)."""
    needle = str(path)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if needle in Path(f"/proc/{entry}/mountinfo").read_text():
                found.append(entry)
        except OSError:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _assert_all_gone(cluster: Lab) -> None:
    assert cluster.running_pids() == []
    assert _scout_namespaces() == []
    assert _lab_links() == []
    assert _mounts_mentioning(cluster.paths.root) == []
    assert _unreachable_route_present(), (
        "the unreachable route for the lab's range must never be removed"
    )


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_ddp_job_across_two_namespace_nodes():
    state = _state_dir()
    cluster = Lab(
        LabSpec(
            state_dir=state,
            nodes=2,
            port_base=free_port_base(3, 17000, 19990),
            python=sys.executable,
            netns=True,
        )
    )
    hosts_before = Path("/etc/hosts").read_bytes()
    try:
        t0 = time.monotonic()
        up_or_skip(cluster)
        print(f"netns lab up in {time.monotonic() - t0:.2f} s")
        status = cluster.status()
        assert status["mode"] == "netns"
        assert status["network"]["bridge_present"]
        assert all(n["present"] for n in status["network"]["nodes"].values())
        assert {n["name"]: n["state"] for n in status["nodes"]} == {"n1": "IDLE", "n2": "IDLE"}

        t1 = time.monotonic()
        job = sj.submit(
            cluster, sj.batch_script(cluster, train_args="--steps 10"), nodes=2, tasks_per_node=2
        )
        info = sj.wait_completed(cluster, job, timeout=240)
        print(f"2 nodes x 2 ranks DDP job {job}: {info.state} in {time.monotonic() - t1:.1f} s")
        assert info.state == "COMPLETED", sj.output(cluster, job)[-3000:]

        res = subprocess.run(
            [sys.executable, "-m", "scout_slurm.cli", "map", str(job), "--json"],
            capture_output=True,
            text=True,
            env=cluster.client_env(),
            timeout=60,
        )
        assert res.returncode == 0, res.stderr
        ranks = {r["rank"]: r for r in json.loads(res.stdout)["ranks"]}
        assert sorted(ranks) == [0, 1, 2, 3]
        # every node has its own hostname: the place records' hostname is the node's, not this
        # machine's
        assert {r["node"]: r["hostname"] for r in ranks.values()} == {"n1": "n1", "n2": "n2"}
        assert ranks[0]["hostname"] != ranks[2]["hostname"]

        places = sj.places(cluster, job)
        master = ipaddress.ip_address(places[0].master_addr)
        assert master in ipaddress.ip_network(NETNS_RANGE), places[0]
        assert str(master) == status["network"]["nodes"][places[0].node]["addr"]

        # the lab's hosts file lived only in the nodes' own mount namespaces
        assert Path("/etc/hosts").read_bytes() == hosts_before
        assert socket.gethostname() not in ("n1", "n2")
    finally:
        try:
            cluster.down()
            _assert_all_gone(cluster)
        finally:
            shutil.rmtree(state, ignore_errors=True)


@pytest.mark.timeout(300)
def test_up_down_three_times_leaves_nothing_behind():
    state = _state_dir()
    port_base = free_port_base(4, 17000, 19990)
    cluster = Lab(
        LabSpec(state_dir=state, nodes=3, port_base=port_base, python=sys.executable, netns=True)
    )
    other_state = Path(f"{state}-other")
    other = Lab(
        LabSpec(state_dir=other_state)
    )  # replaced below, once the first lab holds its ports
    hosts_before = Path("/etc/hosts").read_bytes()
    try:
        for cycle in range(3):
            t0 = time.monotonic()
            up_or_skip(cluster)
            t_up = time.monotonic() - t0
            assert _unreachable_route_present()
            assert sorted(_scout_namespaces()) == ["scout-n1", "scout-n2", "scout-n3"]
            assert sorted(_lab_links()) == sorted([NETNS_BRIDGE, "sv-n1", "sv-n2", "sv-n3"])
            if cycle == 0:
                # a second netns lab refuses to take the names over, and touches nothing of the
                # first
                other = Lab(
                    LabSpec(
                        state_dir=other_state,
                        nodes=2,
                        port_base=free_port_base(3, 17000, 19990),
                        python=sys.executable,
                        netns=True,
                    )
                )
                with pytest.raises(LabError, match=f"owner: scout-lab:{cluster.paths.root}"):
                    other.up()
                assert other.running_pids() == []
                assert sorted(_scout_namespaces()) == ["scout-n1", "scout-n2", "scout-n3"]
            if cycle == 1:
                # a crash: every daemon killed -9, plus a stray process left inside a node's
                # namespace
                slurmd = int((cluster.paths.run / "slurmd-n2.pid").read_text())
                stray = subprocess.Popen(
                    ["nsenter", "-t", str(slurmd), "-n", "sleep", "600"], start_new_session=True
                )
                time.sleep(0.3)
                killed = cluster.running_pids()
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10
                while any(_alive(pid) for pid in killed) and time.monotonic() < deadline:
                    time.sleep(0.05)
            t1 = time.monotonic()
            cluster.down()
            t_down = time.monotonic() - t1
            print(f"cycle {cycle}: up {t_up:.2f} s, down {t_down:.2f} s")
            if cycle == 1:
                stray.wait(timeout=10)
            _assert_all_gone(cluster)
            assert cluster.status()["network"]["removed"]
            assert cluster.down() == []  # idempotent
            _assert_all_gone(cluster)
        assert Path("/etc/hosts").read_bytes() == hosts_before
    finally:
        try:
            other.down()
            cluster.down()
        finally:
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(other_state, ignore_errors=True)
