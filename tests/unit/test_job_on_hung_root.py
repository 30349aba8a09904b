"""The job's own side on a hung evidence root (tests/frozenfs.py: a FUSE mount whose daemon is
stopped): the real `scout-task` shim runs a program that counts its steps on stdout, with the
evidence root on the mount. Frozen mid-run, the program's steps go on, the shim says the stall
once and ends with the program's own code within its exit bound; frozen from the start, the
task runs unwatched (said once) and ends with the program's code. No Slurm: the shim reads the
task's place from the SLURM_* variables a one-task step would give it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import frozenfs
import pytest

from scout_slurm.task import shim

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(frozenfs.why_not()), reason=frozenfs.why_not() or "runs"),
]

SCOUT_TASK = Path(sys.executable).parent / "scout-task"
JOB, CLUSTER = 4711, "c"
# counts 0.1 s steps on stdout, writes nothing anywhere, ends with code 3
PROGRAM = (
    "import sys, time\n"
    "for i in range(int(sys.argv[1])):\n"
    "    print(f'step {i} {time.monotonic():.3f}', flush=True)\n"
    "    time.sleep(0.1)\n"
    "sys.exit(3)\n"
)


def task_env(tmp: Path, root: Path) -> dict[str, str]:
    config = tmp / "scout.toml"
    config.write_text(
        f'[evidence]\nroot = "{root}"\nhook_log_dir = "{tmp / "hook-log"}"\n'
        "[watchdog]\npublish_interval_s = 0.5\nsteady_publish_interval_s = 1\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SCOUT_"))}
    env.update(
        {
            "SCOUT_CONFIG": str(config),
            "SLURM_JOB_ID": str(JOB),
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": "0",
            "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_LOCALID": "0",
            "SLURM_STEP_TASKS_PER_NODE": "1",
            "SLURMD_NODENAME": "n1",
            "SLURM_CLUSTER_NAME": CLUSTER,
            "SLURM_GTIDS": "0",
        }
    )
    return env


class Steps:
    """The program's step lines as they come, with when they came."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, int]] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if line.startswith("step "):
                self.lines.append((time.monotonic(), int(line.split()[1])))

    def wait_for(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        while len(self.lines) < n:
            assert time.monotonic() < end, f"only {len(self.lines)} steps"
            time.sleep(0.05)

    def between(self, start: float, end: float) -> int:
        return sum(start <= t <= end for t, _ in self.lines)


def start_task(tmp: Path, root: Path, steps: int) -> tuple[subprocess.Popen, Steps]:
    proc = subprocess.Popen(
        [str(SCOUT_TASK), "--", sys.executable, "-c", PROGRAM, str(steps)],
        env=task_env(tmp, root),
        cwd=tmp,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, Steps(proc)


def test_a_root_frozen_mid_run_does_not_stop_the_steps_nor_hold_the_exit(tmp_path):
    with frozenfs.frozen_mount(tmp_path) as fs:
        root = fs.path / "evidence"
        (fs.source / "evidence").mkdir()
        proc, steps = start_task(tmp_path, root, steps=90)  # 9 s of steps
        try:
            steps.wait_for(15, timeout=30)
            run = fs.source / "evidence" / CLUSTER / str(JOB) / "run-0"
            assert (run / "ranks" / "rank-0.json").is_file()  # written before the freeze
            frozen_at = time.monotonic()
            fs.freeze()
            code = proc.wait(timeout=60)
            ended = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
            fs.thaw()
        err = proc.stderr.read()
        steps.thread.join(5)
        assert code == 3, err  # the program's own code
        # the steps went on while the root was frozen: about 10 a second, from the freeze on
        assert steps.lines[-1][1] == 89 and steps.between(frozen_at, ended) >= 40, steps.lines
        # the program's last step to the task's end: its exit bound and a little, not the freeze
        assert ended - steps.lines[-1][0] < shim.EXIT_FLUSH_S + 3.0, ended - steps.lines[-1][0]
        assert err.count("has not answered for") == 1, err
        assert "training goes on" in err and str(root) in err
        assert "did not take scout's last" in err, err  # the exit record: lost, said once


def test_a_root_frozen_at_start_runs_the_task_unwatched(tmp_path):
    with frozenfs.frozen_mount(tmp_path) as fs:
        root = fs.path / "evidence"
        (fs.source / "evidence").mkdir()
        fs.freeze()
        started = time.monotonic()
        proc, steps = start_task(tmp_path, root, steps=20)
        try:
            code = proc.wait(timeout=60)
            took = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
            fs.thaw()
        err = proc.stderr.read()
        steps.thread.join(5)
        assert code == 3, err
        assert len(steps.lines) == 20
        assert took < shim.ROOT_PROBE_S + 2.0 + 5.0, took  # the probe's bound, 2 s of steps
        assert err.count("this task runs unwatched") == 1, err
        assert "did not take" not in err  # a probe is no record lost
