"""Bytes and tensors broadcast from one rank over scout's side group in two collectives, however
many tensors: a header of three int64 (meta bytes, layout bytes, payload bytes; -1: nothing this
round), then one uint8 payload holding the meta, the layout (JSON: dtype, shape, offset and size
of each tensor) and every tensor's bytes at an offset that is a multiple of 8 (a typed view of the
payload needs it). A gloo collective costs 0.1 to 0.5 ms of CPU on this machine whatever its size
(its threads' work included), so a round that sent a header and a body per tensor cost more in
collectives than in bytes. Imports only the standard library, torch and scout's signing (its byte
view: no numpy)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from scout_slurm.bootstrap.signing import byte_view

DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
)


def _pad(n: int) -> int:
    return -n % 8


def pack(meta: bytes, tensors: Sequence[Any]) -> tuple[list[int], Any]:
    """(header, payload) for `meta` and `tensors` (copied to the CPU where they are elsewhere)."""
    import torch

    parts, layout, at = [], [], 0
    for t in tensors:
        x = t.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        raw = x.contiguous().reshape(-1).view(torch.uint8)  # reshape: a 0-d tensor has no byte view
        dtype = str(x.dtype).replace("torch.", "")
        if dtype not in DTYPES:
            raise ValueError(f"a tensor of dtype {dtype} cannot be sent")
        layout.append([dtype, list(x.shape), at, int(raw.numel())])
        parts += [raw, torch.zeros(_pad(raw.numel()), dtype=torch.uint8)]
        at += raw.numel() + _pad(raw.numel())
    lay = json.dumps(layout).encode()

    def b(data: bytes) -> list[Any]:
        return [
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if data
            else torch.zeros(0, dtype=torch.uint8),
            torch.zeros(_pad(len(data)), dtype=torch.uint8),
        ]

    payload = torch.cat(b(meta) + b(lay) + parts)
    return [len(meta), len(lay), int(payload.numel())], payload


def unpack(header: Sequence[int], payload: Any) -> tuple[bytes, list[Any]]:
    """(meta, tensors) from a payload made by `pack`; the tensors are views of it."""
    import torch

    m, n = int(header[0]), int(header[1])
    base = m + _pad(m)
    # signing's byte view, not .numpy(): the job's Python may have no numpy
    meta = bytes(byte_view(payload[:m]))
    layout = json.loads(bytes(byte_view(payload[base : base + n])))
    start = base + n + _pad(n)
    out = []
    for dtype, shape, at, size in layout:
        if dtype not in DTYPES:
            raise ValueError(f"a tensor of dtype {dtype!r} was not expected")
        out.append(
            payload[start + at : start + at + size].view(getattr(torch, dtype)).reshape(shape)
        )
    return meta, out


class PackError(ValueError):
    """The source could not pack what it meant to send: every rank was told there is nothing."""


def broadcast_packed(
    broadcast: Callable[..., Any],
    group: Any,
    rank: int,
    src: int,
    meta: bytes | None,
    tensors: Sequence[Any] = (),
) -> tuple[bytes, list[Any], int] | None:
    """`meta` and `tensors` from `src` to every rank (every rank calls it; only `src`'s arguments
    count). Returns (meta, tensors, payload bytes), the source's own tensors on the source, or
    None on every rank when the source had nothing (meta None). A source that cannot pack them
    tells the others there is nothing (none is left waiting for a payload), then raises
    PackError."""
    import torch

    head = torch.zeros(3, dtype=torch.int64)
    payload, failed = None, None
    if rank == src:
        head[0] = -1
        if meta is not None:
            try:
                h, payload = pack(meta, tensors)
            except Exception as exc:
                failed = exc
            else:
                head[0], head[1], head[2] = h[0], h[1], h[2]
    broadcast(head, src=src, group=group)
    if failed is not None:
        raise PackError(repr(failed)) from failed
    if int(head[0]) < 0:
        return None
    if rank != src:
        payload = torch.empty(int(head[2]), dtype=torch.uint8)
    broadcast(payload, src=src, group=group)
    if rank == src:
        return meta, list(tensors), int(head[2])
    got, out = unpack(head.tolist(), payload)
    return got, out, int(head[2])
