"""The demo job with two things a user's script may have. KEEP_ALIVE=1: a non-daemon thread that
never ends (a metrics uploader, say), so a rank whose main thread raised stays alive and idle
instead of exiting. OOM_RANK=R (and OOM_STEP=S, default 5): after optimizer step S, rank R
allocates 8 GiB under an address-space limit (RLIMIT_AS) it set for that allocation only, so the
CPU allocator's own out-of-memory error is raised from the optimizer step of that rank alone."""

import os
import resource
import runpy
import threading
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import scout_slurm.lab

if os.environ.get("KEEP_ALIVE") == "1":
    threading.Thread(target=threading.Event().wait, name="keep-alive", daemon=False).start()


def _allocate_beyond_limit() -> None:
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (256 << 20), hard))
    try:
        torch.empty(1 << 31, dtype=torch.float32)  # 8 GiB: beyond the limit, the allocator fails
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


if os.environ.get("OOM_RANK") is not None and os.environ.get("OOM_RANK") == os.environ.get("RANK"):
    steps = [0]
    at = int(os.environ.get("OOM_STEP", "5"))

    def _after_step(optimizer, args, kwargs) -> None:
        steps[0] += 1
        if steps[0] == at:
            _allocate_beyond_limit()

    register_optimizer_step_post_hook(_after_step)

runpy.run_path(str(Path(scout_slurm.lab.__file__).parent / "train_demo.py"), run_name="__main__")
