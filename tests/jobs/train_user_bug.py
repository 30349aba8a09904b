"""A user's training script as researchers write them: DDP on gloo, AdamW, and
- `--rank R --step S`: a bug, a ValueError raised by the script's own code on rank R at step S,
  every run (`--transient`: only on the job's first run, as a passing error would; `--hang`: a
  wait of the script's own that never ends, instead of the exception);
- `--ckpt PATH`: rank 0 saves to one path, replaced in place every `--ckpt-every` steps, and every
  run loads that file when it exists (the script's own choice, not scout's)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def check_batch(batch: torch.Tensor, step: int, args) -> None:
    first_run = os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
    if dist.get_rank() == args.rank and step == args.step and (first_run or not args.transient):
        if args.hang:
            wait_for_the_next_shard()
        raise ValueError(f"batch {step} has {batch.shape[0]} rows, expected 17")


def wait_for_the_next_shard() -> None:
    """The user's own wait that never ends (a polling loop on a file nobody writes)."""
    while True:
        time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rank", type=int, default=1)
    ap.add_argument("--step", type=int, default=5)
    ap.add_argument("--transient", action="store_true")
    ap.add_argument("--hang", action="store_true", help="wait forever in the script's own code")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--ckpt-every", type=int, default=4)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    start = 0
    if args.ckpt and os.path.exists(args.ckpt):
        state = torch.load(args.ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        print(f"rank {dist.get_rank()}: loaded {args.ckpt} at step {start}", flush=True)
    for step in range(start, args.steps):
        batch = torch.randn(8, 16)
        check_batch(batch, step, args)
        model(batch).square().mean().backward()
        opt.step()
        opt.zero_grad()
        if args.ckpt and dist.get_rank() == 0 and (step + 1) % args.ckpt_every == 0:
            tmp = args.ckpt + ".tmp"
            torch.save(
                {"model": model.state_dict(), "opt": opt.state_dict(), "step": step + 1}, tmp
            )
            os.replace(tmp, args.ckpt)
        time.sleep(0.05)
    print(f"rank {dist.get_rank()}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
