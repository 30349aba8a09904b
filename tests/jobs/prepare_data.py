"""A step outside torch.distributed (data preparation): it works `--seconds` seconds without any
process group, then writes its shard and ends with 0."""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=25.0)
    args = ap.parse_args()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    time.sleep(args.seconds)
    print(f"task {rank}: prepared its shard in {args.seconds:g} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
