"""A DDP job with one layer whose computation does not repeat on some ranks (noise from a
generator seeded by the OS, as a kernel that differs by GPU or by run would): scout's in-situ
replay must take it for non-determinism, not for corruption, and still name a real fault in the
layers that do repeat."""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Wobbly(torch.nn.Linear):
    """A linear layer that adds a little fresh noise on the ranks in `noisy` (unseeded: the replay
    restores the job's RNG streams, not this one)."""

    def __init__(self, n: int, noisy: bool) -> None:
        super().__init__(n, n)
        self.noisy = noisy
        self.gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if self.noisy:
            y = y + 1e-3 * torch.randn(y.shape, generator=self.gen)
        return y


class Model(torch.nn.Module):
    def __init__(self, noisy: bool, n: int = 16) -> None:
        super().__init__()
        self.fc0 = torch.nn.Linear(n, n)
        self.wobbly = Wobbly(n, noisy)
        self.fc2 = torch.nn.Linear(n, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.wobbly(torch.relu(self.fc0(x)))))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--noisy-ranks", default="2", help="comma-separated ranks, or 'all'")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    noisy = args.noisy_ranks == "all" or str(rank) in args.noisy_ranks.split(",")
    ddp = DDP(Model(noisy))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(args.steps):
        loss = ddp(torch.randn(8, 16, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank}: done", flush=True)
    del ddp, opt
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
