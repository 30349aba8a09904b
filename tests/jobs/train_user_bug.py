"""A user's training script with a bug: DDP on gloo, and on one rank a ValueError raised by the
script's own code at one step, every run (`--transient`: only on the job's first run, as a passing
error would)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def check_batch(batch: torch.Tensor, step: int, args) -> None:
    first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    if dist.get_rank() == args.rank and step == args.step and (first_run or not args.transient):
        raise ValueError(f"batch {step} has {batch.shape[0]} rows, expected 17")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--step", type=int, default=5)
    ap.add_argument("--transient", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        batch = torch.randn(8, 16)
        check_batch(batch, step, args)
        model(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
