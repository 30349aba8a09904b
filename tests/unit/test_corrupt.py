"""Numerical fault injection on plain CPU tensors and one layer (no process group)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scout_slurm.inject.corrupt import compute_fault_hook, corrupt_  # noqa: E402
from scout_slurm.inject.spec import parse_fault  # noqa: E402


@pytest.mark.parametrize("bit", [0, 12, 23, 30, 31])
def test_bitflip_changes_exactly_one_bit_of_one_element(bit):
    t = torch.linspace(-1, 1, 10)
    before = t.clone()
    corrupt_(t, parse_fault(f"bitflip,bit={bit},element=4"))
    diff = torch.bitwise_xor(t.view(torch.int32), before.view(torch.int32))
    assert diff.nonzero().flatten().tolist() == [4]
    assert int(diff[4]) & 0xFFFFFFFF == 1 << bit


def test_noise_touches_every_element_and_leaves_the_jobs_random_stream_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    t = torch.zeros(100)
    corrupt_(t, parse_fault("noise,sigma=0.5"), seed=3)
    assert bool((t != 0).all()) and 0.3 < float(t.std()) < 0.7
    assert torch.equal(torch.rand(3), expected)


def _layer_run(spec: str | None, step: int):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    if spec:
        layer.register_forward_hook(
            compute_fault_hook(parse_fault(spec), 1, 0, lambda: step, lambda what: None)
        )
    x = torch.randn(5, 4, requires_grad=True)
    out = layer(x)
    out.backward(torch.ones_like(out))
    return out.detach(), x.grad, layer.weight.grad


def test_activation_fault_changes_the_output_only_on_its_steps():
    clean = _layer_run(None, 5)
    hit = _layer_run("scale,factor=3,rank=1,step=4,until=6,target=activations,element=2", 5)
    miss = _layer_run("scale,factor=3,rank=1,step=4,until=6,target=activations,element=2", 7)
    assert not torch.equal(hit[0], clean[0]) and int((hit[0] != clean[0]).sum()) == 1
    assert all(torch.equal(a, b) for a, b in zip(miss, clean))
    # the gradient flows through the corrupted output unchanged
    assert torch.equal(hit[1], clean[1]) and torch.equal(hit[2], clean[2])


def test_gradient_fault_leaves_the_output_and_corrupts_the_layers_gradients():
    clean = _layer_run(None, 4)
    hit = _layer_run("sign,rank=1,step=4,target=gradients,element=0", 4)
    assert torch.equal(hit[0], clean[0])
    assert not torch.equal(hit[1], clean[1]) and not torch.equal(hit[2], clean[2])


def test_a_fault_for_another_rank_does_nothing():
    clean = _layer_run(None, 4)
    other = _layer_run("sign,rank=2,step=4,target=gradients", 4)
    assert all(torch.equal(a, b) for a, b in zip(other, clean))
