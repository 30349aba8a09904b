"""Shared fixtures: one real lab cluster per test session (started by the project's own code,
stopped also on failure), and helpers to submit jobs and wait for them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/scoutjobs.py and friends

from scout_slurm.lab.cluster import Lab, LabSpec, free_port_base

_pick_port_base = free_port_base


def up_or_skip(cluster: Lab) -> None:
    """Start a lab; skip (saying why) where this machine refuses network namespaces."""
    from scout_slurm.errors import LabError

    try:
        cluster.up()
    except LabError as exc:
        text = str(exc)
        if "refuses network namespaces" in text or "needs root with CAP_NET_ADMIN" in text:
            pytest.skip(f"network namespaces are refused here: {text}")
        raise


@pytest.fixture(autouse=True)
def _default_logging():
    """Each test starts with the library's default logging (info, to stderr): a `scout` command run
    in-process sets the operator level (warnings only) for the rest of its process."""
    from scout_slurm.log import configure

    configure()
    yield


def pytest_addoption(parser):
    parser.addoption(
        "--slurm-version",
        default="",
        metavar="RELEASE",
        help="Slurm release of the session lab every tests/slurm test uses: the host's (default), "
        "24.11 or 26.05 (run from a cached Debian root, see docs/SITE-ADMIN.md 'Slurm versions')",
    )
    parser.addoption(
        "--slurm-releases",
        default="24.11,26.05",
        metavar="LIST",
        help="releases the tests marked slurm_release run on (one lab per release per session); "
        "'none' skips them",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slurm_release: runs on each release of --slurm-releases, one lab per release "
        "per session (fixture release_lab)",
    )


def pytest_generate_tests(metafunc):
    if "release_lab" in metafunc.fixturenames:
        text = metafunc.config.getoption("--slurm-releases")
        releases = [r.strip() for r in text.split(",") if r.strip() and r.strip() != "none"]
        metafunc.parametrize("release_lab", releases, indirect=True, scope="session")


def leftovers(cluster: Lab) -> dict[str, list]:
    """What a stopped lab left behind: processes, mounts under its folder, its network
    namespaces.
    """
    from scout_slurm.lab.cluster import _processes_in_root, netns_of
    from scout_slurm.lab.roots import mounts_under

    namespaces = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    return {
        "processes": cluster.running_pids() + _processes_in_root(cluster.paths.rootfs),
        "mounts": mounts_under(cluster.paths.root),
        "namespaces": sorted(
            namespaces & {netns_of(n) for n in cluster.spec.node_names()}
            if cluster.spec.netns
            else set()
        ),
    }


def _session_lab(request, slurm: str, tag: str):
    """A real 4-node Slurm cluster of release `slurm` ("" = the host's) for the whole session,
    stopped
    (and its folder removed) at the end, also when a test or the start itself fails; after the stop
    nothing of it may remain (asserted)."""
    import shutil

    state = Path(f"/tmp/scout-lab-test-{os.getpid()}{tag}")
    spec = LabSpec(
        state_dir=state,
        nodes=4,
        port_base=_pick_port_base(6),
        python=sys.executable,
        cpus_per_node=16,
        slurm=slurm,
    )  # room for the load test: 20 two-rank jobs at once
    cluster = Lab(spec)
    try:
        cluster.up()
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:  # the release every test of this lab ran on, in the test log
            reporter.write_line(f"lab {state}: {cluster.slurm_version()}")
        yield cluster
    finally:
        try:
            cluster.down()
            left = leftovers(cluster)
            assert not any(left.values()), f"lab down left {left}"
        finally:
            if not os.environ.get("SCOUT_KEEP_LAB"):
                shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def lab(request) -> Lab:
    """The session lab, of the release --slurm-version names (default: the host's)."""
    yield from _session_lab(request, request.config.getoption("--slurm-version"), "")


@pytest.fixture(scope="session")
def release_lab(request) -> Lab:
    """A session lab of one release of --slurm-releases (parametrized in pytest_generate_tests)."""
    yield from _session_lab(request, request.param, f"-{request.param}")


@pytest.fixture()
def clean_release_drains(release_lab):
    from scoutjobs import resume_scout_drains

    yield
    resume_scout_drains(release_lab)


@pytest.fixture()
def lab_env(lab) -> dict[str, str]:
    return lab.client_env()


@pytest.fixture()
def clean_drains(lab):
    """Nodes that scout drained during a test are returned to service after it, also on failure."""
    from scoutjobs import resume_scout_drains

    yield
    resume_scout_drains(lab)
