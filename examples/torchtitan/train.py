"""TorchTitan's debug Llama-3 model trained with FSDP2 over its own ParallelDims mesh, with random
tokens (no tokenizer or data set to fetch): a few steps on GPUs. On CPU only the model build, the
mesh and the FSDP2 wrap run (`--cpu-build-only`): TorchTitan's attention needs a flex BlockMask,
flex attention has no CPU backward, and its trainer calls CUDA's set_device."""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--cpu-build-only", action="store_true")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu_build_only
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.models.llama3 import model_registry

    parallel_dims.device_type = "cuda" if cuda else "cpu"
    dims = parallel_dims.ParallelDims(
        dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, world_size=world
    )
    dims.build_mesh()
    mesh = dims.get_mesh("dp_shard")
    torch.manual_seed(0)
    model = model_registry("debugmodel").model.build()
    if cuda:
        model = model.cuda()
    for block in model.layers.values():
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    print(
        f"rank {rank}: TorchTitan debug model built and wrapped (FSDP2 over {mesh.mesh_dim_names})",
        flush=True,
    )
    if not cuda:
        dist.destroy_process_group()
        return 0
    opt = torch.optim.AdamW(model.parameters(), lr=8e-4)
    gen = torch.Generator(device="cuda").manual_seed(1000 + rank)
    positions = torch.arange(args.seq, device="cuda").expand(args.batch, args.seq)
    masks = model.get_attention_masks(positions)
    t0 = time.monotonic()
    for step in range(1, args.steps + 1):
        tokens = torch.randint(0, 2048, (args.batch, args.seq + 1), device="cuda", generator=gen)
        logits = model(tokens[:, :-1], positions, masks)
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), tokens[:, 1:].flatten()
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 5 == 0:
            print(
                f"step {step}: loss {loss.item():.3f} ({time.monotonic() - t0:.1f} s)", flush=True
            )
    print(f"rank {rank}: done", flush=True)
    del model, opt
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
