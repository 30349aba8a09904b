"""The models a training script built, as scout sees them: which wrapper (DDP, FSDP2, DeepSpeed,
Megatron-Core), the user's model inside it, which ranks are replicas of each other (process
groups, DeviceMesh placements), whether it runs compiled, and the tracker that sees the models at
their first forward. Shared by the witnesses; imports torch lazily, runs only in the job's
Python."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any

from scout_slurm.bootstrap.replicas import replica_groups


def say(msg: str) -> None:
    sys.stderr.write(f"scout: {msg}\n")
    sys.stderr.flush()


# ---- the models the script built --------------------------------------------------------------


def is_ddp(m: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(m, DistributedDataParallel)


def is_fsdp(m: Any) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None) if fsdp else None
    return cls is not None and isinstance(m, cls)


def is_deepspeed(m: Any) -> bool:
    """A DeepSpeed engine (`deepspeed.initialize`'s model): it holds the user's model as
    `.module`.
    """
    engine = sys.modules.get("deepspeed.runtime.engine")
    cls = getattr(engine, "DeepSpeedEngine", None) if engine else None
    return cls is not None and isinstance(m, cls)


def is_megatron_ddp(m: Any) -> bool:
    """Megatron-Core's own DistributedDataParallel (needs CUDA; its `.module` is the model)."""
    mod = sys.modules.get("megatron.core.distributed.distributed_data_parallel")
    cls = getattr(mod, "DistributedDataParallel", None) if mod else None
    return cls is not None and isinstance(m, cls)


def is_root(m: Any) -> bool:
    return is_ddp(m) or is_fsdp(m) or is_deepspeed(m) or is_megatron_ddp(m)


def is_compiled(m: Any) -> bool:
    """A module the job compiled: wrapped by torch.compile, or compiled in place
    (`Module.compile()`).
    """
    return (
        type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None
    )


def inner(root: Any) -> Any:
    """The user's model inside a root: DDP, DeepSpeed's engine and Megatron's DDP wrap it as
    `.module`; FSDP2 changes the module's class in place."""
    return root.module if (is_ddp(root) or is_deepspeed(root) or is_megatron_ddp(root)) else root


def zero_stage(root: Any) -> int:
    """The DeepSpeed engine's ZeRO stage (0: plain data parallel)."""
    try:
        return int(root.zero_optimization_stage())
    except Exception:
        return 0


def megatron_coordinates() -> str:
    """Megatron-Core's parallel_state sizes and this rank's coordinates, in words ("" when it is not
    initialised)."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is None or not ps.model_parallel_is_initialized():
        return ""
    return (
        f"Megatron-Core parallel_state tp={ps.get_tensor_model_parallel_world_size()} "
        f"pp={ps.get_pipeline_model_parallel_world_size()} "
        f"cp={ps.get_context_parallel_world_size()} "
        f"dp={ps.get_data_parallel_world_size()} (this rank: tp "
        f"{ps.get_tensor_model_parallel_rank()}, "
        f"pp {ps.get_pipeline_model_parallel_rank()}, cp {ps.get_context_parallel_rank()})"
    )


def framework_seen(roots: list[Any]) -> str:
    """The training framework the script uses, in words, from what it built and imported."""
    names = []
    for root in roots:
        if is_deepspeed(root):
            names.append(f"DeepSpeed engine, ZeRO-{zero_stage(root)}")
        elif is_megatron_ddp(root):
            names.append("Megatron-Core DistributedDataParallel")
        elif is_fsdp(root):
            names.append("FSDP2")
        elif is_ddp(root):
            names.append("torch DDP")
    for module, what in (("megatron.core", "Megatron-Core"), ("torchtitan", "TorchTitan")):
        if module in sys.modules and not any(what in n for n in names):
            names.append(f"{what} imported")
    coords = megatron_coordinates()
    return (
        ", ".join(names + ([coords] if coords else [])) or "no DDP, FSDP2 or DeepSpeed model seen"
    )


def megatron_tensor_parallel(m: Any) -> int:
    """The tensor-parallel size of a Megatron-Core parallel layer (1: not one, or not split)."""
    layers = sys.modules.get("megatron.core.tensor_parallel.layers")
    kinds = tuple(
        getattr(layers, n)
        for n in ("ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding")
        if layers is not None and hasattr(layers, n)
    )
    if not kinds or not isinstance(m, kinds):
        return 1
    from megatron.core import parallel_state

    return (
        parallel_state.get_tensor_model_parallel_world_size()
        if parallel_state.model_parallel_is_initialized()
        else 1
    )


def optimizer_not_voted(roots: list[Any]) -> str:
    """Why the optimizer state is not voted ("": it is): ZeRO-1/2 partition it over the ranks, so
    with pure data parallelism no two ranks hold the same partition."""
    for root in roots:
        if is_deepspeed(root) and zero_stage(root) >= 1:
            return (
                f"optimizer state not voted: DeepSpeed ZeRO-{zero_stage(root)} partitions it "
                "over the "
                "data-parallel ranks (no two ranks hold the same partition)"
            )
    return ""


def is_dtensor(t: Any) -> bool:
    return hasattr(t, "to_local") and hasattr(t, "placements")


def parameterised_leaves(roots: list[Any]) -> list[tuple[str, Any]]:
    """(name, module) of every leaf module holding parameters, in model order; names are the
    model's own (prefixed m0., m1. when the script has several models)."""
    out = []
    for ri, root in enumerate(roots):
        for name, m in inner(root).named_modules():
            if (
                next(m.children(), None) is None
                and next(m.parameters(recurse=False), None) is not None
            ):
                out.append((f"m{ri}.{name}" if len(roots) > 1 else name, m))
    return out


def replica_layout(roots: list[Any], world: int) -> tuple[list[tuple[int, ...]], str]:
    """Groups of ranks that must hold identical state, from what the script built, and a sentence
    saying how they were found."""
    for root in roots:
        if is_deepspeed(root):
            return _deepspeed_layout(root, world)
    for root in roots:
        for p in inner(root).parameters():
            if is_dtensor(p):
                mesh = p.device_mesh.mesh.tolist()
                rep = [d for d, pl in enumerate(p.placements) if pl.is_replicate()]
                groups = replica_groups(mesh, rep)
                if not rep:
                    names = getattr(p.device_mesh, "mesh_dim_names", None)
                    mesh = f"{mesh} (dimensions {tuple(names)})" if names else mesh
                    return groups, (
                        f"FSDP2 over mesh {mesh} with no replicated dimension: no rank holds "
                        "a copy of "
                        "another's shards, so there are no state votes; in-situ replay still "
                        "compares "
                        "compute across all ranks on the layer all-gathered over scout's side group"
                    )
                names = getattr(p.device_mesh, "mesh_dim_names", None)
                named = f" (dimensions {tuple(names)})" if names else ""
                return groups, (
                    f"HSDP mesh {mesh}{named}, placements "
                    f"{tuple(str(x) for x in p.placements)}: ranks "
                    f"with the same shard coordinate hold the same shards: replica groups {groups}"
                )
    for root in roots:
        if is_ddp(root):
            import torch.distributed as dist

            ranks = tuple(sorted(dist.get_process_group_ranks(root.process_group)))
            return [ranks], f"DDP over ranks {list(ranks)}: every rank holds the same state"
    return [
        tuple(range(world))
    ], "no DDP, FSDP2 or DeepSpeed model seen: all ranks taken as replicas"


def _deepspeed_layout(root: Any, world: int) -> tuple[list[tuple[int, ...]], str]:
    """ZeRO 0-2 keep the full parameters on every data-parallel rank; ZeRO-3 partitions them (as
    pure FSDP: no rank holds a copy of another's partition)."""
    import torch.distributed as dist

    stage = zero_stage(root)
    group = getattr(root, "data_parallel_group", None) or getattr(root, "dp_process_group", None)
    ranks = (
        tuple(sorted(dist.get_process_group_ranks(group)))
        if group is not None
        else tuple(range(world))
    )
    if stage >= 3:
        return [(r,) for r in range(world)], (
            f"DeepSpeed ZeRO-3 over ranks {list(ranks)}: parameters and optimizer state are "
            "partitioned, no rank "
            "holds a copy of another's: no state votes (as pure FSDP)"
        )
    return [ranks], (
        f"DeepSpeed ZeRO-{stage} over data-parallel ranks {list(ranks)}: every rank holds the same "
        "parameters (weights voted)"
    )


class RootTracker:
    """A global forward pre-hook that sees the models the script runs (DDP and FSDP2 roots) at
    their first forward, before any layer inside them runs; removed after the first optimizer step
    so it costs nothing afterwards."""

    def __init__(self, on_root: Callable[[Any], None]) -> None:
        import warnings

        import torch
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.roots: list[Any] = []
        self.compiled: list[
            Any
        ] = []  # modules the job runs through torch.compile (an OptimizedModule)
        self.on_root = on_root
        self._is_compiling = torch.compiler.is_compiling
        # torch warns, at each call of a compiled module, that a global hook fires an extra time for
        # it:
        # this hook ignores the compiled wrapper, and the warning would be scout's in the job's
        # output
        self._quiet = (
            "ignore",
            re.compile(r"Using `torch.compile\(module\)` when there are global hooks"),
            UserWarning,
            None,
            0,
        )
        warnings.filters.insert(0, self._quiet)
        warnings._filters_mutated()
        self.handle = register_module_forward_pre_hook(self._seen)

    def _seen(self, module: Any, args: Any) -> None:
        if self._is_compiling():  # traced inside a compiled model: nothing of scout's in the graph
            return
        if type(module).__name__ == "OptimizedModule":
            # torch.compile(model): the model's own call is traced, its hooks with it; seen here
            # instead
            module = getattr(module, "_orig_mod", None)
            if module is None or any(module is m for m in self.compiled):
                return
            self.compiled.append(module)
        if not is_root(module) or any(module is r for r in self.roots):
            return
        # nested FSDP units (blocks) and the model inside a DDP are not roots
        if any(module is sub for r in self.roots for sub in inner(r).modules()):
            return
        if any(r is getattr(module, "module", None) for r in self.roots):
            return
        self.roots.append(module)
        try:
            self.on_root(module)
        except Exception as exc:
            say(f"cannot attach to model {type(module).__name__}: {exc!r}")

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None
            import warnings

            if self._quiet in warnings.filters:
                warnings.filters.remove(self._quiet)
                warnings._filters_mutated()
