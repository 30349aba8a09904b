"""The determinism policy of the in-situ replay (bootstrap.determinism), on plain inputs: which
layers a recomputation can repeat bit for bit, by device type and the job's settings. Modules are
built on the CPU; the device type is a string, so no GPU is needed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scout_slurm.bootstrap.determinism import (  # noqa: E402
    DeterminismSettings,
    inexact_reason,
    read_settings,
)

nn = torch.nn
PLAIN = DeterminismSettings(deterministic_algorithms=False, cudnn_benchmark=False)
STRICT = DeterminismSettings(deterministic_algorithms=True, cudnn_deterministic=True)


class MyAttention(nn.MultiheadAttention):  # a subclass is judged by its bases
    pass


ALL_LAYERS = [
    nn.Linear(4, 4),
    nn.Conv2d(1, 1, 3),
    nn.EmbeddingBag(10, 4),
    nn.Embedding(10, 4),
    nn.MultiheadAttention(4, 2),
    nn.LayerNorm(4),
]


@pytest.mark.parametrize("layer", ALL_LAYERS, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("settings", [PLAIN, STRICT, DeterminismSettings(cudnn_benchmark=True)])
def test_on_the_cpu_every_layer_can_be_exact(layer, settings):
    assert inexact_reason(layer, "cpu", settings) is None


@pytest.mark.parametrize("settings", [PLAIN, STRICT])
def test_layers_without_a_deterministic_cuda_kernel_are_never_exact(settings):
    assert "atomic adds" in inexact_reason(nn.EmbeddingBag(10, 4), "cuda", settings)
    assert "attention" in inexact_reason(nn.MultiheadAttention(4, 2), "cuda", settings)
    assert "attention" in inexact_reason(MyAttention(4, 2), "cuda", settings)


def test_embedding_is_exact_on_cuda_only_under_deterministic_algorithms():
    assert "use_deterministic_algorithms" in inexact_reason(nn.Embedding(10, 4), "cuda", PLAIN)
    assert inexact_reason(nn.Embedding(10, 4), "cuda", STRICT) is None


def test_convolutions_on_cuda():
    conv = nn.Conv2d(1, 1, 3)
    # benchmark picks a kernel per process, deterministic algorithms or not
    both = DeterminismSettings(deterministic_algorithms=True, cudnn_benchmark=True)
    for s in (DeterminismSettings(cudnn_benchmark=True), both):
        assert "cudnn.benchmark" in inexact_reason(conv, "cuda", s)
    assert "non-deterministic algorithm" in inexact_reason(conv, "cuda", PLAIN)
    assert inexact_reason(conv, "cuda", STRICT) is None
    assert inexact_reason(conv, "cuda", DeterminismSettings(cudnn_deterministic=True)) is None
    assert "cudnn.benchmark" in inexact_reason(
        nn.ConvTranspose1d(1, 1, 3), "cuda", DeterminismSettings(cudnn_benchmark=True)
    )


def test_linear_on_cuda_tf32_is_exact_but_per_process_kernel_choice_is_not():
    lin = nn.Linear(4, 4)
    tf32 = DeterminismSettings(matmul_allow_tf32=True, cudnn_allow_tf32=True)
    assert inexact_reason(lin, "cuda", tf32) is None  # the same kernel gives the same bits
    assert inexact_reason(lin, "cuda", DeterminismSettings(float32_matmul_precision="high")) is None
    assert "TunableOp" in inexact_reason(lin, "cuda", DeterminismSettings(tunableop=True))
    assert inexact_reason(lin, "cuda", DeterminismSettings(sm_counts=(132, 132))) is None
    assert "multiprocessor count ([114, 132])" in inexact_reason(
        lin, "cuda", DeterminismSettings(sm_counts=(132, 114, 132))
    )
    assert inexact_reason(nn.LayerNorm(4), "cuda", DeterminismSettings(tunableop=True)) is None


def test_unknown_settings_count_as_off():
    # a torch without a switch reads None: no reason is made up from it
    assert inexact_reason(nn.Linear(4, 4), "cuda", DeterminismSettings()) is None
    assert "non-deterministic algorithm" in inexact_reason(
        nn.Conv1d(1, 1, 3), "cuda", DeterminismSettings()
    )


def test_read_settings_reads_this_torch_and_tolerates_missing_switches(monkeypatch):
    s = read_settings((132, 132))
    assert s.deterministic_algorithms is False and s.sm_counts == (132, 132)
    assert s.float32_matmul_precision in ("highest", "high", "medium")
    assert s.tunableop in (None, False)
    monkeypatch.setattr(torch.backends, "cudnn", object())  # no cudnn switches at all
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: 1 / 0)
    s = read_settings()
    assert s.float32_matmul_precision is None and s.sm_counts == ()
    assert s.cudnn_benchmark is None and s.cudnn_deterministic is None
