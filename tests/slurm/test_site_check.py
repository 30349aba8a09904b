"""`scout site check` on the real lab: its slurm.conf (through `scontrol show config`), its site
config, its hooks and the evidence a real job's Prolog laid out pass; a results/ folder made
writable by others is a FAIL line with its remedy, and the check changes nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import scoutjobs as sj

pytestmark = [pytest.mark.slurm]


def _check(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scout_slurm.cli", "site", "check", *args],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
        cwd="/",
    )


@pytest.mark.timeout(120)
def test_site_check_passes_on_the_lab_and_finds_a_results_folder_others_may_write(lab):
    job = sj.submit(lab, "#!/bin/sh\ntrue\n", nodes=1, tasks_per_node=1)
    assert sj.wait_completed(lab, job, timeout=60).state == "COMPLETED"
    results = sj.folder(lab, job).results_dir
    assert results.is_dir()

    res = _check(lab, "--json")
    report = json.loads(res.stdout)
    fails = [f for f in report["findings"] if f["severity"] == "FAIL"]
    assert res.returncode == 0 and report["ok"] is True and not fails, res.stdout + res.stderr
    ok = {(f["check"], f["message"]) for f in report["findings"] if f["severity"] == "ok"}
    assert ("slurm", "PrologFlags=Alloc") in ok
    assert any(c == "slurm" and m.startswith("Slurm 22.05") for c, m in ok), ok
    for hook in ("Prolog", "Epilog", "EpilogSlurmctld"):
        assert any(c == hook and m.startswith("scout's hook ") for c, m in ok), (hook, ok)
    assert any(c == "evidence" and "job folder(s) owned and writable" in m for c, m in ok), ok

    mode = stat.S_IMODE(os.stat(results).st_mode)
    os.chmod(results, mode | 0o002)
    try:
        res = _check(lab)
        after = stat.S_IMODE(os.stat(results).st_mode)
    finally:
        os.chmod(results, mode)
    assert res.returncode == 1, res.stdout + res.stderr
    assert after == mode | 0o002  # found, not fixed
    lines = res.stdout.splitlines()
    (i,) = [i for i, line in enumerate(lines) if line.startswith("FAIL")]
    assert lines[i].startswith("FAIL  evidence        1 results/ folder(s) not as the design")
    assert f"{results} writable by group or others (mode {mode | 0o002:04o})" in lines[i]
    assert f"-> chown {lab.users['slurm_user']}: {results} && chmod 755 {results}" in lines[i + 1]
    assert lines[-1].startswith("1 failed")
