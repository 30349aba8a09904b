"""(c) of scripts/device_check.sh: a small DDP job over gloo whose tensors live on --device (two
processes may share one GPU over gloo, where NCCL refuses a duplicate device), run under scout's
bootstrap by the script (its PYTHONPATH) so that the state votes, the at-rest witness, the update
replay and the in-situ replay sign and compare the device's tensors. Prints `rank R: done`."""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.LayerNorm(256), torch.nn.Linear(256, 8)
    ).to(device)
    ddp = DDP(model, device_ids=None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(a.steps):
        x = torch.randn(32, 64, generator=g).to(device)
        y = torch.randint(0, 8, (32,), generator=g).to(device)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    del ddp, opt
    dist.destroy_process_group()
    print(f"rank {rank}: done, loss {loss.item():.4f}, pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
