"""torchrun's agent as the instrument for its workers (scout_slurm/bootstrap/agent.py): a real
torchrun, with scout's bootstrap on PYTHONPATH as scout-task gives it, records each attempt's
workers (global rank, pid) and how each ended, and torchrun's own result is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scout_slurm.bootstrap.agent import AGENT_RECORD, parse, read_agent
from tests.torch.test_bootstrap import free_port, scout_env

pytestmark = [pytest.mark.torch]

WORKER = """
import os, sys, time
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
time.sleep(0.8)
if rank == 1 and attempt < int(sys.argv[1]):
    sys.exit(3)
time.sleep(0.3)
"""


def _torchrun(tmp_path: Path, *, fails: int, max_restarts: int) -> tuple[int, str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = scout_env(tmp_path)
    torchrun = Path(sys.executable).parent / "torchrun"
    res = subprocess.run(
        [
            str(torchrun),
            "--nnodes",
            "1",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            str(max_restarts),
            "--monitor-interval",
            "0.2",
            "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}",
            str(script),
            str(fails),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    return res.returncode, res.stderr


def test_a_failed_worker_is_recorded_with_its_rank_and_code_then_the_restart(tmp_path):
    code, err = _torchrun(tmp_path, fails=1, max_restarts=1)
    assert code == 0, err[-3000:]  # torchrun restarted and the second attempt succeeded
    assert "bootstrap not installed" not in err and "cannot hook" not in err, err[-3000:]
    record = read_agent(tmp_path / "progress")
    assert record is not None and record.max_restarts == 1
    first, second = record.attempts
    assert (first.number, first.state, first.restarting) == (0, "failed", True)
    assert [(w.rank, w.exit_code) for w in first.failed() if w.exit_code] == [(1, 3)]
    assert {w.rank for w in first.workers} == {0, 1} and all(w.pid > 0 for w in first.workers)
    assert (second.number, second.state) == (1, "succeeded")
    assert sorted((w.rank, w.exit_code, w.signal) for w in second.workers) == [(0, 0, 0), (1, 0, 0)]
    assert {w.pid for w in second.workers}.isdisjoint({w.pid for w in first.workers})


def test_torchrun_giving_up_is_recorded_as_a_failed_attempt_with_no_restart(tmp_path):
    code, err = _torchrun(tmp_path, fails=5, max_restarts=0)
    assert code == 1, err[-3000:]  # torchrun's own exit, unchanged by scout
    record = read_agent(tmp_path / "progress")
    assert record is not None
    (only,) = record.attempts
    assert (only.state, only.restarting) == ("failed", False)
    assert any(w.rank == 1 and w.exit_code == 3 for w in only.workers), only


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 2, "max_restarts": 0, "attempts": []},
        {"version": 1, "max_restarts": -1, "attempts": []},
        {"version": 1, "max_restarts": 0, "attempts": [{"number": 0, "state": "odd"}]},
        {
            "version": 1,
            "max_restarts": 0,
            "attempts": [
                {"number": 0, "state": "failed", "workers": [[0, 0, 12, 999, 0]]}  # code > 255
            ],
        },
        {
            "version": 1,
            "max_restarts": 0,
            "attempts": [{"number": 0, "state": "failed", "workers": [[True, 0, 12, 1, 0]]}],
        },
    ],
)
def test_a_record_the_job_could_have_planted_is_refused(doc):
    with pytest.raises((ValueError, TypeError)):
        parse(json.dumps(doc).encode())


def test_a_missing_or_linked_record_reads_as_none(tmp_path):
    assert read_agent(tmp_path) is None
    (tmp_path / "elsewhere.json").write_text('{"version": 1, "max_restarts": 0, "attempts": []}')
    (tmp_path / AGENT_RECORD).symlink_to(tmp_path / "elsewhere.json")
    assert read_agent(tmp_path) is None  # never followed
