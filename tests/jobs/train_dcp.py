"""A small DDP (or FSDP2) job that checkpoints through torch.distributed.checkpoint (every rank
takes part)
and can resume from such a folder. Knows nothing of scout."""

import argparse
import datetime
import os
import random
import sys

import numpy
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--save-at", type=int, default=4)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument(
        "--fsdp",
        action="store_true",
        help="FSDP2 over every rank (each holds a shard) instead of DDP",
    )
    ap.add_argument(
        "--rename-from-tmp",
        action="store_true",
        help="save into CKPT.tmp/, then rank 0 renames the folder to CKPT/ (after a barrier)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)  # never drawn from: seeded, the resumed run's streams equal the saved ones
    numpy.random.seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if args.fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
        ddp = model
    else:
        ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    start = 0
    if args.resume:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
        dcp.load(state, checkpoint_id=args.ckpt)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from {args.ckpt} at step {start}", flush=True)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(start):
        torch.randn(4, 8, generator=gen)
    for step in range(start + 1, args.steps + 1):
        loss = ddp(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.save_at and not args.resume:
            msd, osd = get_state_dict(model, opt)
            where = args.ckpt + ".tmp" if args.rename_from_tmp else args.ckpt
            dcp.save({"model": msd, "optim": osd, "step": torch.tensor(step)}, checkpoint_id=where)
            if args.rename_from_tmp:
                dist.barrier()  # every rank is done with the folder
                if rank == 0:
                    os.rename(where, args.ckpt)
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
