"""Data parallel by hand, each rank averaging its gradients itself, in one of two shapes scout's
own record meets differently:
- `--collectives funcol`: torch's functional all_reduce
  (`torch.distributed._functional_collectives`, what tensor parallelism and compiled graphs use),
  which goes through the dispatcher, not the Python collectives scout wraps; torch's Flight
  Recorder records it;
- `--collectives async`: `dist.all_reduce(..., async_op=True)` for every gradient, all waited for
  at the end of the step, as NCCL's stream semantics make every collective (the CPU runs ahead)."""

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def average(grads: list[torch.Tensor], how: str, world: int) -> list[torch.Tensor]:
    if how == "funcol":
        return [funcol.all_reduce(g, "sum", dist.group.WORLD) / world for g in grads]
    works = [dist.all_reduce(g, async_op=True) for g in grads]
    for w in works:
        w.wait()
    return [g / world for g in grads]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--collectives", choices=("funcol", "async"), required=True)
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
        params = list(model.parameters())
        for p, avg in zip(params, average([p.grad for p in params], args.collectives, world)):
            p.grad = avg
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
