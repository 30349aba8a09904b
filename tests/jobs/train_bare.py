"""A small DDP job for a Python that has torch and nothing else (no numpy, no xxhash): AdamW (its
`step` is a 0-d tensor, signed by every check), a plain torch.save at one step and the atomic save
(NAME.tmp, then os.replace) at another, both by rank 0. Knows nothing of scout."""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--plain-save-at", type=int, default=4)
    ap.add_argument("--atomic-save-at", type=int, default=8)
    ap.add_argument("--ckpt-dir", required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(100 + rank)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    for step in range(1, args.steps + 1):
        loss = ddp(torch.randn(8, 16, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank != 0:
            continue
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
        final = os.path.join(args.ckpt_dir, f"step-{step}.pt")
        if step == args.plain_save_at:
            torch.save(state, final)
        elif step == args.atomic_save_at:  # a reader never sees a partly written NAME
            torch.save(state, final + ".tmp")
            os.replace(final + ".tmp", final)
    del ddp, opt
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
