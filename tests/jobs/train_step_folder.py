"""A 2-rank gloo DDP job that saves as the Hugging Face Trainer does: at one step, rank 0 writes a
folder named for the step (`checkpoint-S/`) holding several files (model, optimizer, scheduler,
RNG state, training arguments), each by torch.save; a resumed run loads every part through a file
object it opened itself (as Lightning and fsspec hand torch.load an open file)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--save-at", type=int, default=4)
    ap.add_argument("--resume", default="")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    start = 0
    if args.resume:
        parts = {}
        for name in ("model.pt", "optimizer.pt", "scheduler.pt", f"rng_state_{rank}.pth"):
            path = os.path.join(args.resume, name)
            if os.path.exists(path):
                with open(path, "rb") as f:
                    parts[name] = torch.load(f, weights_only=False)
        model.module.load_state_dict(parts["model.pt"])
        opt.load_state_dict(parts["optimizer.pt"])
        sched.load_state_dict(parts["scheduler.pt"])
        if f"rng_state_{rank}.pth" in parts:
            torch.set_rng_state(parts[f"rng_state_{rank}.pth"])
        start = args.save_at
    g = torch.Generator().manual_seed(1)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 8, generator=g)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step == args.save_at and rank == 0 and not args.resume:
            folder = os.path.join(args.ckpt, f"checkpoint-{step}")
            os.makedirs(folder, exist_ok=True)
            torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
            torch.save(opt.state_dict(), os.path.join(folder, "optimizer.pt"))
            torch.save(sched.state_dict(), os.path.join(folder, "scheduler.pt"))
            torch.save(torch.get_rng_state(), os.path.join(folder, "rng_state_0.pth"))
            torch.save({"lr": 1e-2}, os.path.join(folder, "training_args.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
