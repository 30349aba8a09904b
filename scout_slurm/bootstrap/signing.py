"""Signatures of tensors and state inside the training process, in one place: the state votes
(consensus), the checkpoint records (ckptstate), the at-rest witness (atrest), update and in-situ
replay all sign with these functions, so that a signature means the same thing everywhere.

The job's Python may be a site's own torch with scout-slurm installed without the `job` extra,
so neither xxhash nor numpy may be importable. Hence:

- the hasher is xxhash's xxh3_64 when it imports, else blake2b with an 8-byte digest behind the
  same interface (`update`, `intdigest`): exact, only slower (see benchmarks/bench_signing.py).
  The two give different values for the same state, so signatures compare only between ranks
  and runs that have the same hasher (`HASH_NAME` says which one this process uses).
- a tensor's bytes are read in place through ctypes over its data pointer, not through
  `.numpy()`: the same bytes (tests/unit/test_signing.py compares them with numpy's view where
  numpy is present), so a signature does not depend on whether numpy is installed. It is also
  cheaper per tensor than numpy's view (about 1.6 against 2.0 us), which matters for the many
  small tensors of an optimizer's state.

- a tensor on an accelerator (any device but the CPU) is signed where it lives, by devsig.py's
  integer lane sums (exact, independent of reduction order): only 4 int64 words a tensor come
  to the host, all of a state's in one transfer, and they are hashed with the dtype and shape.
  A CPU tensor keeps the byte hash: xxh3 reads about 9 GB/s on one core here, the lane sums
  about 0.8 to 1.5 GB/s (benchmarks/bench_signature.py). The two give different values for the
  same values, so a signature compares only with one of a tensor on the same kind of device
  (replicas hold their state on the same kind; `DEVICE_ON_CPU` makes CPU tensors take the
  device path, for tests and the device check).

Imports only the standard library and torch (when a tensor is signed)."""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Iterable
from typing import Any

_MASK = 0x7FFFFFFFFFFFFFFF

DEVICE_ON_CPU = False  # sign CPU tensors by the device path too (tests, scripts/device_check.sh)


class _Blake2b64:
    """blake2b with an 8-byte digest, shaped like xxhash.xxh3_64 (what the signing code calls):
    `intdigest()` reads the digest as a big-endian integer, as xxhash's does of its own."""

    __slots__ = ("_h",)
    name = "blake2b-64"

    def __init__(self, data: Any = b"") -> None:
        self._h = hashlib.blake2b(data, digest_size=8)

    def update(self, data: Any) -> None:
        self._h.update(data)

    def digest(self) -> bytes:
        return self._h.digest()

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def intdigest(self) -> int:
        return int.from_bytes(self._h.digest(), "big")


try:
    import xxhash as _xxhash
except ImportError:  # a site's own torch without scout's `job` extra: the exact stdlib hash
    _xxhash = None

new_hasher = _xxhash.xxh3_64 if _xxhash is not None else _Blake2b64
HASH_NAME = "xxh3_64" if _xxhash is not None else _Blake2b64.name


def use_fallback() -> None:
    """Sign with blake2b-64 from now on in this process: when not every rank of the job has xxhash
    (ranks that sign differently would outvote each other), every rank uses the one all have."""
    global new_hasher, HASH_NAME
    new_hasher, HASH_NAME = _Blake2b64, _Blake2b64.name


def byte_view(t: Any) -> memoryview:
    """The bytes of a tensor's values in row-major order, as a read-only memoryview: zero-copy for
    a contiguous CPU tensor (a copy is made first of a non-contiguous one or one on another
    device). The view keeps the tensor it reads alive. Needs no numpy."""
    import torch

    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    # reshape: a 0-d tensor (AdamW's step) has no byte view; view(uint8): torch's own checks (a
    # conjugate or negative view refuses, as .numpy() did) and the byte count
    raw = x.contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    if n == 0:
        return memoryview(b"")
    arr = (ctypes.c_ubyte * n).from_address(raw.data_ptr())
    arr._scout_keep = raw  # the memory read belongs to this tensor: it lives as long as the view
    return memoryview(arr).toreadonly()


def _local(t: Any) -> Any:
    x = t.detach()
    if hasattr(x, "to_local") and hasattr(x, "placements"):  # a DTensor (FSDP2/HSDP): the shard
        x = x.to_local()
    return x


def on_device(x: Any) -> bool:
    """Whether a tensor is signed by the device path (lane sums where it lives)."""
    return x.device.type != "cpu" or DEVICE_ON_CPU


def _header(x: Any, device: bool) -> bytes:
    # the device path's header differs, so equal values never sign alike by two definitions
    return f"{x.dtype}|{tuple(x.shape)}|{'lanes|' if device else ''}".encode()


def _feed_bytes(h: Any, x: Any) -> None:
    x = x.contiguous()
    h.update(_header(x, False))
    if x.numel():
        h.update(byte_view(x))


def tensor_signature(t: Any, h: Any = None) -> int:
    """An exact fingerprint of a tensor: every bit of its values, its dtype and its shape.
    A CPU tensor's bytes are hashed over a zero-copy view; a device tensor's lane sums are
    computed on its device and only they are hashed. With `h`, feeds that hasher and returns 0."""
    own = h is None
    h = h or new_hasher()
    x = _local(t)
    if on_device(x):
        from scout_slurm.bootstrap.devsig import lane_sums

        words = lane_sums(x).tolist()
        h.update(_header(x, True))
        h.update(struct.pack(f"<{len(words)}q", *words))
    else:
        _feed_bytes(h, x)
    return h.intdigest() if own else 0


def state_signature(tensors: Iterable[tuple[str, Any]]) -> int:
    """One signature of named tensors, in their order. Device tensors' lane sums stay on their
    devices until all are computed, then come to the host in one transfer a device."""
    import torch

    items = [(name, _local(t)) for name, t in tensors]
    sums: dict[Any, list[Any]] = {}
    slots: list[tuple[Any, int] | None] = []
    for _, x in items:
        if on_device(x):
            from scout_slurm.bootstrap.devsig import lane_sums

            bucket = sums.setdefault(x.device, [])
            slots.append((x.device, len(bucket)))
            bucket.append(lane_sums(x))
        else:
            slots.append(None)
    host = {dev: torch.stack(parts).cpu().tolist() for dev, parts in sums.items()}
    h = new_hasher()
    for (name, x), slot in zip(items, slots, strict=True):
        h.update(name.encode() + b"\0")
        if slot is None:
            _feed_bytes(h, x)
        else:
            words = host[slot[0]][slot[1]]
            h.update(_header(x, True))
            h.update(struct.pack(f"<{len(words)}q", *words))
    return h.intdigest()


def optimizer_tensors(opt: Any) -> list[tuple[str, Any]]:
    """An optimizer's tensor state, named by group, parameter and key, in a fixed order."""
    import torch

    out = []
    for gi, group in enumerate(opt.param_groups):
        for pi, p in enumerate(group["params"]):
            for key, value in sorted(opt.state.get(p, {}).items()):
                if isinstance(value, torch.Tensor):
                    out.append((f"g{gi}.p{pi}.{key}", value))
    return out


def sig_hex(value: int) -> str:
    """A signature as the checkpoint records write it: 16 hex digits of its low 63 bits."""
    return f"{value & _MASK:016x}"


def bytes_sig(parts: Iterable[Any]) -> str:
    """The signature of a sequence of byte strings (bytes-like) and values (by their repr)."""
    h = new_hasher()
    for p in parts:
        h.update(p if isinstance(p, (bytes, bytearray, memoryview)) else repr(p).encode())
    return sig_hex(h.intdigest())
