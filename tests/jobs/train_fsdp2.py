"""A small FSDP2 training job for the tests: pure FSDP (`fully_shard` over a 1-D mesh of every
rank) or, with --hsdp, HSDP (a 2-D DeviceMesh, replicate x shard: (world / shard) x shard).
Knows nothing of scout. Deterministic on CPU with gloo; each rank reads its own data stream.
"""

import argparse
import datetime
import gc
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--hsdp", action="store_true", help="2-D mesh: replicate x shard")
    ap.add_argument("--shard", type=int, default=2, help="HSDP: ranks per shard group")
    ap.add_argument(
        "--clip-weights",
        type=float,
        default=0.0,
        help="clamp every weight to +-this after each step, on every rank (0: no)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="gloo timeout, seconds")
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.hsdp:
        mesh = init_device_mesh(
            "cpu", (world // args.shard, args.shard), mesh_dim_names=("replicate", "shard")
        )
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 32, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (
            args.clip_weights
        ):  # the job's own change of its weights between steps (WGAN-style clipping)
            with torch.no_grad():
                for p in model.parameters():
                    p.clamp_(-args.clip_weights, args.clip_weights)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {logged.item() / world:.6f}", flush=True)
    del model, opt
    gc.collect()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
