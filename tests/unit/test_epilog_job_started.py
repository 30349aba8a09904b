"""The Epilog's "when did the job start on this node" reads only what the root Prolog wrote: no link
below the evidence root is followed and a file the job owns is not believed (the time bounds which
kernel log lines root attaches to the incident)."""

from __future__ import annotations

import os

import pytest

from scout_slurm.evidence.layout import JobFolder
from scout_slurm.hooks.epilog import _job_started

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="ownership checks need root to create root-owned files"
)


def _folder(tmp_path) -> JobFolder:
    root = tmp_path / "evidence"
    root.mkdir()
    return JobFolder(root, "lab", 42)


def _write_map(path, when=1_700_000_000.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{}")
    os.utime(path, (when, when))


def test_the_prologs_map_gives_the_time(tmp_path):
    f = _folder(tmp_path)
    _write_map(f.node_dir("n1") / "hardware-map.json")
    assert _job_started(f, "n1") == 1_700_000_000.0


def test_absent_map_gives_zero(tmp_path):
    assert _job_started(_folder(tmp_path), "n1") == 0.0


@pytest.mark.parametrize("planted", ["nodes", "node", "file"])
def test_a_planted_link_anywhere_gives_zero(tmp_path, planted):
    f = _folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    _write_map(elsewhere / "n1" / "hardware-map.json")
    if planted == "nodes":
        f.path.mkdir(parents=True)
        os.symlink(elsewhere, f.nodes_dir)
    elif planted == "node":
        f.nodes_dir.mkdir(parents=True)
        os.symlink(elsewhere / "n1", f.node_dir("n1"))
    else:
        f.node_dir("n1").mkdir(parents=True)
        os.symlink(elsewhere / "n1" / "hardware-map.json", f.node_dir("n1") / "hardware-map.json")
    assert _job_started(f, "n1") == 0.0


def test_a_map_the_job_owns_gives_zero(tmp_path):
    f = _folder(tmp_path)
    p = f.node_dir("n1") / "hardware-map.json"
    _write_map(p)
    os.chown(p, 4242, 4242)
    assert _job_started(f, "n1") == 0.0


def test_a_fifo_in_its_place_gives_zero(tmp_path):
    f = _folder(tmp_path)
    f.node_dir("n1").mkdir(parents=True)
    os.mkfifo(f.node_dir("n1") / "hardware-map.json")
    assert _job_started(f, "n1") == 0.0


@pytest.mark.parametrize("planted", ["run", "leaf"])
@pytest.mark.parametrize("which", ["findings", "ranks"])
def test_the_job_owned_folders_are_listed_without_following_a_planted_link(
    tmp_path, planted, which
):
    """Whether a run left findings or rank records is listed through no-follow directory fds: a
    link the job planted at `run-N` or at the folder itself lists nothing."""
    from scout_slurm.hooks.epilog import _has_findings, _ran_under_scout

    listed = {"findings": _has_findings, "ranks": _ran_under_scout}[which]
    f = _folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / which).mkdir(parents=True)
    (elsewhere / which / "0.json").write_text("{}")
    leaf = f.findings_dir(0) if which == "findings" else f.ranks_dir(0)
    if planted == "run":
        f.path.mkdir(parents=True)
        os.symlink(elsewhere, f.run_dir(0))
    else:
        leaf.parent.mkdir(parents=True)
        os.symlink(elsewhere / which, leaf)
    assert listed(f, 0) is False
    # the same names in the real folder are seen
    os.unlink(f.run_dir(0) if planted == "run" else leaf)
    leaf.mkdir(parents=True, exist_ok=True)
    (leaf / "0.json").write_text("{}")
    assert listed(f, 0) is True
