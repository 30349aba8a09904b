"""Signatures and the strict-majority vote used by the state votes."""

import torch

from scout_slurm.bootstrap.consensus import (
    optimizer_tensors,
    state_signature,
    tensor_signature,
    vote,
)


def test_one_flipped_bit_changes_the_signature():
    t = torch.randn(1000)
    base = tensor_signature(t)
    for bit in (0, 12, 22, 30, 31):
        u = t.clone()
        ints = u.view(torch.int32)
        ints[17] ^= torch.tensor(-(1 << 31) if bit == 31 else (1 << bit), dtype=torch.int32)
        assert tensor_signature(u) != base, bit
    assert tensor_signature(t.clone()) == base


def test_dtype_shape_and_order_are_mixed_in():
    t = torch.arange(12, dtype=torch.float32)
    assert tensor_signature(t) != tensor_signature(t.view(3, 4))
    assert tensor_signature(t) != tensor_signature(t.view(torch.int32))
    assert tensor_signature(torch.tensor([1.0, 2.0])) != tensor_signature(torch.tensor([2.0, 1.0]))
    x = torch.tensor([5.0])
    assert tensor_signature(torch.cat([x, x])) != tensor_signature(torch.zeros(2))
    assert state_signature([("a", t)]) != state_signature([("b", t)])


def test_bfloat16_and_non_contiguous():
    t = torch.randn(4, 6).to(torch.bfloat16)
    assert tensor_signature(t.t()) == tensor_signature(t.t().contiguous())


def test_vote():
    assert vote([7, 7, 7, 9]) == (7, [3])
    assert vote([1, 2, 2, 2, 2]) == (2, [0])
    assert vote([7, 7, 7, 7]) == (7, [])
    assert vote([1, 2]) == (None, [])  # two replicas that disagree: no majority
    assert vote([1, 1, 2, 2]) == (None, [])
    assert vote([5]) == (5, [])


def test_optimizer_state_tensors():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    assert optimizer_tensors(opt) == []
    p.grad = torch.ones(3)
    opt.step()
    names = [n for n, _ in optimizer_tensors(opt)]
    assert names == ["g0.p0.momentum_buffer"]
