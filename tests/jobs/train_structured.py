"""A DDP job whose layers take keyword arguments and return a tuple and a dataclass (as
Megatron's `(output, bias)` layers and many model libraries do): scout's in-situ replay must
capture and recompute them."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    aux: torch.Tensor
    note: str = "plain values pass through"


class Gate(torch.nn.Module):
    """Returns (output, bias), like Megatron's parallel layers; takes a tensor and a float by
    keyword.
    """

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, n) / n**0.5)
        self.bias = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor, scale: float = 1.0):
        return (x @ self.weight.t()) * mask * scale, self.bias


class Head(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(1, n) / n**0.5)

    def forward(self, x: torch.Tensor) -> Out:
        y = x @ self.weight.t()
        return Out(y=y, aux=y.detach().abs().mean())


class Model(torch.nn.Module):
    def __init__(self, n: int = 16) -> None:
        super().__init__()
        self.gate = Gate(n)
        self.head = Head(n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, b = self.gate(x, mask=(x > -1.5).to(x.dtype), scale=0.5)
        return self.head(torch.relu(h + b)).y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    ddp = DDP(Model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(args.steps):
        loss = ddp(torch.randn(8, 16, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
    print(f"rank {rank}: done", flush=True)
    del ddp, opt
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
