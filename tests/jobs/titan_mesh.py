"""TorchTitan on CPU, the parts that run: its debug Llama-3 model is built, its ParallelDims
builds the DeviceMesh (dimensions by name: dp_replicate, dp_shard), FSDP2 (`fully_shard`) wraps
each block and the model over the data-parallel mesh, and scout's replica
discovery reads the replica groups from the parameters' mesh. Its forward and training need a GPU
(its attention needs a flex BlockMask and flex attention has no CPU backward; its trainer calls
CUDA's set_device): not run anywhere yet (a fresh GPU machine lacks torchtitan)."""

from __future__ import annotations

import datetime
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def main() -> int:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.distributed.parallel_dims import ParallelDims

    parallel_dims.device_type = (
        "cpu"  # torchtitan takes CUDA whenever its tools think so; no GPU here
    )
    from torchtitan.models.llama3 import model_registry

    replicate = int(os.environ.get("TITAN_DP_REPLICATE", "2"))
    dims = ParallelDims(
        dp_replicate=replicate,
        dp_shard=world // replicate,
        cp=1,
        tp=1,
        pp=1,
        ep=1,
        world_size=world,
    )
    dims.build_mesh()
    mesh = dims.get_mesh(["dp_replicate", "dp_shard"] if replicate > 1 else "dp_shard")
    spec = model_registry("debugmodel")  # flex attention: forward only on CPU
    model = spec.model.build()
    for block in model.layers.values() if hasattr(model.layers, "values") else model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    from scout_slurm.bootstrap.frameworks import is_fsdp, replica_layout

    groups, how = replica_layout([model], world)
    print(
        "TITAN "
        + json.dumps(
            {
                "rank": rank,
                "fsdp": is_fsdp(model),
                "mesh": list(mesh.mesh_dim_names),
                "params": sum(p.numel() for p in model.parameters()),
                "groups": [list(g) for g in groups],
                "how": how,
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
