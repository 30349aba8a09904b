"""The device signature (bootstrap/devsig.py), run on CPU tensors: the code a GPU runs. Every
single-bit flip of every position class is detected, multi-bit flips too, equal values sign
equal whatever the layout or the reduction's chunking, and the torch code agrees with a plain
Python statement of the definition."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from scout_slurm.bootstrap import devsig, signing

BLOCK_PLUS = devsig.BLOCK + 3
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]


def _sums(t: torch.Tensor) -> list[int]:
    return devsig.lane_sums(t).tolist()


def _sample(dtype: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    hi = 256 if dtype == torch.uint8 else 1 << 40
    return torch.randint(0, hi, (n,), generator=g, dtype=dtype)


def _flip(t: torch.Tensor, elem: int, bit: int) -> torch.Tensor:
    """A copy of `t` with one bit of one element's bytes flipped (bit 0 = lowest of byte 0)."""
    u = t.clone().reshape(-1).view(torch.uint8)
    size = t.element_size()
    u[elem * size + bit // 8] ^= 1 << (bit % 8)
    return u.view(t.dtype).reshape(t.shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [6, 7, BLOCK_PLUS])
def test_every_single_bit_flip_changes_every_lane(dtype: torch.dtype, n: int) -> None:
    # odd and even lengths take the int16/uint8 and int32 word paths; BLOCK+3 crosses a block
    t = _sample(dtype, n)
    base = _sums(t)
    bits = t.element_size() * 8
    rng = random.Random(n)
    elems = {0, 1, n - 1, n // 2} | {rng.randrange(n) for _ in range(4)}
    if n == BLOCK_PLUS:
        elems |= {devsig.BLOCK - 1, devsig.BLOCK}
    for e in sorted(elems):
        for b in range(bits):  # every bit of these elements: sign, exponent, mantissa, bytes
            flipped = _sums(_flip(t, e, b))
            assert all(f != o for f, o in zip(flipped, base, strict=True)), (dtype, n, e, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_multi_bit_flips_are_detected(dtype: torch.dtype) -> None:
    t = _sample(dtype, 5000, seed=1)
    base = signing.tensor_signature(t)
    rng = random.Random(7)
    bits = t.element_size() * 8
    for trial in range(200):
        u = t
        k = rng.choice([2, 3, 8, 32])
        for _ in range(k):
            u = _flip(u, rng.randrange(t.numel()), rng.randrange(bits))
        if torch.equal(u.view(torch.uint8), t.view(torch.uint8)):
            continue  # the same bit flipped twice: no change to find
        assert devsig.lane_sums(u).tolist() != devsig.lane_sums(t).tolist(), (trial, k)
        # the same bit of two elements flipped in opposite directions: no cancellation
    a = torch.zeros(4096, dtype=torch.int32)
    a[10] = 1 << 20
    b = torch.zeros(4096, dtype=torch.int32)
    b[3000] = 1 << 20
    assert _sums(a) != _sums(b)
    assert base == signing.tensor_signature(t.clone())


def test_torch_code_matches_the_plain_python_definition() -> None:
    cases = [
        torch.randn(13),
        torch.randn(9).to(torch.bfloat16),
        torch.arange(11, dtype=torch.uint8),
        torch.tensor(2.5),
        torch.empty(0),
        torch.randint(-(1 << 60), 1 << 60, (5,), dtype=torch.int64),
    ]
    for t in cases:
        data = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())
        assert _sums(t) == devsig.reference_lane_sums(data), t.dtype
    # across a block boundary, against the definition (slow in Python: a short second block)
    t = torch.randint(-(1 << 31), 1 << 31, (devsig.BLOCK + 5,), dtype=torch.int32)
    assert _sums(t) == devsig.reference_lane_sums(t.numpy().tobytes())


def test_splitmix64_matches_its_published_values() -> None:
    # splitmix64 seeded with 0 gives 0xE220A8397B1DCDAF as its first output (Vigna's reference)
    out = devsig.splitmix64(torch.tensor([0], dtype=torch.int64)).item() & ((1 << 64) - 1)
    assert out == 0xE220A8397B1DCDAF


def test_result_does_not_depend_on_chunking_or_layout() -> None:
    t = torch.randn(3 * devsig.BLOCK + 1234)
    ref = _sums(t)
    for group in (1, 2, 3, 64):
        assert _sums_group(t, group) == ref
    m = torch.randn(300, 700)
    assert _sums(m.t()) == _sums(m.t().contiguous())  # a transposed view signs as its copy
    assert _sums(m[:, 1::2]) == _sums(m[:, 1::2].contiguous())  # strided
    s = torch.randn(1001).to(torch.bfloat16)[1:]  # offset 2 bytes: not int32-aligned
    assert _sums(s) == _sums(s.clone())
    assert signing.tensor_signature(m.t()) == signing.tensor_signature(m.t().contiguous())


def _sums_group(t: torch.Tensor, group: int) -> list[int]:
    return devsig.lane_sums(t, group=group).tolist()


def test_empty_and_zero_dim_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signing, "DEVICE_ON_CPU", True)
    assert _sums(torch.empty(0)) == [0] * devsig.LANES
    e1, e2 = torch.empty(0), torch.empty(0, 3)
    assert signing.tensor_signature(e1) != signing.tensor_signature(e2)  # the shape counts
    step = torch.tensor(5.0)
    assert signing.tensor_signature(step) == signing.tensor_signature(torch.tensor(5.0))
    assert signing.tensor_signature(step) != signing.tensor_signature(torch.tensor(6.0))
    assert signing.tensor_signature(step) != signing.tensor_signature(torch.tensor([5.0]))


def test_positions_and_dtypes_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signing, "DEVICE_ON_CPU", True)
    x = torch.tensor([1.0, 2.0])
    assert signing.tensor_signature(x) != signing.tensor_signature(x.flip(0))
    assert signing.tensor_signature(torch.cat([x, x])) != signing.tensor_signature(torch.zeros(4))
    assert signing.tensor_signature(x) != signing.tensor_signature(x.view(torch.int32))
    t = torch.randn(2 * devsig.BLOCK)  # two blocks swapped: the block weights differ
    swapped = torch.cat([t[devsig.BLOCK :], t[: devsig.BLOCK]])
    assert _sums(t) != _sums(swapped)


def test_state_signature_on_the_device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    named = [("w", torch.randn(40, 30)), ("step", torch.tensor(3.0)), ("b", torch.randn(30))]
    on_host = signing.state_signature(named)
    monkeypatch.setattr(signing, "DEVICE_ON_CPU", True)
    on_dev = signing.state_signature(named)
    assert on_dev != on_host  # two definitions, never mixed: the header says which
    assert signing.state_signature([(n, t.clone()) for n, t in named]) == on_dev
    # the same as hashing each tensor's lane sums in order by hand
    h = signing.new_hasher()
    for name, t in named:
        h.update(name.encode() + b"\0")
        h.update(f"{t.dtype}|{tuple(t.shape)}|lanes|".encode())
        h.update(struct.pack("<4q", *_sums(t)))
    assert h.intdigest() == on_dev
    changed = [(n, _flip(t, 0, 3) if n == "b" else t) for n, t in named]
    assert signing.state_signature(changed) != on_dev


def test_replay_recomputes_where_the_layer_lives() -> None:
    # the captured inputs arrive as CPU tensors; the recomputation moves them to this device
    from scout_slurm.bootstrap.replay import _cuda_rng_state, layer_device

    on_meta = torch.nn.Linear(3, 3, device="meta")  # a second device CPU-only torch allows
    assert layer_device(on_meta, dict(on_meta.named_parameters())) == torch.device("meta")
    assert layer_device(on_meta, {}) == torch.device("meta")  # its parameters, when no weights
    norm = torch.nn.BatchNorm1d(3, affine=False, device="meta")  # buffers only
    assert layer_device(norm, {}) == torch.device("meta")
    assert layer_device(torch.nn.ReLU(), {}) == torch.device("cpu")
    assert _cuda_rng_state(torch.device("cpu")).numel() == 0  # nothing to restore off a GPU
