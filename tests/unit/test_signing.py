"""scout's signing without xxhash or numpy: the stdlib fallback hasher behaves as xxhash's xxh3_64
where the signing code calls it, and the numpy-free byte view reads exactly a tensor's bytes, so a
signature does not depend on whether numpy is installed. The references here are computed another
way (hashlib directly, torch's tolist, numpy's view where numpy is present)."""

from __future__ import annotations

import gc
import hashlib

import pytest
import torch

from scout_slurm.bootstrap import signing


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "0-d (AdamW's step)": torch.tensor(12.0),
        "float32 transposed": torch.randn(4, 5, generator=g).t(),
        "int64 strided slice": torch.arange(60).reshape(3, 4, 5)[:, ::2, 1:],
        "bfloat16": torch.randn(7, generator=g).to(torch.bfloat16),
        "bool": torch.randn(9, generator=g) > 0,
        "float16 expanded": torch.randn(3, 1, generator=g).half().expand(3, 4),
        "complex64": torch.randn(3, dtype=torch.complex64, generator=g),
        "empty": torch.zeros(0, 3),
        "storage offset": torch.arange(10, dtype=torch.int32)[3:8],
    }


def _reference_bytes(t: torch.Tensor) -> bytes:
    """Row-major bytes of the values, through a path that shares nothing with byte_view's ctypes."""
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist())


def test_fallback_hasher_is_blake2b_of_8_bytes_with_xxhash_interface():
    data = [b"", b"a", bytes(range(256)) * 3, memoryview(b"scout")]
    h = signing._Blake2b64()
    ref = hashlib.blake2b(digest_size=8)
    for part in data:
        h.update(part)
        ref.update(part)
        assert h.digest() == ref.digest() and h.hexdigest() == ref.hexdigest()
        assert h.intdigest() == int.from_bytes(ref.digest(), "big")
        assert (
            f"{h.intdigest():016x}" == h.hexdigest()
        )  # big-endian, as xxhash reads its own digest
    assert signing._Blake2b64(b"abc").intdigest() == int.from_bytes(
        hashlib.blake2b(b"abc", digest_size=8).digest(), "big"
    )
    assert signing._Blake2b64(b"abc").intdigest() != signing._Blake2b64(b"abd").intdigest()


def test_xxhash_reads_its_digest_big_endian_as_the_fallback_does():
    xxhash = pytest.importorskip(
        "xxhash", reason="xxhash is not installed: nothing to compare the fallback with"
    )
    h = xxhash.xxh3_64(b"scout")
    assert h.intdigest() == int.from_bytes(h.digest(), "big")
    assert (
        signing.new_hasher is xxhash.xxh3_64 and signing.HASH_NAME == "xxh3_64"
    )  # xxhash, where it imports


@pytest.mark.parametrize("name", list(_tensors()))
def test_byte_view_gives_the_tensor_bytes(name):
    t = _tensors()[name]
    view = signing.byte_view(t)
    assert view.readonly and view.nbytes == t.numel() * t.element_size()
    assert bytes(view) == _reference_bytes(t)


@pytest.mark.parametrize("name", list(_tensors()))
def test_byte_view_and_signatures_equal_numpys(name, monkeypatch):
    pytest.importorskip(
        "numpy", reason="numpy is not installed: the signatures it gave cannot be compared"
    )
    t = _tensors()[name]
    x = t.contiguous().reshape(-1).view(torch.uint8)
    assert bytes(signing.byte_view(t)) == x.numpy().tobytes()
    for hasher in {signing.new_hasher, signing._Blake2b64}:  # today's hasher and the fallback
        monkeypatch.setattr(signing, "new_hasher", hasher)
        ref = hasher()  # tensor_signature as it was, over numpy's view
        ref.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            ref.update(memoryview(x.numpy()))
        assert signing.tensor_signature(t) == ref.intdigest()


def test_byte_view_is_zero_copy_and_keeps_its_tensor_alive():
    t = torch.zeros(1000, dtype=torch.float32)
    view = signing.byte_view(t)
    t[3] = 1.0  # a write to the tensor shows in the view: it reads the tensor's memory, not a copy
    assert bytes(view[12:16]) == _reference_bytes(torch.tensor(1.0))
    view = signing.byte_view(
        torch.arange(4096, dtype=torch.int64)
    )  # the tensor is referenced by the view only
    gc.collect()
    junk = [
        torch.full((4096,), -1, dtype=torch.int64) for _ in range(16)
    ]  # would reuse freed memory
    assert bytes(view) == _reference_bytes(torch.arange(4096, dtype=torch.int64))
    del junk


def test_byte_view_refuses_a_conjugate_view_as_numpy_did():
    with pytest.raises(RuntimeError, match="conjugate"):
        signing.byte_view(torch.randn(3, dtype=torch.complex64).conj())


def test_fallback_signatures_are_exact_fingerprints(monkeypatch):
    monkeypatch.setattr(signing, "new_hasher", signing._Blake2b64)
    tensors = _tensors()
    for name, t in tensors.items():
        ref = hashlib.blake2b(
            f"{t.dtype}|{tuple(t.shape)}|".encode() + _reference_bytes(t), digest_size=8
        )
        assert signing.tensor_signature(t) == int.from_bytes(ref.digest(), "big"), name
    step = tensors["0-d (AdamW's step)"]
    assert signing.tensor_signature(step) != signing.tensor_signature(
        step.reshape(1)
    )  # the shape counts
    flipped = tensors["bfloat16"].clone()
    flipped.view(torch.int16)[2] ^= 1
    assert signing.tensor_signature(flipped) != signing.tensor_signature(
        tensors["bfloat16"]
    )  # one bit counts
    named = list(tensors.items())
    ref = hashlib.blake2b(digest_size=8)
    for name, t in named:
        ref.update(
            name.encode() + b"\0" + f"{t.dtype}|{tuple(t.shape)}|".encode() + _reference_bytes(t)
        )
    assert signing.state_signature(named) == int.from_bytes(ref.digest(), "big")
    parts = [b"raw", bytearray(b"more"), memoryview(b"view"), ("a", 1), 2.5]
    ref = hashlib.blake2b(
        b"rawmoreview" + repr(("a", 1)).encode() + repr(2.5).encode(), digest_size=8
    )
    assert (
        signing.bytes_sig(parts)
        == f"{int.from_bytes(ref.digest(), 'big') & 0x7FFFFFFFFFFFFFFF:016x}"
    )


def test_optimizer_tensors_name_adamw_state_including_its_0d_step():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    named = signing.optimizer_tensors(opt)
    assert [n for n, _ in named] == [
        f"g0.p{i}.{k}" for i in (0, 1) for k in ("exp_avg", "exp_avg_sq", "step")
    ]
    assert all(t.dim() == 0 for n, t in named if n.endswith(".step"))
    assert isinstance(signing.state_signature(named), int)
