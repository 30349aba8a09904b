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


def test_the_replay_leaves_out_on_every_rank_what_any_rank_cannot_recompute_exactly(
    monkeypatch, capsys
):
    """Rank 0 of two, its layers taken for CUDA ones: its own settings leave out the EmbeddingBag;
    the ranks' GPUs differ (132 and 114 multiprocessors), which leaves out the Linear; rank 1 also
    flags the LayerNorm, so rank 0 leaves it out too (every rank replays the same layers)."""
    from scout_slurm.bootstrap import determinism, replay

    peer = [torch.tensor([114]), torch.tensor([0, 0, 1, 0])]  # rank 1's SM count, then its flags

    def all_gather(out, t, group=None):
        out[0].copy_(t)
        out[1].copy_(peer.pop(0))

    r = replay.Replay(
        every=1,
        rank=0,
        world=2,
        side=None,
        run_dir=None,
        node="n0",
        originals={"broadcast": None, "all_gather": all_gather, "barrier": None},
        current_step=lambda: 1,
    )
    r.layers = [("bag", nn.EmbeddingBag(10, 4)), ("fc", nn.Linear(4, 4)), ("norm", nn.LayerNorm(4))]
    monkeypatch.setattr(replay, "layer_device", lambda m, w: torch.device("cuda"))
    monkeypatch.setattr(determinism, "multiprocessor_count", lambda d: 132)
    r._apply_determinism_policy()
    assert peer == [] and sorted(r.excluded) == [0, 1, 2]
    assert r.not_checked() == (
        "bag: EmbeddingBag's CUDA backward accumulates with atomic adds (no deterministic kernel "
        "in every mode)",
        "fc: the ranks' GPUs differ in multiprocessor count ([114, 132]): cuBLAS and cuDNN choose "
        "kernels by it",
        "norm: not exact on rank(s) [1] (their settings or GPUs)",
    )
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 3 and all("not replayed" in line for line in said), said
    assert said[2] == (
        "scout: in-situ replay: layer(s) ['norm'] not replayed: their recomputation cannot repeat "
        "training's bits (not exact on rank(s) [1] (their settings or GPUs))"
    )
