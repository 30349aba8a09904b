"""A small DDP job that registers its own comm hook (torch's stock allreduce_hook) before the
first forward, for tests of how scout's bootstrap composes with a user's hook. Knows nothing of
scout. Rank 0 saves a scratch state dict to a dot-name and a final one to --save-dir.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0, help="gloo timeout, seconds")
    ap.add_argument("--save-dir", default="", help="rank 0 saves .scratch.pt and final.pt here")
    ap.add_argument("--out", default="", help="rank 0 writes the final parameter checksum here")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    ddp.register_comm_hook(None, allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(args.steps):
        loss = ddp(torch.randn(16, 32, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
    if rank == 0 and args.save_dir:
        torch.save(model.state_dict(), os.path.join(args.save_dir, ".scratch.pt"))
        torch.save(model.state_dict(), os.path.join(args.save_dir, "final.pt"))
    if rank == 0 and args.out:
        with open(args.out, "w") as fh:
            fh.write(" ".join(f"{p.double().sum().item():.12e}" for p in model.parameters()) + "\n")
    del ddp, opt
    import gc

    gc.collect()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
