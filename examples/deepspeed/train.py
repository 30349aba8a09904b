"""A tiny DeepSpeed job on CPU (gloo): ZeRO stage 0-3 with torch's Adam, `--startup-sleep`
seconds between `deepspeed.initialize` and the first step (a slow start-up: imports, compiling,
data loading). DeepSpeed's CPU shared-memory all-reduce op (`deepspeed_shm_comm`) is turned off:
it only speeds up CPU all-reduce (gloo does the work without it) and its first use compiles C++ for
minutes."""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--zero", type=int, default=2, choices=(0, 1, 2, 3))
    ap.add_argument(
        "--startup-sleep", type=float, default=0.0, help="seconds between initialize and step 1"
    )
    ap.add_argument("--backend", default="gloo", help="gloo on CPU; nccl on GPUs")
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="unused (DeepSpeed sets its own); kept for the tests",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = (
        False  # no C++ compile at init (see above)
    )
    deepspeed.init_distributed(dist_backend=args.backend)
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    config = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero},
        "steps_per_print": 10**9,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=config
    )
    time.sleep(args.startup_sleep)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _step in range(1, args.steps + 1):
        x = torch.randn(8, 32, generator=gen)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        time.sleep(args.step_sleep)
    print(f"rank {rank}: done", flush=True)
    del engine
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
