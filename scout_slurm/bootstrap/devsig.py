"""The device signature: an exact fingerprint of a tensor's bytes computed by torch operations on
the tensor's own device, so a GPU's state is signed without copying it to host memory. Only
`LANES` int64 words come back to the host; signing.py mixes them with the dtype and shape.

Definition (the same on every device, bit for bit): the tensor's bytes in row-major order are
read as words w_i (int32 when the byte count is a multiple of 4, else int16 when even, else
uint8; sign-extended to int64), and lane l is

    S_l = sum_i A_l[i mod BLOCK] * B_l[i div BLOCK] * w_i   (mod 2**64)

with A_l, B_l odd weights from splitmix64 of the index and a lane seed. Integer products and
sums mod 2**64 are exact and associative, so the value does not depend on how the reduction is
split or ordered (GPU reduction trees, chunk sizes). A single flipped bit changes w_i by +-2**b,
hence S_l by A*B*2**b, which is never 0 mod 2**64 since A*B is odd and b < 32: every single-bit
flip is detected in every lane. Several bits flipped cancel in a lane only if their weighted
sum is 0 mod 2**64, which the independent lanes make vanishingly unlikely. Imports only torch."""

from __future__ import annotations

from typing import Any

LANES = 4
BLOCK = 1 << 16  # words a block: A_l is cached per device at this length (LANES x 512 KiB)
# blocks a step: bounds the int64 temporaries to group*BLOCK*LANES words (64 MiB on an accelerator;
# 16 MiB on a CPU, where a smaller step stays in cache: 1.5 against 0.8 GB/s measured here)
GROUP = 32
GROUP_CPU = 8

_M64 = (1 << 64) - 1
_SEEDS = (0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89)
_BLOCK_SALT = 0x452821E638D01377
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB

_weights: dict[tuple[str, int], Any] = {}  # (device, lanes) -> A, shape (lanes, BLOCK), int64


def _s64(c: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    c &= _M64
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z: Any, s: int) -> Any:
    """Logical right shift of int64 words (torch's >> is arithmetic on signed integers)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: Any) -> Any:
    """splitmix64's finaliser over an int64 tensor, elementwise, wrapping mod 2**64."""
    z = x + _s64(_GAMMA)
    z = (z ^ _shr(z, 30)) * _s64(_MIX1)
    z = (z ^ _shr(z, 27)) * _s64(_MIX2)
    return z ^ _shr(z, 31)


def _seeds(lanes: int, salt: int = 0) -> list[int]:
    return [_s64(s ^ salt) for s in _SEEDS[:lanes]]


def _odd_weights(index: Any, lanes: int, salt: int) -> Any:
    """Odd weights for each lane at each index: shape (lanes, len(index))."""
    import torch

    seeds = torch.tensor(_seeds(lanes, salt), dtype=torch.int64, device=index.device)
    return splitmix64(index.unsqueeze(0) + seeds.unsqueeze(1)) | 1


def block_weights(device: Any, lanes: int = LANES) -> Any:
    """A_l over one block, generated on `device` and kept for the next tensor there."""
    import torch

    key = (str(device), lanes)
    a = _weights.get(key)
    if a is None:
        idx = torch.arange(BLOCK, dtype=torch.int64, device=device)
        a = _weights[key] = _odd_weights(idx, lanes, 0)
    return a


def words(t: Any) -> Any:
    """A tensor's bytes, row-major, as a flat tensor of int32, int16 or uint8 words on its device
    (the word by the byte count alone, so a slice signs as a fresh tensor of the same values).
    Zero-copy for a contiguous tensor whose storage offset is aligned; a copy otherwise."""
    import torch

    x = t.detach()
    raw = x.contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    word = torch.int32 if n % 4 == 0 else torch.int16 if n % 2 == 0 else torch.uint8
    try:
        return raw.view(word)
    except RuntimeError:  # a view whose storage offset is not a multiple of the word: copy it
        return raw.clone().view(word)


def lane_sums(t: Any, *, lanes: int = LANES, group: int = 0) -> Any:
    """The `lanes` int64 sums S_l of a tensor, as a tensor on the tensor's device (no host sync).
    `group` (blocks a step) only bounds memory: the sums are the same for every value."""
    import torch

    w = words(t)
    dev = w.device
    n = w.numel()
    acc = torch.zeros(lanes, dtype=torch.int64, device=dev)
    if n == 0:
        return acc
    a = block_weights(dev, lanes)
    group = group or (GROUP_CPU if dev.type == "cpu" else GROUP)
    nblocks = -(-n // BLOCK)
    b_all = _odd_weights(torch.arange(nblocks, dtype=torch.int64, device=dev), lanes, _BLOCK_SALT)
    full = n // BLOCK
    for k0 in range(0, full, group):
        k1 = min(full, k0 + group)
        x = w[k0 * BLOCK : k1 * BLOCK].to(torch.int64).view(k1 - k0, 1, BLOCK)
        per_block = (x * a.unsqueeze(0)).sum(dim=2)  # (blocks, lanes)
        acc += (per_block * b_all[:, k0:k1].t()).sum(dim=0)
    r = n - full * BLOCK
    if r:
        tail = w[full * BLOCK :].to(torch.int64)
        acc += (tail.unsqueeze(0) * a[:, :r]).sum(dim=1) * b_all[:, full]
    return acc


def reference_lane_sums(data: bytes, lanes: int = LANES) -> list[int]:
    """The same definition in plain Python over bytes (slow; for tests of the torch code)."""
    n = len(data)
    width, signed = (4, True) if n % 4 == 0 else (2, True) if n % 2 == 0 else (1, False)

    def mix(x: int) -> int:
        z = (x + _GAMMA) & _M64
        z = ((z ^ (z >> 30)) * _MIX1) & _M64
        z = ((z ^ (z >> 27)) * _MIX2) & _M64
        return z ^ (z >> 31)

    out = []
    for lane in range(lanes):
        seed, salt_seed = _SEEDS[lane], _SEEDS[lane] ^ _BLOCK_SALT
        total = 0
        for i in range(n // width):
            wi = int.from_bytes(data[i * width : (i + 1) * width], "little", signed=signed)
            a = mix(i % BLOCK + seed) | 1
            b = mix(i // BLOCK + salt_seed) | 1
            total = (total + a * b * wi) & _M64
        out.append(_s64(total))
    return out
