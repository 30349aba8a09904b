"""Numerical fault injection inside the training process: change a tensor in place (weights,
optimizer state) or what a layer computes on one rank (activations, gradients), as broken
hardware would. Imports torch; runs only in the job's Python."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scout_slurm.inject.spec import FaultSpec


def corrupt_(t: Any, fault: FaultSpec, *, seed: int = 0) -> str:
    """Corrupt `t` in place: one element (bitflip, scale, sign, nan, inf) or every element
    (noise, from a generator of its own so the job's random stream is not disturbed)."""
    import torch

    if hasattr(t, "to_local"):  # a DTensor (FSDP2/HSDP): corrupt this rank's shard
        t = t.to_local()
    with torch.no_grad():
        flat = t.data.view(-1)
        if flat.numel() == 0:
            return "empty tensor: nothing corrupted"
        i = fault.element % flat.numel()
        before = float(flat[i])
        if fault.kind == "bitflip":
            size = flat.element_size()
            ints = flat.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
            bit = fault.bit % (size * 8)
            mask = (
                -(1 << bit) if bit == size * 8 - 1 else (1 << bit)
            )  # the sign bit, in two's complement
            ints[i] = torch.bitwise_xor(ints[i], torch.tensor(mask, dtype=ints.dtype))
        elif fault.kind == "scale":
            flat[i] *= fault.factor
        elif fault.kind == "sign":
            flat[i] = -flat[i]
        elif fault.kind == "nan":
            flat[i] = float("nan")
        elif fault.kind == "inf":
            flat[i] = float("inf")
        elif fault.kind == "noise":
            gen = torch.Generator().manual_seed(seed)
            flat.add_(torch.randn(flat.shape, generator=gen, dtype=flat.dtype) * fault.sigma)
            return f"gaussian noise sigma={fault.sigma} on {flat.numel()} elements"
        return f"[{i}]: {before!r} -> {float(flat[i])!r}"


def local_gradient_fault_hook(
    fault: FaultSpec,
    rank: int,
    restart: int,
    current_step: Callable[[], int],
    on_fire: Callable[[str], None],
) -> Callable:
    """A tensor hook on a weight: this rank's own gradient of it, corrupted before it is
    accumulated and all-reduced (every replica then holds the same wrong update)."""

    def hook(g):
        step = current_step()
        if not fault.applies(rank, step, restart):
            return None
        g = g.clone()
        what = corrupt_(g, fault, seed=1_000_003 * rank + step)
        on_fire(f"local weight gradient {what}")
        return g

    return hook


def compute_fault_hook(
    fault: FaultSpec,
    rank: int,
    restart: int,
    current_step: Callable[[], int],
    on_fire: Callable[[str], None],
    replaying: Callable[[], bool] = lambda: False,
) -> Callable:
    """A forward hook for the faulty layer on the faulty rank. `activations`: its output is
    corrupted; `gradients`: the gradient entering its backward is. It fires in training and in
    scout's replay of the layer alike (the hardware is broken, whoever asks)."""
    import torch

    class _CorruptGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            what = corrupt_(g, fault, seed=1_000_003 * rank + current_step())
            on_fire(f"gradient into the layer's backward {what}")
            return g

    class _Replace(torch.autograd.Function):
        """Forward: the corrupted values, bit for bit; backward: the gradient passes unchanged."""

        @staticmethod
        def forward(ctx, x, corrupted):
            return corrupted

        @staticmethod
        def backward(ctx, g):
            return g, None

    def hook(module, args, output):
        # a layer returning a tuple (Megatron's parallel layers: `(output, bias)`): its first tensor
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            first = hook(module, args, output[0])
            return None if first is None else (first, *output[1:])
        step = current_step()
        if not isinstance(output, torch.Tensor) or not fault.applies(rank, step, restart):
            return None
        if (
            fault.transient and replaying()
        ):  # a one-off upset: asked again, the hardware answers right
            return None
        if fault.target == "activations":
            out = output.detach().clone()
            what = corrupt_(out, fault, seed=1_000_003 * rank + step)
            on_fire(f"activation {what}")
            return _Replace.apply(output, out)
        return _CorruptGradient.apply(output)

    return hook
