"""scripts/device_check.sh, dry-run on this machine's CPU: it finds no GPU and says so, runs the
CPU-runnable checks (the device signature, a 2-rank DDP job under scout's bootstrap signing by
the device path, the layers' recomputation), writes its findings into the folder it is given and
exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the script is not dry")
def test_dry_run_on_cpu_says_no_gpu_and_runs_the_cpu_parts(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SCOUT_") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    env["PYTHON"] = sys.executable
    out = tmp_path / "found"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_check.sh"), str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (out / "summary.txt").read_text()
    assert "no GPU" in summary, summary
    for name in ("sig", "recompute"):
        assert json.loads((out / f"{name}.json").read_text())["status"] == "ok", summary
    assert "RESULT ddp ok" in summary and "0 finding(s)" in summary, summary
    assert "votes 4" in summary and "replay_failed_rounds 0" in summary, summary
    assert "(uuid)\n  skipped: no GPU" in summary and "(stall)\n  skipped: no GPU" in summary
    err = (out / "ddp" / "rank-0.err").read_text()
    assert "CPU tensors signed by the device path" in err, err
