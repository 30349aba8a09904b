"""Data parallel by hand over torch's functional collectives (what tensor parallelism and
compiled graphs use): each rank averages its gradients with
`torch.distributed._functional_collectives.all_reduce`, which goes through the dispatcher, not
through the Python collectives scout wraps; torch's Flight Recorder records it."""

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(16, 8, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.grad = funcol.all_reduce(p.grad, "sum", dist.group.WORLD) / world
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
