"""Collectives through scout's recording wrapper of a gloo group, from C++ (DDP's
`_broadcast_coalesced`, as `_rebuild_buckets` and buffer syncs call the group) and from Python,
while
gloo's worker threads free works the job launched from Python and dropped at once. Before pgwrap
passed every collective on from Python, torch's trampoline ran these holding the GIL into gloo's
queue lock, and this job deadlocked within a few hundred iterations. Prints what it checked."""

import argparse
import faulthandler
import sys
import time

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _broadcast_coalesced

from scout_slurm.bootstrap import pgwrap


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=1500)
    ap.add_argument(
        "--hang-s", type=int, default=45, help="dump every thread and exit 1 if not done by then"
    )
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.distributed_c10d._get_default_group()
    group = pgwrap.wrap(pg, lambda: None, lambda: False)
    faulthandler.dump_traceback_later(args.hang_s, exit=True)
    t0 = time.monotonic()
    for i in range(args.iterations):
        for _ in range(4):  # the job's own async collectives, handles and tensors dropped at once
            dist.all_reduce(torch.ones(64), async_op=True)
        got = [torch.full((256,), float(i * world + rank))]
        _broadcast_coalesced(group, got, 1 << 20, 0)  # from C++, the GIL released
        if not torch.equal(got[0], torch.full((256,), float(i * world))):
            print(
                f"rank {rank}: iteration {i}: broadcast through the wrapper gave "
                f"{got[0][:4].tolist()}"
            )
            return 1
        if i % 10 == 0:  # from Python, with the wrapper as the group
            outs = [torch.zeros(2) for _ in range(world)]
            dist.all_gather(outs, torch.tensor([float(rank), float(i)]), group=group)
            dist.barrier(group=group)
            if [o.tolist() for o in outs] != [[float(r), float(i)] for r in range(world)]:
                print(f"rank {rank}: iteration {i}: all_gather through the wrapper gave {outs}")
                return 1
    faulthandler.cancel_dump_traceback_later()
    dist.barrier()
    print(
        f"rank {rank}: {args.iterations} iterations through the wrapper in "
        f"{time.monotonic() - t0:.1f} s"
    )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
