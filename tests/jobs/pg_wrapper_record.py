"""The recording wrapper's bookkeeping on one gloo rank, printed as JSON: all-reduces launched
inside a
backward are open until that backward ends (autograd's final callback leaves them); one launched
outside a backward is left when it completes; the buckets of a backward that raised (its final
callbacks dropped) are left with the next backward's, or at the next `settle` (DDP's forward calls
it)."""

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scout_slurm.bootstrap import pgwrap
from scout_slurm.task import progress


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    d = Path(tempfile.mkdtemp())
    progress.create(d / "rank-0.bin")
    w = progress.ProgressWriter(d / "rank-0.bin", rank=0, world_size=1)
    group = pgwrap.wrap(dist.distributed_c10d._get_default_group(), lambda: w, lambda: False)
    seen: dict[str, object] = {}

    def counts():
        v = progress.read(d / "rank-0.bin")
        return [v.coll_entered, v.coll_completed]

    class Reduce(torch.autograd.Function):
        """Launches two all-reduces from inside the backward, as DDP's reducer does; optionally
        fails the backward after them."""

        @staticmethod
        def forward(ctx, x, fail):
            ctx.fail = fail
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            group.allreduce([torch.ones(4)]).wait()
            group.allreduce([torch.ones(4)]).wait()
            seen.setdefault("inside" if not ctx.fail else "inside_failing", counts())
            if ctx.fail:
                raise RuntimeError("planted failure")
            return g, None

    x = torch.ones(3, requires_grad=True)
    Reduce.apply(x, False).sum().backward()
    seen["after"] = counts()
    try:
        Reduce.apply(x, True).sum().backward()
    except RuntimeError:
        pass
    seen["after_failed"] = counts()
    Reduce.apply(x, False).sum().backward()  # the next backward leaves the failed one's buckets too
    seen["next_backward"] = counts()
    try:
        Reduce.apply(x, True).sum().backward()
    except RuntimeError:
        pass
    group.settle()  # or the next forward (DDP's)
    seen["settled"] = counts()
    group.allreduce([torch.ones(4)]).wait()
    for _ in range(200):  # left on gloo's thread as it completed
        if counts()[1] == counts()[0]:
            break
        time.sleep(0.01)
    seen["outside"] = counts()
    print(json.dumps(seen), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
