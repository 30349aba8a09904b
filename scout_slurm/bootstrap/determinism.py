"""Whether a layer's in-situ replay can be exact: the policy that keeps GPU non-determinism from
being taken for corruption. `inexact_reason` is pure (a layer's class names, its device type and
the job's settings in; None or a short reason out); `read_settings` is the one function that
reaches outside, reading torch's global switches defensively.

Why each case (public sources: the torch docs' "Reproducibility" note, `docs/notes/randomness`,
and the list in `torch.use_deterministic_algorithms`'s docstring):
- The replay compares signatures bit for bit across ranks and with the source's training-time
  values. It runs under `use_deterministic_algorithms(True, warn_only=True)`, so ops that torch
  makes deterministic in that mode (cuDNN convolutions, `index_add`, `scatter_add_` on CUDA)
  recompute alike on every rank; but the *training-time* values they are set against were
  computed under the job's own setting, and ops with no deterministic CUDA kernel still run
  their non-deterministic one (warn_only).
- TF32 by itself is deterministic: the same kernel on the same inputs gives the same bits. What
  is not is the *choice* of kernel: `cudnn.benchmark` and TunableOp time candidates in each
  process and may pick different ones on different ranks (or for the replay than in training),
  and cuBLAS/cuDNN heuristics depend on the GPU's multiprocessor count, so ranks on GPUs of
  different sizes (other models, MIG slices) split work differently.
- cuBLAS on one stream is not a reason: NVIDIA's cuBLAS docs ("Results reproducibility")
  promise the same bits at every run on GPUs of one architecture and multiprocessor count, with
  multiple streams needing a fixed workspace (CUBLAS_WORKSPACE_CONFIG); the replay runs on one.
  The TF32 switches and the float32 matmul precision are read and kept in the settings for the
  same reason they are not a cause: they choose the precision, not a per-process kernel.
- On the CPU, a rank with the same thread count computes the same bits (measured,
  TORCH-FACTS.md): nothing is excluded there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DeterminismSettings:
    """The job's switches that decide whether a recomputation can repeat training's bits. None:
    the torch at hand has no such switch (or reading it failed)."""

    deterministic_algorithms: bool | None = None  # torch.are_deterministic_algorithms_enabled()
    cudnn_benchmark: bool | None = None  # torch.backends.cudnn.benchmark
    cudnn_deterministic: bool | None = None  # torch.backends.cudnn.deterministic
    matmul_allow_tf32: bool | None = None  # torch.backends.cuda.matmul.allow_tf32
    cudnn_allow_tf32: bool | None = None  # torch.backends.cudnn.allow_tf32
    tunableop: bool | None = None  # torch.cuda.tunable.is_enabled()
    float32_matmul_precision: str | None = None  # torch.get_float32_matmul_precision()
    # every rank's GPU multiprocessor count, as exchanged at start (() : not known / CPU)
    sm_counts: tuple[int, ...] = ()


# Layers whose CUDA recomputation cannot repeat bit for bit, by class name (any class in the
# layer's MRO), with why. Sources: the `torch.use_deterministic_algorithms` docstring (the ops
# that raise, or only warn with warn_only, having no deterministic CUDA kernel) and the
# `scaled_dot_product_attention` docs (fused attention backward is non-deterministic).
ALWAYS_INEXACT_ON_CUDA: dict[str, str] = {
    "EmbeddingBag": "EmbeddingBag's CUDA backward accumulates with atomic adds (no deterministic "
    "kernel in every mode)",
    "MultiheadAttention": "attention's fused CUDA backward (flash / memory-efficient "
    "scaled_dot_product_attention) accumulates with atomic adds",
    "AdaptiveAvgPool2d": "AdaptiveAvgPool2d's CUDA backward has no deterministic kernel",
    "AdaptiveAvgPool3d": "AdaptiveAvgPool3d's CUDA backward has no deterministic kernel",
    "AvgPool3d": "AvgPool3d's CUDA backward has no deterministic kernel",
    "MaxPool3d": "MaxPool3d's CUDA backward has no deterministic kernel",
    "CTCLoss": "CTCLoss's CUDA backward has no deterministic kernel",
    "NLLLoss": "NLLLoss on CUDA has no deterministic kernel",
}

# Layers that are exact on CUDA only when the job itself ran them deterministically (torch makes
# them deterministic under use_deterministic_algorithms; the replay does, training may not).
DETERMINISTIC_ONLY_IF_ASKED: dict[str, str] = {
    "Embedding": "Embedding's CUDA backward",  # index_put/index_add-style accumulation
    "ReplicationPad1d": "ReplicationPad1d's CUDA backward",
    "ReplicationPad2d": "ReplicationPad2d's CUDA backward",
    "ReplicationPad3d": "ReplicationPad3d's CUDA backward",
}

CONVS = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d")
MATMULS = ("Linear", "Bilinear", *CONVS)


def class_names(layer: Any) -> tuple[str, ...]:
    """The names of the layer's class and its bases (torch not imported: plain inputs test it)."""
    return tuple(c.__name__ for c in type(layer).__mro__)


def inexact_reason(layer: Any, device_type: str, settings: DeterminismSettings) -> str | None:
    """Why recomputing `layer` on `device_type` cannot repeat training's bits on every rank, or
    None where it can (pure)."""
    if device_type != "cuda":
        return None  # CPU: same thread count, same bits (TORCH-FACTS.md); other devices: no list
    names = class_names(layer)
    for n in names:
        if n in ALWAYS_INEXACT_ON_CUDA:
            return ALWAYS_INEXACT_ON_CUDA[n]
    for n in names:
        if n in DETERMINISTIC_ONLY_IF_ASKED and not settings.deterministic_algorithms:
            return (
                f"{DETERMINISTIC_ONLY_IF_ASKED[n]} is non-deterministic unless the job enables "
                "torch.use_deterministic_algorithms"
            )
    if any(n in CONVS for n in names):
        if settings.cudnn_benchmark:
            # the benchmark picks a kernel per process: ranks, and the replay, may differ
            return "cudnn.benchmark is on: each process times and picks its own convolution kernel"
        if not (settings.deterministic_algorithms or settings.cudnn_deterministic):
            return (
                "a cuDNN convolution in training may use a non-deterministic algorithm "
                "(neither torch.use_deterministic_algorithms nor cudnn.deterministic is on)"
            )
    if any(n in MATMULS for n in names):
        if settings.tunableop:
            return "TunableOp is on: each process tunes and picks its own GEMM kernel"
        if len(set(settings.sm_counts)) > 1:
            # TF32 or not, the heuristics choose split and tile by the multiprocessor count
            counts = sorted(set(settings.sm_counts))
            return (
                f"the ranks' GPUs differ in multiprocessor count ({counts}): cuBLAS and cuDNN "
                "choose kernels by it"
            )
    return None


def read_settings(sm_counts: tuple[int, ...] = ()) -> DeterminismSettings:
    """The job's switches as torch has them now; each read on its own, a missing attribute (an
    older or newer torch) leaving None."""
    import torch

    def attempt(read: Any) -> Any:
        try:
            return read()
        except Exception:
            return None

    def tunable() -> bool | None:
        tun = getattr(getattr(torch, "cuda", None), "tunable", None)
        return bool(tun.is_enabled()) if tun is not None else None

    return DeterminismSettings(
        deterministic_algorithms=attempt(torch.are_deterministic_algorithms_enabled),
        cudnn_benchmark=attempt(lambda: bool(torch.backends.cudnn.benchmark)),
        cudnn_deterministic=attempt(lambda: bool(torch.backends.cudnn.deterministic)),
        matmul_allow_tf32=attempt(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        cudnn_allow_tf32=attempt(lambda: bool(torch.backends.cudnn.allow_tf32)),
        tunableop=attempt(tunable),
        float32_matmul_precision=attempt(torch.get_float32_matmul_precision),
        sm_counts=tuple(sm_counts),
    )


def multiprocessor_count(device: Any) -> int:
    """The GPU's multiprocessor count for `device` (0: not a CUDA device, or not readable)."""
    if getattr(device, "type", "") != "cuda":
        return 0
    try:
        import torch

        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    except Exception:
        return 0
