"""A DDP job with a slow start: it initialises, builds DDP (its first collectives), then spends
`--startup-sleep` seconds before its first step (imports, compiling, loading data), as
`deepspeed.initialize` does. `--sleep-rank R` sleeps on that rank only (the others wait for it in
their first all-reduce: a hang before the first step). With `--before-init` the sleep comes
before init_process_group instead (the others wait for it at the rendezvous: a startup hang)."""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class SlowToWrite:
    """Stands in for a large checkpoint on slow storage: pickling it takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self):
        time.sleep(self.seconds)
        return (float, (self.seconds,))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--startup-sleep", type=float, default=40.0)
    ap.add_argument("--sleep-rank", type=int, default=-1, help="-1: every rank sleeps")
    ap.add_argument(
        "--slow-save", type=float, default=0.0, help="at step 10 rank 0 saves for this long"
    )
    ap.add_argument(
        "--eval-seconds", type=float, default=0.0, help="at step 10 every rank evaluates this long"
    )
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--load-after-init",
        type=float,
        default=0.0,
        help="seconds spent after init_process_group, before the job's first collective (a "
        "barrier)",
    )
    ap.add_argument(
        "--before-init",
        action="store_true",
        help="sleep before init_process_group (the rank from RANK, as scout-task sets it)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    if args.before_init and args.sleep_rank in (-1, int(os.environ["RANK"])):
        print(
            f"rank {os.environ['RANK']}: loading before init_process_group "
            f"({args.startup_sleep:g} s)",
            flush=True,
        )
        time.sleep(args.startup_sleep)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    if args.load_after_init and args.sleep_rank in (-1, rank):
        print(
            f"rank {rank}: loading after init_process_group ({args.load_after_init:g} s)",
            flush=True,
        )
        time.sleep(args.load_after_init)
    if args.load_after_init:
        dist.barrier()  # the job's first collective: where the others wait for a rank still loading
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    dist.barrier()
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    if not args.before_init and args.sleep_rank in (-1, rank):
        print(f"rank {rank}: starting slowly ({args.startup_sleep:g} s)", flush=True)
        time.sleep(args.startup_sleep)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(1, args.steps + 1):
        loss = ddp(torch.randn(16, 32, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
        if (
            step == 10 and args.slow_save and rank == 0
        ):  # the others wait for it in step 11's all-reduce
            torch.save(
                {"model": ddp.module.state_dict(), "slow": SlowToWrite(args.slow_save)},
                "slow-save.pt",
            )
        if (
            step == 10 and args.eval_seconds
        ):  # forwards without a collective (the inner model, no DDP)
            end = time.monotonic() + args.eval_seconds
            with torch.no_grad():
                while time.monotonic() < end:
                    ddp.module(torch.randn(16, 32, generator=gen))
                    time.sleep(0.05)
    print(f"rank {rank}: done", flush=True)
    del ddp, opt
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
