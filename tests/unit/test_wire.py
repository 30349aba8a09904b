"""The side group's packed broadcast (bootstrap/wire.py): what is packed comes back bit for bit."""

import pytest
import torch

from scout_slurm.bootstrap.wire import PackError, broadcast_packed, pack, unpack


def _tensors():
    g = torch.Generator().manual_seed(3)
    return [
        torch.randn(3, 5, generator=g),
        torch.randn(7, generator=g).to(torch.bfloat16),
        torch.tensor(2.5, dtype=torch.float64),  # 0-d (AdamW's step)
        torch.zeros(0, 4),  # empty
        torch.tensor([True, False, True]),
        torch.arange(11, dtype=torch.int16),  # 22 bytes: the next one is padded
        torch.randn(4, 6, generator=g).t(),  # not contiguous
        torch.get_rng_state(),
    ]


def test_pack_round_trip_is_bit_exact_with_every_offset_aligned():
    ts = _tensors()
    head, payload = pack(b"meta \x00 bytes", ts)
    meta, out = unpack(head, payload)
    assert meta == b"meta \x00 bytes"
    assert head[2] == payload.numel()
    assert len(out) == len(ts)
    for a, b in zip(ts, out):
        assert b.dtype == a.dtype and b.shape == a.shape
        assert torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
        assert (
            b.storage_offset() * b.element_size()
        ) % 8 == 0 or b.numel() == 0  # bytes into the payload


def test_empty_meta_and_no_tensors():
    head, payload = pack(b"", [])
    assert unpack(head, payload) == (b"", [])


def test_a_dtype_that_cannot_be_sent_is_named():
    with pytest.raises(ValueError, match="complex64"):
        pack(b"x", [torch.zeros(2, dtype=torch.complex64)])


def test_a_source_that_cannot_pack_tells_the_others_first():
    sent = []

    def broadcast(t, src, group):
        sent.append(t.clone())

    with pytest.raises(PackError):
        broadcast_packed(broadcast, None, 0, 0, b"x", [torch.zeros(2, dtype=torch.complex64)])
    assert (
        len(sent) == 1 and int(sent[0][0]) == -1
    )  # the header said "nothing": no rank waits for a payload


def test_nothing_to_send_is_none():
    sent = []
    assert broadcast_packed(lambda t, src, group: sent.append(t), None, 0, 0, None) is None
    assert len(sent) == 1
