"""The evidence root on a mount that stops answering (tests/frozenfs.py: a FUSE mount whose daemon
is stopped, so what touches it sits in D state): every privileged hook returns within its budget
plus a few seconds, exits 0 (or its deliberate hardware-error code), and says why in its local
log on the node's own disk. Thawed and unmounted whatever happens."""

from __future__ import annotations

import json
import time
from pathlib import Path

import frozenfs
import pytest

from scout_slurm.hooks import bounded, controller, epilog, prolog
from tests.unit.test_hooks_never_drain import JOB, Site, node_evidence, write_job_tree
from tests.unit.test_hwmap import GPU_IB, FakeNvml, loader_of, two_gpus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs"),
]

BUDGET_S = 6.0  # [epilog] time_budget_s and [prolog] time_budget_s of these sites
SLACK_S = 5.0  # what the brief allows past the budget (Slurm's own timeout is the site's)


def local_events(site: Site, hook: str) -> list[dict]:
    path = site.tmp / "hook-log" / f"{hook}.log"
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def hung_site(tmp_path: Path, fs: frozenfs.FrozenMount, *, hardware_drain: bool = False) -> Site:
    """A site whose evidence root is on the mount, a scout job's tree in it, config and local log
    on the local disk; budgets of BUDGET_S."""
    root = fs.path / "evidence"
    (fs.source / "evidence").mkdir()
    site = Site(tmp_path, root, tmp_path / "scout.toml", tmp_path / "nobin")
    site.nobin.mkdir()
    drain = "drain_on_local_hardware_error = true\n" if hardware_drain else ""
    site.write_config(f"{drain}[drain]\nverdict_wait_s = 2\nroot_check_s = 2\n")
    text = site.config.read_text()
    text = text.replace("[prolog]\ntime_budget_s = 8", f"[prolog]\ntime_budget_s = {BUDGET_S:g}")
    text = text.replace("[epilog]\ntime_budget_s = 20", f"[epilog]\ntime_budget_s = {BUDGET_S:g}")
    site.config.write_text(text)
    write_job_tree(site.job_dir)
    return site


def timed(fn) -> tuple[int, float]:
    started = time.monotonic()
    code = fn()
    return code, time.monotonic() - started


@pytest.mark.parametrize("hardware_error", [False, True])
def test_the_node_epilog_keeps_its_budget_on_a_hung_evidence_root(tmp_path, hardware_error):
    with frozenfs.frozen_mount(tmp_path) as fs:
        site = hung_site(tmp_path, fs, hardware_drain=hardware_error)
        env = site.env("epilog")
        fs.freeze()
        code, took = timed(
            lambda: epilog.main(
                environ=env,
                collect=lambda n, j, *, job_started_wall: node_evidence(
                    n, j, hardware_error=hardware_error
                ),
            )
        )
        # the node's own verdict stands: a local hardware error still drains where asked
        assert code == (1 if hardware_error else 0)
        assert took < BUDGET_S + SLACK_S, took
        events = {e["event"]: e for e in local_events(site, "epilog")}
        assert "epilog.evidence_root_hung" in events, events.keys()
        assert events["epilog.evidence_root_hung"]["root"] == str(site.root)
        assert "epilog.node_evidence" in events  # collected all the same
    bounded.reap_abandoned()


def test_the_node_epilog_hung_mid_write_says_where(tmp_path):
    """The root answers the first look, then hangs: the log names the stage it hung in."""
    with frozenfs.frozen_mount(tmp_path) as fs:
        site = hung_site(tmp_path, fs)
        env = site.env("epilog")

        def collect(n, j, *, job_started_wall):
            fs.freeze()  # in the child, between the root's probe and the writes
            return node_evidence(n, j, hardware_error=False)

        code, took = timed(lambda: epilog.main(environ=env, collect=collect))
        assert code == 0 and took < BUDGET_S + SLACK_S, took
        events = {e["event"]: e for e in local_events(site, "epilog")}
        hung = events["epilog.evidence_hung"]
        # the first write that reaches the daemon (what the kernel had cached may still answer)
        assert hung["stage"] in ("laying out this node's folder", "writing the node digest"), hung
        assert hung["abandoned"] is True
        assert hung["budget_s"] == BUDGET_S
    bounded.reap_abandoned()


def test_the_controller_epilog_keeps_its_budget_on_a_hung_evidence_root(tmp_path):
    with frozenfs.frozen_mount(tmp_path) as fs:
        site = hung_site(tmp_path, fs)
        env = site.env("controller")
        fs.freeze()
        code, took = timed(lambda: controller.main(environ=env))
        assert code == 0 and took < BUDGET_S + SLACK_S, took
        events = {e["event"]: e for e in local_events(site, "controller")}
        assert "controller.evidence_root_hung" in events, events.keys()
        assert events["controller.evidence_root_hung"]["job"] == JOB
    bounded.reap_abandoned()


def test_the_prolog_keeps_its_budget_on_a_hung_evidence_root(tmp_path, monkeypatch):
    with frozenfs.frozen_mount(tmp_path) as fs:
        site = hung_site(tmp_path, fs)
        for key, value in site.env("prolog").items():
            monkeypatch.setenv(key, value)
        fs.freeze()
        code, took = timed(
            lambda: prolog.main(
                sysfs_root=GPU_IB / "sys",
                proc_root=GPU_IB / "proc",
                nvml_loader=loader_of(FakeNvml(two_gpus())),
            )
        )
        assert code == 0 and took < BUDGET_S + SLACK_S, took
        events = {e["event"]: e for e in local_events(site, "prolog")}
        assert "prolog.folder_timeout" in events, events.keys()
        assert events["prolog.folder_timeout"]["abandoned"] is True
    bounded.reap_abandoned()


def test_an_nvml_call_that_never_returns_does_not_hold_the_node_epilog(tmp_path, monkeypatch):
    """A GPU fallen off the bus can leave NVML's calls hanging: a stand-in NVML library whose init
    never returns (in the Epilog's own node-evidence collection, the real one) costs the Epilog
    its budget at most, then it exits 0 and says which stage hung."""
    import sys
    import types

    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def hang() -> None:
        time.sleep(3600)

    fake.NVMLError, fake.nvmlInit = NVMLError, hang
    monkeypatch.setitem(sys.modules, "pynvml", fake)  # the forked collection inherits it
    root = tmp_path / "evidence"
    site = Site(tmp_path, root, tmp_path / "scout.toml", tmp_path / "nobin")
    site.nobin.mkdir()
    site.write_config()
    text = site.config.read_text()
    site.config.write_text(
        text.replace("[epilog]\ntime_budget_s = 20", f"[epilog]\ntime_budget_s = {BUDGET_S:g}")
    )
    write_job_tree(site.job_dir)
    code, took = timed(lambda: epilog.main(environ=site.env("epilog")))
    assert code == 0 and took < BUDGET_S + SLACK_S, took
    events = {e["event"]: e for e in local_events(site, "epilog")}
    hung = events["epilog.evidence_hung"]
    assert hung["stage"] == "collecting this node's evidence" and hung["budget_s"] == BUDGET_S, hung
    bounded.reap_abandoned()
