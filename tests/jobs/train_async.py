"""Data parallel by hand with asynchronous collectives, as NCCL's stream semantics make every
collective: each gradient's all_reduce is started with `async_op=True` and all are waited for at
the end of the step, so the CPU runs ahead of the communication."""

import argparse

import torch
import torch.distributed as dist


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
        works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
        for w in works:
            w.wait()
        for p in model.parameters():
            p.grad /= world
        opt.step()
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
