"""What signing costs without the `job` extra: scout's fallback hasher (blake2b, 8-byte digest)
against xxhash's xxh3_64, and the numpy-free byte view against numpy's, on one tensor (default
64 MB of float32) and on many small ones (an optimizer's state of small layers: per-tensor cost).

    python benchmarks/bench_signing.py [--mb 64] [--repeats 5] [--small 20000]

Prints GB/s for each hasher over the same bytes (best of --repeats, one thread, as the signing
runs) and microseconds per small tensor for each byte view. Run with the interpreter to measure:
.venv (xxhash, numpy) has every path; .venv-bare has only the fallback and the ctypes view.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from scout_slurm.bootstrap import signing


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--small",
        type=int,
        default=20000,
        help="small tensors (10 floats each) for the per-tensor cost",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    t = torch.randn(int(args.mb * 1e6 / 4), dtype=torch.float32)
    nbytes = t.numel() * 4
    hashers = {"blake2b-64 (fallback)": signing._Blake2b64}
    try:
        import xxhash

        hashers = {"xxh3_64 (xxhash)": xxhash.xxh3_64, **hashers}
    except ImportError:
        print("xxhash is not importable here: the fallback only")
    try:
        import numpy  # noqa: F401

        has_numpy = True
    except ImportError:
        has_numpy = False
    load0 = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, {nbytes / 1e6:.0f} MB float32, one thread, best of "
        f"{args.repeats}; "
        f"{os.cpu_count()} CPUs, load average {load0:.1f}"
    )
    rates = {}
    for name, hasher in hashers.items():

        def sign(hasher=hasher):
            h = hasher()
            h.update(signing.byte_view(t))
            return h.intdigest()

        s = best_of(sign, args.repeats)
        rates[name] = nbytes / s / 1e9
        print(f"  {name:<24} {rates[name]:6.2f} GB/s  {s * 1e3:8.1f} ms per signature")
        print(f"SUMMARY\tsignature of {nbytes / 1e6:.0f} MB, {name}\t{rates[name]:.2f} GB/s\t-")
    if len(rates) == 2:
        a, b = rates.values()
        print(f"  the fallback is {a / b:.1f}x slower than xxh3_64 over the same bytes")

    small = [torch.randn(10) for _ in range(args.small)]
    views = {"ctypes (signing.byte_view)": signing.byte_view}
    if has_numpy:
        views["numpy (before signing.py)"] = lambda x: memoryview(
            x.contiguous().reshape(-1).view(torch.uint8).numpy()
        )
        for x in small[:100]:  # the same bytes, else the timing means nothing
            assert bytes(views["numpy (before signing.py)"](x)) == bytes(signing.byte_view(x))
    for name, view in views.items():
        s = best_of(lambda view=view: [view(x) for x in small], args.repeats)
        print(f"  byte view {name:<28} {s / len(small) * 1e6:6.2f} us per tensor (no hashing)")
    print(f"load average at end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
