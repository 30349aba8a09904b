"""A DDP job with several gradient buckets (a small bucket cap), for the bit-identity test: every
rank writes the sha256 of its final parameters' bytes, how many comm hooks DDP holds, and the type
of the group DDP reduces through, to OUT-rank-N.txt. With --late-rank R, rank R sleeps --late-s in
each backward before its first layer's gradient is reduced: the other ranks' backward graphs end
with that last bucket still in flight."""

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", required=True)
    ap.add_argument("--late-rank", type=int, default=-1)
    ap.add_argument("--late-s", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(96, 96), torch.nn.GELU()) for _ in range(4)],
        torch.nn.Linear(96, 3),
    )
    if rank == args.late_rank:  # before the gradient reaches DDP's hook on the first layer's weight
        model[0][0].weight.register_hook(lambda g: time.sleep(args.late_s) or g)
    ddp = DDP(
        model, bucket_cap_mb=0.04
    )  # about 2 layers a bucket: several buckets, reduced in flight
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(8, 96, generator=gen)
        loss = torch.nn.functional.cross_entropy(ddp(x), torch.randint(0, 3, (8,), generator=gen))
        opt.zero_grad()
        loss.backward()
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    with open(f"{args.out}-rank-{rank}.txt", "w") as fh:
        fh.write(
            f"{h.hexdigest()} hooks={len(ddp._comm_hooks)} "
            f"group={type(ddp.process_group).__name__}\n"
        )
    del ddp, opt
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
