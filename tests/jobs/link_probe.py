"""The timing votes' link probe alone, in a real gloo job: each rank takes its node name from
--nodes (comma-separated, one per rank), gathers every rank's as the timing vote does, runs the
probe --rounds times, and prints the measured round trips as JSON (small, medium: rank x peer,
seconds; -1 where this rank did not measure)."""

import argparse
import json

import torch
import torch.distributed as dist

from scout_slurm.bootstrap.timing import Timing
from scout_slurm.localise.straggler import TimingRules


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    names = args.nodes.split(",")
    t = Timing(
        rules=TimingRules(probe_bytes=4096),
        rank=rank,
        world=world,
        side=None,
        writer=None,
        run_dir=None,
        node=names[rank],
    )
    nodes = t._node_names()
    for _ in range(args.rounds):
        small, medium = t._probe(nodes)
    print(json.dumps({"rank": rank, "nodes": nodes, "small": small, "medium": medium}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
