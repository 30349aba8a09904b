"""A small DDP training job for the demo and the tests: deterministic on CPU with gloo, resumable.

Knows nothing of scout. Reads RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (set by scout-task or
torchrun), trains --steps steps, all-reduces the loss for logging every step, saves a checkpoint
every --ckpt-every steps into --ckpt-dir (rank 0), and resumes from the newest one it finds
(or the one named by SCOUT_RESUME_CHECKPOINT).
"""

import argparse
import datetime
import os
import random
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-sleep", type=float, default=0.02, help="stands in for compute per step")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=600.0, help="gloo timeout, seconds")
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--out", default="", help="rank 0 writes the final parameter checksum here")
    ap.add_argument(
        "--sched", action="store_true", help="a StepLR schedule, saved and restored with the state"
    )
    ap.add_argument(
        "--atomic-save",
        choices=("none", "replace", "move", "hidden"),
        default="none",
        help="save to NAME.tmp, then os.replace (replace) or shutil.move (move) it to NAME; "
        "hidden: "
        "to .NAME.tmp, then os.replace",
    )
    ap.add_argument(
        "--compile",
        default="",
        metavar="BACKEND",
        help="wrap the DDP model in torch.compile with this backend (aot_eager, eager, inductor)",
    )
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)
    np = _numpy()
    if np is not None:
        np.random.seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    ddp = DDP(model)
    # the order PyTorch documents: DDP first, then compile the wrapped model
    run = torch.compile(ddp, backend=args.compile) if args.compile else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=args.momentum)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=7, gamma=0.9) if args.sched else None
    start = 0
    resume = os.environ.get("SCOUT_RESUME_CHECKPOINT", "")
    if not resume and args.ckpt_dir and os.path.isdir(args.ckpt_dir):
        names = sorted(
            (n for n in os.listdir(args.ckpt_dir) if n.startswith("step-") and n.endswith(".pt")),
            key=lambda n: int(n[5:-3]),
        )
        resume = os.path.join(args.ckpt_dir, names[-1]) if names else ""
    if resume:
        state = torch.load(resume, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        if sched is not None:
            sched.load_state_dict(state["sched"])
        if "rng" in state:  # the RNG streams too: a resume that continues them is bit-exact
            torch.set_rng_state(state["rng"]["torch"])
            random.setstate(state["rng"]["python"])
            if np is not None and state["rng"].get("numpy") is not None:
                n = state["rng"]["numpy"]
                np.random.set_state(
                    (n["name"], n["keys"].numpy(), n["pos"], n["has_gauss"], n["gauss"])
                )
        start = int(state["step"])
        # DDP lays its gradient buckets out anew after its first iteration; an uninterrupted run
        # did that at step 1. One zero-input iteration (no optimizer step, gradients dropped) puts
        # the resumed run on the same layout, so it continues bit for bit.
        ddp(torch.zeros(16, 32)).sum().backward()
        opt.zero_grad(set_to_none=True)
        print(f"rank {rank}: resumed from {resume} at step {start}", flush=True)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _ in range(start):  # keep the data stream aligned with an uninterrupted run
        torch.randn(16, 32, generator=gen)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 32, generator=gen)
        loss = run(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        time.sleep(args.step_sleep)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0 and args.ckpt_dir and step % args.ckpt_every == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "rng": {
                    "torch": torch.get_rng_state(),
                    "python": random.getstate(),
                    "numpy": _numpy_state(np),
                },
            }
            if sched is not None:
                state["sched"] = sched.state_dict()
            final = os.path.join(args.ckpt_dir, f"step-{step}.pt")
            if args.atomic_save == "none":
                torch.save(state, final)
            else:  # the usual atomic save: a reader never sees a partly written NAME
                tmp = (
                    os.path.join(args.ckpt_dir, f".step-{step}.pt.tmp")
                    if args.atomic_save == "hidden"
                    else final + ".tmp"
                )
                torch.save(state, tmp)
                if args.atomic_save == "move":
                    import shutil

                    shutil.move(tmp, final)
                else:
                    os.replace(tmp, final)
        if rank == 0 and step % 20 == 0:
            print(f"step {step} loss {logged.item() / world:.6f}", flush=True)
    if rank == 0 and args.out:
        import hashlib

        digest = hashlib.sha256()  # every bit of the parameters and the optimizer state
        for p in model.parameters():
            digest.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
        for state in opt.state.values():
            for v in state.values():
                if torch.is_tensor(v):
                    digest.update(v.detach().contiguous().view(torch.uint8).numpy().tobytes())
        for g in opt.param_groups:  # the learning rate a schedule left
            digest.update(repr(g["lr"]).encode())
        if sched is not None:
            digest.update(repr(sorted(sched.state_dict().items())).encode())
        digest.update(torch.get_rng_state().numpy().tobytes())  # the RNG streams where they ended
        digest.update(repr(random.getstate()).encode())
        if np is not None:
            st = np.random.get_state()
            digest.update(st[1].tobytes() + repr(st[2:]).encode())
        with open(args.out, "w") as fh:
            fh.write(
                " ".join(f"{p.double().sum().item():.12e}" for p in model.parameters())
                + f" sha256={digest.hexdigest()}\n"
            )
    del ddp, opt
    import gc

    gc.collect()
    dist.destroy_process_group()
    print(f"rank {rank}: done", flush=True)
    return 0


def _numpy_state(np):
    """NumPy's global RNG state in types torch.load(weights_only=True) accepts."""
    if np is None:
        return None
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "name": name,
        "keys": torch.from_numpy(keys.copy()),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "gauss": float(gauss),
    }


def _numpy():
    try:
        import numpy

        return numpy
    except ImportError:
        return None


if __name__ == "__main__":
    sys.exit(main())
