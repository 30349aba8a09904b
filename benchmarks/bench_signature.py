"""What an exact fingerprint of a tensor costs next to copying it: xxh3_64 over the tensor's own
storage (a zero-copy byte view, dtype and shape mixed into the digest first) against
`torch.empty_like(t).copy_(t)`, for 1M, 10M and 100M float32 elements on the CPU; and the
device signature (bootstrap/devsig.py: integer lane sums on the tensor's device, what a GPU's
tensors are signed by) against `t.clone()` on the same device.

    python benchmarks/bench_signature.py [--sizes 1e6,1e7,1e8] [--repeats 5] [--device cuda]

With `--device cuda` only the device signature and the clone are timed (xxh3 reads host memory).

Prints GB/s of the tensor's bytes for each and their ratio (target: the signature at least half
the copy's rate). The copy runs on torch's intra-op threads (and once more on one thread, the
fair match for the single-threaded hash); each figure is the best of --repeats. Peak memory is
two tensors of the largest size (800 MB at 100M floats).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scout_slurm.bootstrap import devsig


def signature(t: torch.Tensor) -> int:
    """xxh3_64 of dtype, shape and the bytes, read in place (a contiguous tensor is not copied)."""
    import xxhash

    h = xxhash.xxh3_64()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    flat = t.detach().reshape(-1)  # a view when contiguous; a copy only when not
    h.update(memoryview(flat.view(torch.uint8).numpy()))
    return h.intdigest()


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def best_of(fn, repeats: int, device: str = "cpu") -> float:
    times = []
    for _ in range(repeats):
        gc.collect()
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        del out
    return min(times)


def check(t: torch.Tensor) -> None:
    """The view is zero-copy, the digest is stable, and it sees one flipped bit, dtype and shape."""
    flat = t.reshape(-1)
    assert flat.view(torch.uint8).numpy().ctypes.data == t.data_ptr(), (
        "the byte view copied the tensor"
    )
    digest = signature(t)
    assert signature(t) == digest
    assert signature(t.view(torch.int32)) != digest, "dtype is not in the digest"
    if t.numel() % 2 == 0:
        assert signature(t.view(2, -1)) != digest, "shape is not in the digest"
    i = t.numel() // 2
    bits = t.view(torch.int32)
    old = int(bits[i])
    bits[i] = old ^ (1 << 3)
    assert signature(t) != digest, "a flipped bit went unseen"
    bits[i] = old
    assert signature(t) == digest


def check_lanes(t: torch.Tensor) -> None:
    """The lane sums are stable and see one flipped bit in the middle and at the last element."""
    base = devsig.lane_sums(t).tolist()
    assert devsig.lane_sums(t).tolist() == base
    bits = t.view(torch.int32)
    for i in (t.numel() // 2, t.numel() - 1):
        old = bits[i].item()
        bits[i] = old ^ (1 << 3)
        assert devsig.lane_sums(t).tolist() != base, "a flipped bit went unseen"
        bits[i] = old
    assert devsig.lane_sums(t).tolist() == base


def device_rows(sizes: list[int], repeats: int, device: str) -> list[tuple]:
    rows = []
    for n in sizes:
        t = torch.randn(n, dtype=torch.float32, device=device)
        check_lanes(t)
        nbytes = t.numel() * t.element_size()
        lanes_s = best_of(lambda: devsig.lane_sums(t).tolist(), repeats, device)
        clone_s = best_of(lambda: t.clone(), repeats, device)
        rows.append((n, nbytes, lanes_s, clone_s))
        del t
        gc.collect()
    return rows


def print_device_rows(rows: list[tuple], device: str) -> None:
    print(f"device signature ({devsig.LANES} int64 lanes) vs clone() on {device}:")
    print(f"{'elements':>12} {'MB':>7} {'lanes GB/s':>11} {'clone GB/s':>11} {'ratio':>6}")
    for n, nbytes, lanes_s, clone_s in rows:
        lanes, clone = nbytes / lanes_s / 1e9, nbytes / clone_s / 1e9
        print(f"{n:>12,} {nbytes / 1e6:>7.0f} {lanes:>11.2f} {clone:>11.2f} {lanes / clone:>6.2f}")
    n, nbytes, lanes_s, clone_s = rows[-1]
    print(
        f"SUMMARY\tdevice signature vs clone, {n:,} float32 ({device})\t"
        f"{nbytes / lanes_s / 1e9:.2f} vs {nbytes / clone_s / 1e9:.2f} GB/s, "
        f"ratio {clone_s / lanes_s:.2f}\t(CPU keeps xxh3 where it is faster)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1e6,1e7,1e8", help="float32 element counts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the device signature only")
    args = ap.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    if args.device != "cpu":
        print(f"torch {torch.__version__} on {args.device}; best of {args.repeats}")
        print_device_rows(device_rows(sizes, args.repeats, args.device), args.device)
        return 0
    import xxhash

    threads = torch.get_num_threads()
    load0 = os.getloadavg()[0]
    rows = []
    for n in sizes:
        t = torch.randn(n, dtype=torch.float32)
        check(t)
        nbytes = t.numel() * t.element_size()
        sig_s = best_of(lambda: signature(t), args.repeats)
        copy_s = best_of(lambda: torch.empty_like(t).copy_(t), args.repeats)
        torch.set_num_threads(1)
        try:
            copy1_s = best_of(lambda: torch.empty_like(t).copy_(t), args.repeats)
        finally:
            torch.set_num_threads(threads)
        rows.append((n, nbytes, sig_s, copy_s, copy1_s))
        del t
        gc.collect()
    print(
        f"xxhash {xxhash.VERSION} xxh3_64 vs torch {torch.__version__} empty_like+copy_, "
        "float32 on the CPU, "
        f"{os.cpu_count()} CPUs, torch threads {threads}; best of {args.repeats}; load "
        f"average {load0:.1f} at "
        f"start, {os.getloadavg()[0]:.1f} at end"
    )
    print(
        f"{'elements':>12} {'MB':>7} {'signature GB/s':>15} {'copy GB/s':>10} {'ratio':>6} "
        f"{'copy 1-thread GB/s':>19} {'ratio':>6} {'signature ms':>13} {'copy ms':>8}"
    )
    for n, nbytes, sig_s, copy_s, copy1_s in rows:
        sig, copy, copy1 = nbytes / sig_s / 1e9, nbytes / copy_s / 1e9, nbytes / copy1_s / 1e9
        print(
            f"{n:>12,} {nbytes / 1e6:>7.0f} {sig:>15.2f} {copy:>10.2f} {sig / copy:>6.2f} "
            f"{copy1:>19.2f} "
            f"{sig / copy1:>6.2f} {sig_s * 1e3:>13.2f} {copy_s * 1e3:>8.2f}"
        )
    print(
        "GB/s: the tensor's bytes over the best time. ratio: signature rate / copy rate "
        "(target >= 0.5). The copy "
        "includes allocating its destination, as a snapshot of a tensor would. Checked: the "
        "byte view shares the "
        "tensor's memory, and the digest changes with one flipped bit, with the dtype and "
        "with the shape."
    )
    n, nbytes, sig_s, copy_s, _ = rows[-1]
    print(
        f"SUMMARY\tsignature vs copy, {n:,} float32 (CPU)\t{nbytes / sig_s / 1e9:.1f} vs "
        f"{nbytes / copy_s / 1e9:.1f} GB/s, "
        f"ratio {copy_s / sig_s:.2f}\t>= 0.5"
    )
    print_device_rows(device_rows(sizes, args.repeats, "cpu"), "cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
